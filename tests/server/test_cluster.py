"""`serve --replicas`: two smollm2 engine replicas on a real local Ray cluster, behind one entry point, started
as a user starts them (`specdecode serve --replicas 2`, a cluster of its own) and stopped by SIGTERM.

One cluster for the module (starting one costs Ray's start and the replicas' model loads and warm-ups); tests run
in file order: the suffix-store check first (before other answers fill its namespace's store), the replica-killing
test near the end, SIGTERM last. Each replica gets one thread: two cores, two replicas.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from .conftest import MODEL, poll_get, wait_until

ray = pytest.importorskip("ray", reason="the 'cluster' extra (ray[serve]) is not installed")
# One local Ray cluster at a time: every test that starts one is in this file, and scripts/test.sh hands pytest-xdist
# whole files (--dist loadfile), so they run one after another in one worker.

QUEUE = 16
BATCH = 1  # generations each replica runs at once: one, so a killed replica has requests queued (the batched
# engine behind Ray is tested by test_serve_modes)
KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG_SYSTEM = ("You are a patient teacher of programming. You answer questions about Python with short, correct"
               " examples, and you explain every step of the code you show in plain words. ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_deploy_pulls_and_converts_the_models_once_before_serve_starts_the_replicas(monkeypatch):
    """Without it every replica of a fresh machine downloads and converts the same files at once."""
    from specdecode.server import cluster as cluster_module
    from specdecode.server.cluster import ClusterSettings

    calls = []
    monkeypatch.setattr(cluster_module, "prepare_model_files", lambda options: calls.append(("prepare", options["model"])))
    monkeypatch.setattr(cluster_module.serve, "start", lambda **kwargs: calls.append("serve.start"))
    monkeypatch.setattr(cluster_module.serve, "run", lambda *args, **kwargs: calls.append("serve.run"))
    monkeypatch.setattr(cluster_module, "build_application", lambda settings: "application")
    cluster_module.deploy(ClusterSettings({"model": MODEL, "draft": "none"}, MODEL), "127.0.0.1", 0)
    assert calls == [("prepare", MODEL), "serve.start", "serve.run"]


class Served:
    """The `serve --replicas` process, its base URL and its log."""

    def __init__(self, proc: subprocess.Popen, base: str, log_path: Path):
        self.proc, self.base, self.log_path = proc, base, log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("cluster") / "serve.log"
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specdecode.cli", "serve", "--model", MODEL, "--draft", "none", "--ctx", "1024",
             "--replicas", "2", "--threads-per-replica", "1", "--queue-size", str(QUEUE), "--max-batch", str(BATCH),
             "--port", str(port), "--api-key", KEY],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    served = Served(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        def ready() -> bool:
            assert proc.poll() is None, served.log()
            try:
                return poll_get(served.base + "/health", timeout=2).json().get("replicas_ready") == 2
            except (httpx.TransportError, ValueError):
                return False

        assert wait_until(ready, timeout=240, interval=0.5), served.log()
        yield served
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def cluster(served):
    return served.base


def get(url: str, **kwargs) -> httpx.Response:
    return httpx.get(url, headers=AUTH, **kwargs)


def post(url: str, source: str = "127.0.0.1", **kwargs) -> httpx.Response:
    with from_address(source) as client:
        return client.post(url, headers={**AUTH, **kwargs.pop("headers", {})}, **kwargs)


def from_address(source: str) -> httpx.Client:
    """A client connecting from `source`, a loopback address: each address is another peer, so another client of the
    fair queue, whose lanes each hold at most three quarters of a replica's places."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=300)


def peer(index: int) -> str:
    return f"127.0.0.{2 + index}"


def test_the_key_is_required_and_a_spoofed_forwarded_for_keeps_the_clients_namespace(cluster):
    body = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}
    assert httpx.post(cluster + "/v1/completions", json=body).status_code == 401
    answer = post(cluster + "/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
    # Serve's proxy must not believe X-Forwarded-For from loopback: a spoofed one keeps the client's namespace
    # (its second ask copies the first answer from the suffix store; another namespace would copy nothing)
    story = {"model": MODEL, "prompt": "Before the answer, a note: routing follows prompts of 128 characters"
             " or more, so this one is long. Write the alphabet backwards, letter by letter:", "max_tokens": 24,
             "temperature": 0, "speculative": {"drafter": "suffix", "k": 8}}
    sources = lambda **extra: post(cluster + "/v1/completions", json=story, timeout=120,  # noqa: E731
                                   headers=extra).json()["specdecode"]["sources"]
    assert "store" not in sources()
    assert "store" in sources(**{"X-Forwarded-For": "203.0.113.9"})
    assert httpx.get(cluster + "/metrics").status_code == 401


@pytest.fixture
def openai_client(cluster):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=cluster + "/v1", api_key=KEY, max_retries=0, timeout=300)


