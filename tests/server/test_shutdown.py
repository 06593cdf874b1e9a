"""`specdecode serve` as a process: it serves, and SIGTERM ends in-flight work cleanly and exits 0."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from .conftest import MODEL, wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_sigterm_cancels_the_stream_and_exits_zero(models, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdecode.cli", "serve", "--model", MODEL, "--draft", "none", "--ctx", "512",
         "--threads", "1", "--host", "127.0.0.1", "--port", str(port), "--queue-size", "2"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SPECDECODE_API_KEY": ""},
    )
    try:
        def up() -> bool:
            assert proc.poll() is None, open(tmp_path / "serve.log").read()
            try:
                return httpx.get(base + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_until(up, timeout=120, interval=0.25), "server did not come up"
        assert "<title>specdecode playground</title>" in httpx.get(base + "/").text
        body = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 400, "temperature": 0, "stream": True}
        events = []
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            events.append(next(line for line in lines if line.startswith("data: ")))
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            events += [line for line in lines if line.startswith("data: ")]
        assert time.monotonic() - started < 20
        assert events[-1] == "data: [DONE]"
        last = json.loads(events[-2][len("data: "):])
        assert last["choices"][0]["finish_reason"] == "cancelled"
        assert last["usage"]["completion_tokens"] < 400
        assert proc.wait(timeout=30) == 0
        log.seek(0)
        assert "Traceback" not in log.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
