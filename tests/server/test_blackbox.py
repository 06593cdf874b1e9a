"""Black box: every bad request of test_bad_input against a real `specdecode serve` process, which must answer
each with its 4xx, stay healthy, still serve a good request, and exit 0 on SIGTERM. (Draining a stream in
flight and a queued one on SIGTERM is test_shutdown's, against the same kind of process.)"""
from __future__ import annotations

import signal

import httpx

from .test_bad_input import CASES, GOOD
from .test_shutdown import serve_process


def test_a_server_process_answers_every_bad_request_with_a_4xx_and_stays_healthy(tmp_path):
    with serve_process(tmp_path, "--ctx", "1024") as (proc, base, log):
        wrong = []
        for name, path, raw, status, param in CASES:
            response = httpx.post(f"{base}/v1/{path}", content=raw, headers={"Content-Type": "application/json"}, timeout=60)
            error = response.json().get("error", {}) if response.headers.get("content-type", "").startswith("application/json") else {}
            if response.status_code != status or error.get("param") != param or not error.get("code"):
                wrong.append((name, response.status_code, response.text[:200]))
        assert not wrong, wrong
        assert proc.poll() is None
        assert httpx.get(base + "/health", timeout=10).json()["status"] == "ok"
        good = httpx.post(f"{base}/v1/completions", json=GOOD, timeout=60)
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log.seek(0)
        assert "Traceback" not in log.read()
