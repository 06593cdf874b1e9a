"""A real specdecode server on a loopback port, shared by the server tests.

The target and the draft are both smollm2-135m (the same tokenizer, so a valid pair), as two separate
objects: the engine may narrow the draft model's output vocabulary, which must not touch the target.
One torch thread while these tests run: the server, its clients and torch share two cores, and
oversubscribed torch threads are many times slower.
"""
from __future__ import annotations

import copy
import socket
import threading
import time
from dataclasses import dataclass

import pytest

MODEL = "smollm2-135m"
CONTEXT = 1024


@dataclass
class LiveServer:
    base_url: str
    app: object
    engine: object
    server: object
    thread: threading.Thread

    @property
    def api_url(self) -> str:
        return self.base_url + "/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_server(app, engine, forwarded_allow_ips: str | None = None, header_timeout: float | None = None) -> LiveServer:
    """Run `app` with uvicorn in a background thread on a free loopback port, with the settings `specdecode serve`
    gives uvicorn (header_timeout: a shorter deadline on a request's headers); returns once it accepts."""
    import uvicorn

    from specdecode.server.http_parts import HEADER_TIMEOUT_S, connection_options
    from specdecode.server.serve_options import uvicorn_config

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn_config(app, forwarded_allow_ips=forwarded_allow_ips, log_level="warning", timeout_graceful_shutdown=10,
                            **connection_options(header_timeout or HEADER_TIMEOUT_S))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"uvicorn-{port}")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    return LiveServer(f"http://127.0.0.1:{port}", app, engine, server, thread)


@pytest.fixture(scope="package")
def models(request):
    """(target, draft): smollm2-135m twice, as separate objects (the draft's weights are a copy)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = request.getfixturevalue("smollm2")  # the suite's shared copy, when the root conftest has it
    except pytest.FixtureLookupError:
        from specdecode.models.loader import load_model

        try:
            target = load_model(MODEL, device="cpu", max_context=CONTEXT)
        except Exception as exc:  # not cached and no network: nothing to serve
            pytest.skip(f"{MODEL} is not available: {exc}")
    draft = copy.copy(target)
    draft.model = copy.deepcopy(target.model)
    yield target, draft
    torch.set_num_threads(threads)


@pytest.fixture(scope="package")
def live_server(models):
    from specdecode.engine import Engine
    from specdecode.server.app import create_app

    target, draft = models
    engine = Engine(target, draft, max_context=CONTEXT)
    app = create_app(engine, "draft", MODEL, queue_size=16)
    server = start_server(app, engine)
    yield server
    server.stop()


@pytest.fixture(scope="package")
def reference_engine(models):
    """Plain decoding with a separate engine (own caches) over the same target weights."""
    from specdecode.engine import Engine

    return Engine(models[0], None, max_context=CONTEXT)


@pytest.fixture
def client(live_server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=live_server.api_url, api_key="unused", max_retries=0, timeout=120)


API_KEY = "test-key-123"


@pytest.fixture(scope="package")
def small_server(models):
    """A second server over the same target weights: no draft model, an API key, one generation at a time and
    a queue of one."""
    from specdecode.engine import Engine
    from specdecode.server.app import create_app

    engine = Engine(models[0], None, max_context=CONTEXT)
    app = create_app(engine, "lookup", MODEL, api_key=API_KEY, queue_size=1, max_batch=1)
    server = start_server(app, engine)
    yield server
    server.stop()


_POLL = None


def poll_get(url: str, **kwargs):
    """GET for the health polls, through one client per process. httpx.get builds a client, and with it an SSL context
    that loads the CA bundle (~25 ms of CPU), on every call: polls several times a second, waiting for servers and
    replicas to come up, spent ~30 s of the suite's CPU on it."""
    global _POLL
    import httpx

    if _POLL is None:
        _POLL = httpx.Client(timeout=5)
    return _POLL.get(url, **kwargs)


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
