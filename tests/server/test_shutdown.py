"""`specdecode serve` as a process: SIGTERM drains the work in flight and exits 0."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx

from .conftest import MODEL, poll_get, wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve_process(tmp_path, *extra):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdecode.cli", "serve", "--model", MODEL, "--draft", "none", "--ctx", "512",
         "--threads", "1", "--host", "127.0.0.1", "--port", str(port), "--queue-size", "2", *extra],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SPECDECODE_API_KEY": ""},
    )
    try:
        def up() -> bool:
            assert proc.poll() is None, open(tmp_path / "serve.log").read()
            try:
                return poll_get(base + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_until(up, timeout=120, interval=0.25), "server did not come up"
        yield proc, base, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def stream_events(base: str, body: dict, on_first=None) -> list[dict]:
    events = []
    with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                events.append("[DONE]")
                break
            events.append(json.loads(line[len("data: "):]))
            if len(events) == 1 and on_first:
                on_first()
    return events


def test_sigterm_finishes_the_running_and_the_queued_request_then_exits_zero(tmp_path):
    # One generation at a time, so the second request waits in the queue (a batch would run it at once).
    with serve_process(tmp_path, "--max-batch", "1") as (proc, base, log):
        assert "<title>specdecode playground</title>" in httpx.get(base + "/").text
        running = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 40, "temperature": 0}
        queued_result = {}

        def send_queued():
            queued_result["response"] = httpx.post(base + "/v1/completions", timeout=120,
                                                   json={"model": MODEL, "prompt": "a, b, c,", "max_tokens": 12, "temperature": 0})

        refused = {}

        def after_first_event():
            threading.Thread(target=send_queued, daemon=True).start()
            assert wait_until(lambda: poll_get(base + "/health").json()["queue_depth"] >= 1, timeout=10)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            refused["response"] = httpx.post(base + "/v1/completions", json=running, timeout=30)
            refused["health"] = httpx.get(base + "/health", timeout=30)

        events = stream_events(base, running, on_first=after_first_event)
        assert events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert sum(len(e["choices"][0]["text"]) > 0 for e in events[:-1]) > 1
        late = refused["response"]
        assert late.status_code == 503 and late.headers.get("Retry-After")
        assert late.json()["error"]["code"] == "shutting_down"
        health = refused["health"]  # a load balancer must stop sending while the work in flight finishes
        assert health.status_code == 503 and health.json()["status"] == "draining", health.text
        assert wait_until(lambda: "response" in queued_result, timeout=60)
        queued = queued_result["response"]
        assert queued.status_code == 200, queued.text
        assert queued.json()["usage"]["completion_tokens"] == 12
        assert proc.wait(timeout=60) == 0
        log.seek(0)
        assert "Traceback" not in log.read()


def test_past_the_grace_period_the_running_generation_is_cut_and_the_process_exits_zero(tmp_path):
    with serve_process(tmp_path, "--shutdown-grace", "1") as (proc, base, log):
        body = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 400, "temperature": 0}
        started = []

        def term():
            started.append(time.monotonic())
            proc.send_signal(signal.SIGTERM)

        events = stream_events(base, body, on_first=term)
        assert time.monotonic() - started[0] < 20
        assert events[-1] == "[DONE]"
        last = events[-2]
        assert last["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=30) == 0
        log.seek(0)
        assert "Traceback" not in log.read()
