"""Whose request is it: the namespace (whose earlier text drafts may copy, whose cached prefix may be reused) and the
fair queue's lane come from the API key's id and the peer address, never from what a request says about itself.
No model: the routes run over a backend that records what it is handed."""
from __future__ import annotations

import httpx
import pytest
from starlette.testclient import TestClient

from specdecode.errors import InputError
from specdecode.server.app import create_http_app
from specdecode.server.serve_options import api_keys_from_args
from specdecode.server.exposure import ApiKeys, parse_api_keys
from specdecode.server.metrics import ServerMetrics
from specdecode.server.protocol import ApiError

from .conftest import start_server

MODEL = "recorder"


class RecordingBackend:
    """Records (lane, namespace) of every request and answers it 503: the identity is all these tests need."""

    drafters = ["none", "lookup"]
    default_drafter = "lookup"
    max_context = 256

    def __init__(self):
        self.seen: list[tuple[str, str]] = []

    async def start(self):
        pass

    async def stop(self):
        pass

    async def submit(self, request, user_key, namespace=""):
        self.seen.append((user_key, namespace))
        raise ApiError(503, "recorded", code="recorded")

    async def health(self):
        return {"status": "ok"}

    async def metrics_text(self, metrics):
        return metrics.render()


def recorder(api_key=None):
    backend = RecordingBackend()
    return backend, create_http_app(backend, MODEL, ServerMetrics(MODEL), api_key=api_key)


def ask(post, user=None, key=None, headers=()):
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1}
    if user is not None:
        body["user"] = user
    headers = dict(headers)
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    assert post("/v1/completions", json=body, headers=headers).status_code == 503


def test_a_spoofed_forwarded_for_changes_neither_namespace_nor_lane():
    """uvicorn believes X-Forwarded-For from loopback by default, so any local process could claim any address.
    The server runs it with proxy headers off unless --forwarded-allow-ips names the proxy."""
    backend, app = recorder()
    server = start_server(app, None)
    try:
        post = lambda path, **kw: httpx.post(server.base_url + path, timeout=30, **kw)  # noqa: E731
        ask(post)
        ask(post, headers={"X-Forwarded-For": "203.0.113.7"})
        ask(post, headers={"X-Forwarded-For": "198.51.100.1, 127.0.0.1"})
    finally:
        server.stop()
    assert backend.seen[0] == backend.seen[1] == backend.seen[2]

    backend, app = recorder()
    behind_proxy = start_server(app, None, forwarded_allow_ips="127.0.0.1")  # a proxy on this machine fronts it
    try:
        post = lambda path, **kw: httpx.post(behind_proxy.base_url + path, timeout=30, **kw)  # noqa: E731
        ask(post, headers={"X-Forwarded-For": "203.0.113.7"})
        ask(post, headers={"X-Forwarded-For": "198.51.100.1"})
    finally:
        behind_proxy.stop()
    assert backend.seen[0] != backend.seen[1]  # the proxy's word is taken: two clients


def test_two_keys_never_share_a_namespace():
    keys = parse_api_keys("# tenants\nalice:key-a\n\nbob:key-b\n", "keys.txt")
    backend, app = recorder(keys)
    http = TestClient(app)
    for user in (None, "same-user"):
        ask(http.post, user=user, key="key-a")
        ask(http.post, user=user, key="key-b")
        ask(http.post, user=user, key="key-a")
    (a_lane, a_ns), (b_lane, b_ns), again = backend.seen[:3]
    assert a_ns != b_ns and a_lane != b_lane and again == (a_lane, a_ns)
    assert backend.seen[3][1] != backend.seen[4][1]
    assert len({ns for _, ns in backend.seen}) == 4  # (alice, bob) x (no user, same-user)
    assert http.post("/v1/completions", json={"model": MODEL, "prompt": "x"},
                     headers={"Authorization": "Bearer key-c"}).status_code == 401


@pytest.mark.parametrize("api_key", [None, "the-key"], ids=["open", "keyed"])
def test_varying_user_splits_the_namespace_but_opens_no_queue_lane(api_key):
    """`user` was the fair queue's lane key: any client could open a lane per request and take every other turn."""
    backend, app = recorder(api_key)
    http = TestClient(app)
    for user in ("u1", "u2", "u3", None):
        ask(http.post, user=user, key=api_key)
    lanes = {lane for lane, _ in backend.seen}
    namespaces = {ns for _, ns in backend.seen}
    assert len(lanes) == 1 and len(namespaces) == 4


def test_api_keys_from_a_file_the_environment_and_the_flag(tmp_path, monkeypatch):
    from specdecode.cli import build_parser

    monkeypatch.delenv("SPECDECODE_API_KEY", raising=False)
    monkeypatch.delenv("SPECDECODE_API_KEYS", raising=False)
    path = tmp_path / "keys"
    path.write_text("alice:key-a\nbob: key-b \n")
    args = build_parser().parse_args(["serve", "--api-keys", str(path), "--api-key", "solo"])
    monkeypatch.setenv("SPECDECODE_API_KEYS", "carol:key-c,dave:key-d")
    keys = api_keys_from_args(args)
    assert dict(keys.entries) == {"default": "solo", "alice": "key-a", "bob": "key-b", "carol": "key-c", "dave": "key-d"}
    assert keys.identify("Bearer key-b") == "bob" and keys.identify("Bearer key-x") is None
    assert keys.identify("Basic key-b") is None and ApiKeys.of("k").identify("Bearer k") == "default"
    for text, message in [("alice:1\nalice:2", "given twice"), ("alice:1\nbob:1", "two key ids"),
                          ("no-colon", "'id:key'"), ("bad id:1", "key id"), ("a:b c", "whitespace"), ("# only", "no 'id:key'")]:
        with pytest.raises(InputError, match=message):
            parse_api_keys(text, "keys")
