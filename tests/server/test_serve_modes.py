"""`specdecode serve` as the command runs it: one process without Ray, or --replicas N on a local Ray instance."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest

from .conftest import MODEL, wait_until
from .test_shutdown import free_port

NO_RAY = f"""
import sys
import uvicorn
uvicorn.Server.run = lambda self, *args, **kwargs: None  # build the whole server, serve nothing
from specdecode.cli import main
for replicas in ([], ["--replicas", "1"]):
    assert main(["serve", "--model", "{MODEL}", "--draft", "none", "--ctx", "256", "--threads", "1", *replicas]) == 0
assert "ray" not in sys.modules, sorted(m for m in sys.modules if m.startswith("ray"))
print("no ray")
"""


@pytest.mark.parametrize("flags, message", [
    (["--replicas", "0"], "--replicas must be at least 1"),
    (["--ray-address", "auto"], "apply with --replicas 2 or more"),
    (["--replicas", "1", "--threads-per-replica", "2"], "apply with --replicas 2 or more"),
    (["--replicas", "2", "--threads-per-replica", "0"], "--threads-per-replica must be at least 1"),
    (["--replicas", "2", "--threads", "2"], "--threads-per-replica"),
])
def test_bad_replica_flags_are_refused_before_loading_anything(flags, message, capsys):
    from specdecode.cli import main

    assert main(["serve", *flags]) == 2
    assert message in capsys.readouterr().err


def test_one_replica_is_the_one_process_server_without_ray():
    done = subprocess.run([sys.executable, "-c", NO_RAY], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "no ray" in done.stdout, done.stdout + done.stderr


@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (test_cluster.py)
def test_replicas_flag_serves_on_ray_and_sigterm_exits_zero(tmp_path):
    pytest.importorskip("ray", reason="the 'cluster' extra (ray[serve]) is not installed")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdecode.cli", "serve", "--model", MODEL, "--draft", "none", "--ctx", "512",
         "--replicas", "2", "--threads-per-replica", "1", "--port", str(port), "--api-key", "k"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    try:
        def ready() -> bool:
            assert proc.poll() is None, open(tmp_path / "serve.log").read()
            try:
                return httpx.get(base + "/health", timeout=2).json().get("replicas_ready") == 2
            except (httpx.TransportError, ValueError):
                return False

        assert wait_until(ready, timeout=240, interval=0.5), open(tmp_path / "serve.log").read()
        body = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}
        assert httpx.post(base + "/v1/completions", json=body).status_code == 401
        answer = httpx.post(base + "/v1/completions", json=body, headers={"Authorization": "Bearer k"}, timeout=60)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
        # Serve's proxy must not believe X-Forwarded-For from loopback: a spoofed one keeps the client's namespace
        # (its second ask copies the first answer from the suffix store; another namespace would copy nothing)
        story = {"model": MODEL, "prompt": "Before the answer, a note: routing follows prompts of 128 characters"
                 " or more, so this one is long. Write the alphabet backwards, letter by letter:", "max_tokens": 24,
                 "temperature": 0, "speculative": {"drafter": "suffix", "k": 8}}
        sources = lambda **extra: httpx.post(base + "/v1/completions", json=story, timeout=120, headers={  # noqa: E731
            "Authorization": "Bearer k", **extra}).json()["specdecode"]["sources"]
        assert "store" not in sources()
        assert "store" in sources(**{"X-Forwarded-For": "203.0.113.9"})
        assert httpx.get(base + "/metrics").status_code == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        log.seek(0)
        assert "Traceback" not in log.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