def metric_by_replica(base: str, name: str) -> dict[str, float]:
    text = get(base + "/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf'^{name}\{{replica="([^"]+)"\}} (\S+)$', text, re.M)}


def test_health_counts_the_ready_replicas(cluster):
    health = httpx.get(cluster + "/health", headers=AUTH).json()  # the replicas' queues: for who may read /metrics
    assert health["status"] == "ok" and health["model"] == MODEL
    assert health["replicas"] == 2 and health["replicas_ready"] == 2 and len(health["replica_states"]) == 2
    public = httpx.get(cluster + "/health").json()
    assert public["replicas_ready"] == 2 and "replica_states" not in public and "in_flight" not in public


def test_the_replicas_import_the_kernel_this_machine_built(served):
    """The test session built (or found) the kernel before the cluster started: no replica compiles it again."""
    assert "compiling the CPU kernels" not in served.log(), served.log()[-3000:]


def test_greedy_text_equals_the_one_process_server(openai_client, client):
    prompts = ["def fibonacci(n):", "The capital of France is", "1, 2, 3, 4,"]
    for prompt in prompts:
        one = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
        two = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
        assert two.choices[0].text == one.choices[0].text
    messages = [{"role": "user", "content": "Name three colours."}]
    one = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    two = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert two.choices[0].message.content == one.choices[0].message.content


def test_errors_keep_their_shape(cluster, openai_client):
    response = post(cluster + "/v1/completions", json={"model": MODEL, "prompt": "x", "temperature": 9})
    assert response.status_code == 400 and response.json()["error"]["param"] == "temperature"
    response = post(cluster + "/v1/completions", content=b"{", headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    too_long = post(cluster + "/v1/completions", json={"model": MODEL, "prompt": "word " * 1500, "max_tokens": 1})
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
    assert get(cluster + "/nowhere").json()["error"]["code"] == "not_found"
    rebound = post(cluster + "/v1/completions", json={"model": MODEL, "prompt": "x"}, headers={"host": "evil.example"})
    assert rebound.status_code == 421 and rebound.json()["error"]["code"] == "host_not_allowed"


def stream_one(base: str, body: dict, on_replica=None, source: str = "127.0.0.1") -> dict:
    """A streamed completion from `source`: its text, finish reason, replica, and the error event if it ended with one.
    on_replica(replica) is called at the first chunk, which names the replica generating it."""
    result = {"text": "", "finish": None, "replica": None, "error": None, "done": False}
    with from_address(source) as client, client.stream("POST", base + "/v1/completions", json={**body, "stream": True},
                                                       headers=AUTH) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                result["done"] = True
                break
            event = json.loads(line[len("data: "):])
            if "error" in event:
                result["error"] = event["error"]
                continue
            if result["replica"] is None and on_replica is not None:
                on_replica(event["specdecode"]["replica"])
            result["replica"] = event.get("specdecode", {}).get("replica", result["replica"])
            result["text"] += event["choices"][0]["text"]
            result["finish"] = event["choices"][0]["finish_reason"] or result["finish"]
    return result


def test_32_concurrent_streaming_clients_complete_without_errors(cluster):
    gate = threading.Barrier(32)

    def one(index: int) -> dict:
        gate.wait()
        return stream_one(cluster, {"model": MODEL, "prompt": f"Item {index}: the number {index} squared is",
                                    "max_tokens": 6, "temperature": 0}, source=peer(index))

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    assert all(r["done"] and r["error"] is None and r["finish"] in ("length", "stop") for r in results), results
    assert {r["replica"] for r in results} == set(httpx.get(cluster + "/health", headers=AUTH).json()["replica_states"])


def test_the_second_turn_of_a_chat_lands_on_the_replica_that_served_the_first(cluster, openai_client):
    hits_before = metric_by_replica(cluster, "specdecode_prefix_hits_total")
    conversations = [[{"role": "system", "content": f"Session {n}. " + LONG_SYSTEM},
                      {"role": "user", "content": question}]
                     for n, question in enumerate(["What does len() return?", "How do I reverse a list?"])]
    first_replicas = []
    for messages in conversations:
        answer = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
        first_replicas.append(answer.model_extra["specdecode"]["replica"])
        messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                     {"role": "user", "content": "Show it in one line."}]
    assert len(set(first_replicas)) == 2  # an unrelated conversation goes to the idle replica, keeping the first's cache
    for messages, replica in zip(conversations, first_replicas):
        answer = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
        assert answer.model_extra["specdecode"]["replica"] == replica

    def each_replica_hit_once() -> bool:
        hits = metric_by_replica(cluster, "specdecode_prefix_hits_total")
        return all(hits.get(r, 0) - hits_before.get(r, 0) == 1 for r in first_replicas)

    assert wait_until(each_replica_hit_once, timeout=10, interval=0.25), metric_by_replica(cluster, "specdecode_prefix_hits_total")


def test_the_entry_point_answers_429_once_every_replica_queue_is_full(cluster):
    capacity = 2 * (QUEUE + BATCH)  # BATCH running and QUEUE waiting on each replica
    extra = 12
    gate = threading.Barrier(capacity + extra)

    def one(index: int) -> httpx.Response:  # each from its own address: the replicas' bounds, not a lane's share
        gate.wait()
        return post(cluster + "/v1/completions", source=peer(index), json={
            "model": MODEL, "prompt": f"Request {index}:", "max_tokens": 32, "temperature": 0})

    with ThreadPoolExecutor(capacity + extra) as pool:
        responses = list(pool.map(one, range(capacity + extra)))
    refused = [r for r in responses if r.status_code == 429]
    assert refused and all(r.status_code == 200 for r in responses if r.status_code != 429)
    assert len(refused) <= extra
    assert all(r.json()["error"]["code"] == "queue_full" and int(r.headers["retry-after"]) >= 1 for r in refused)


def replica_pids(cluster: str) -> dict[str, int]:
    """The ready engine replicas' process ids, by replica. Each replica process keeps its own Serve log open, named by
    its replica id: /proc tells which process that is (the test process is no driver of the command's cluster)."""
    ready = {r for r, state in httpx.get(cluster + "/health", headers=AUTH).json()["replica_states"].items() if state["ready"]}
    pids = {}
    for proc in Path("/proc").iterdir():
        try:
            targets = [os.readlink(fd) for fd in (proc / "fd").iterdir()] if proc.name.isdigit() else []
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for target in targets:
            found = re.search(r"replica_specdecode_EngineReplica_(\w+)\.log$", target)
            if found and found.group(1) in ready:
                pids[found.group(1)] = int(proc.name)
    return pids


def test_killing_a_replica_mid_stream_fails_only_its_streams_and_ray_restarts_it(cluster):
    pids = replica_pids(cluster)
    assert len(pids) == 2
    victim, survivor = sorted(pids)
    results: list[dict] = []
    killed = threading.Event()
    kill_lock = threading.Lock()
    queued_at_kill: list[bool] = []

    def victim_queue() -> int:
        return get(cluster + "/health").json()["replica_states"].get(victim, {}).get("queue_depth", 0)

    def kill_at_the_victims_first_chunk(replica: str) -> None:
        # The victim has just started its first generation and must hold others in its queue: both cases happen. On a
        # busy machine the first chunk can come before the last clients' requests reach the entry point, or before
        # Ray has delivered them to a replica, so the kill waits until all sixteen are in flight (the entry point's
        # live count) and the victim's own posted state shows a request waiting (posted each second; with one
        # generation at a time and about half of sixteen sent there, its queue stays for seconds).
        with kill_lock:
            if replica == victim and not killed.is_set():
                wait_until(lambda: get(cluster + "/health").json()["in_flight"] + len(results) >= 16, timeout=30,
                           interval=0.02)
                queued_at_kill.append(wait_until(lambda: victim_queue() >= 1, timeout=30, interval=0.05))
                os.kill(pids[victim], signal.SIGKILL)
                killed.set()

    def one(index: int) -> None:
        body = {"model": MODEL, "prompt": f"Count from {index}: {index}, {index + 1},", "max_tokens": 48,
                "temperature": 0, "user": f"client-{index}"}
        results.append(stream_one(cluster, body, on_replica=kill_at_the_victims_first_chunk, source=peer(index)))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a stream hung"
    assert len(results) == 16  # none refused (a refusal fails its thread before it records a result)
    assert killed.is_set()
    failed = [r for r in results if r["error"] is not None]
    # The generations running in the victim's batch fail (at most --max-batch); those queued there ran elsewhere.
    assert 1 <= len(failed) <= BATCH, failed
    assert all(r["done"] for r in results)  # every stream ended properly, errors included
    assert all(r["error"]["code"] == "replica_failed" for r in failed)
    assert all(r["replica"] in (victim, None) for r in failed)  # only the victim's started streams fail
    assert all(r["replica"] == survivor and r["finish"] in ("length", "stop") for r in results if r["error"] is None)
    resent = re.search(r"^specdecode_resent_total (\S+)$", get(cluster + "/metrics").text, re.M)
    assert queued_at_kill == [True], "the victim never showed a request waiting: the router sent it none to queue"
    assert float(resent.group(1)) >= 1  # the victim's queued requests went to the survivor
    # Ray starts a new replica; once it is ready, both serve again.
    assert wait_until(lambda: poll_get(cluster + "/health").json()["replicas_ready"] == 2, timeout=180, interval=0.5)
    assert victim not in replica_pids(cluster)
    later = [stream_one(cluster, {"model": MODEL, "prompt": f"Later {i}:", "max_tokens": 4, "temperature": 0})
             for i in range(4)]
    assert all(r["error"] is None and r["done"] for r in later)


def test_sigterm_finishes_and_exits_zero(served):
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(timeout=120) == 0
    assert "Traceback" not in served.log()
