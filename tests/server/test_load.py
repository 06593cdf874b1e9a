"""Concurrency: many streaming clients, a client that walks away, and a full queue."""
from __future__ import annotations

import re
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from .conftest import API_KEY, MODEL, poll_get, wait_until

CLIENTS = 16


def metric(base_url: str, name: str, labels: str = "") -> float:
    text = httpx.get(base_url + "/metrics").text
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def server_errors(base_url: str) -> list[str]:
    text = httpx.get(base_url + "/metrics").text
    return re.findall(r'^specdecode_requests_total\{.*status="5\d\d"\}.*$', text, re.M)


def test_concurrent_streaming_clients(live_server):
    client = openai.OpenAI(base_url=live_server.api_url, api_key="unused", max_retries=0, timeout=300)
    start_gate = threading.Barrier(CLIENTS)

    def one_client(index: int) -> dict:
        start_gate.wait()
        started = time.perf_counter()
        first = None
        text = []
        finish = None
        stream = client.completions.create(model=MODEL, prompt=f"Item {index}: the number {index} squared is",
                                           max_tokens=8, temperature=0, stream=True, user=f"user-{index % 4}",
                                           extra_body={"speculative": {"drafter": "draft", "k": 3}})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text and first is None:
                first = time.perf_counter() - started
            if chunk.choices:
                text.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
        return {"latency": time.perf_counter() - started, "ttft": first, "finish": finish, "text": "".join(text)}

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(one_client, range(CLIENTS)))

    assert len(results) == CLIENTS
    assert all(r["finish"] in ("length", "stop") for r in results), results
    assert all(r["text"] for r in results)
    assert not server_errors(live_server.base_url)
    latencies = sorted(r["latency"] for r in results)
    ttfts = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    print(f"\n{CLIENTS} streaming clients x 8 tokens: latency p50 {statistics.median(latencies):.2f}s"
          f" p99 {p99:.2f}s max {latencies[-1]:.2f}s; time to first token p50 {statistics.median(ttfts):.2f}s"
          f" max {ttfts[-1]:.2f}s")
    assert wait_until(lambda: poll_get(live_server.base_url + "/health").json()["queue_depth"] == 0, 10)


def test_disconnect_mid_stream_frees_the_engine(live_server):
    base = live_server.base_url
    cancelled_before = metric(base, "specdecode_cancelled_total", '{reason="client_disconnected"}')
    body = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 500, "temperature": 0,
            "stream": True, "speculative": {"drafter": "none"}}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", live_server.api_url + "/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            assert httpx.get(base + "/health").json()["running"] == 1
        # leaving the block closes the connection mid-stream (500 tokens would take far longer)
    assert wait_until(lambda: poll_get(base + "/health").json()["running"] == 0, 15), "generation kept running"
    assert metric(base, "specdecode_cancelled_total", '{reason="client_disconnected"}') == cancelled_before + 1
    started = time.perf_counter()
    after = httpx.post(live_server.api_url + "/completions", timeout=60,
                       json={"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0})
    assert after.status_code == 200 and after.json()["choices"][0]["finish_reason"] == "length"
    assert time.perf_counter() - started < 15


def test_full_queue_answers_429_then_recovers(small_server):
    """Queue of one: one request runs, one waits, the third is refused with Retry-After."""
    base, headers = small_server.base_url, {"Authorization": f"Bearer {API_KEY}"}
    health = lambda: poll_get(base + "/health", headers=headers).json()  # noqa: E731  (its counts need the key)
    long_body = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7,", "max_tokens": 400, "temperature": 0,
                 "stream": True, "speculative": {"drafter": "none"}}
    queued_result = {}

    def queued_request():
        response = httpx.post(small_server.api_url + "/completions", headers=headers, timeout=120,
                              json={"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 2, "temperature": 0})
        queued_result["status"] = response.status_code

    with httpx.Client(timeout=60, headers=headers) as http:
        with http.stream("POST", small_server.api_url + "/completions", json=long_body) as running:
            assert running.status_code == 200
            assert wait_until(lambda: health()["running"] == 1, 10)
            waiter = threading.Thread(target=queued_request)
            waiter.start()
            assert wait_until(lambda: health()["queue_depth"] == 1, 10)

            refused = httpx.post(small_server.api_url + "/completions", headers=headers, timeout=30,
                                 json={"model": MODEL, "prompt": "x", "max_tokens": 1})
            assert refused.status_code == 429
            assert int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "queue_full"
            assert not any(c.isdigit() for c in refused.json()["error"]["message"])  # how many wait: nobody's business
            assert "queue_depth" not in poll_get(base + "/health").json()  # nor without the key
            with pytest.raises(openai.RateLimitError):
                openai.OpenAI(base_url=small_server.api_url, api_key=API_KEY, max_retries=0).completions.create(
                    model=MODEL, prompt="x", max_tokens=1)
        # the long stream is dropped here: the queued request gets the engine
    waiter.join(timeout=60)
    assert queued_result.get("status") == 200
    assert wait_until(lambda: health()["running"] == 0 and health()["queue_depth"] == 0, 10)
    again = httpx.post(small_server.api_url + "/completions", headers=headers, timeout=60,
                       json={"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 2, "temperature": 0})
    assert again.status_code == 200
    assert 'specdecode_errors_total{kind="queue_full"} 2.0' in httpx.get(base + "/metrics", headers=headers).text
