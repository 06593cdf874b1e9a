"""What a connection may hold, with real sockets against a real server (review turn 5, findings 6 and 7): a request's
headers and its body each have a deadline, a client hanging up mid-upload is a quiet 499, and `specdecode serve`
gives uvicorn a connection limit."""
from __future__ import annotations

import json
import logging
import socket
import time
from types import SimpleNamespace

import httpx
import pytest

from .conftest import CONTEXT, MODEL, start_server

DEADLINE = 1.0  # the test server's header and body deadlines, seconds
HALF_HEADERS = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
HALF_BODY = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100000\r\n\r\n{\"model\": ")
WHOLE = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1, "temperature": 0}).encode()


@pytest.fixture(scope="module")
def server(models):
    from specdecode.engine import Engine
    from specdecode.server.app import create_app

    engine = Engine(models[0], None, max_context=CONTEXT)
    app = create_app(engine, "lookup", MODEL, queue_size=4, max_batch=2)
    app.state.body_timeout = DEADLINE
    live = start_server(app, engine, header_timeout=DEADLINE)
    yield live
    live.stop()


def connect(server) -> socket.socket:
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def read_until_closed(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before it closed the connection; None if it is still open after `seconds`."""
    sock.settimeout(0.2)
    data, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return data
        if not chunk:
            return data
        data += chunk
    return None


def test_half_sent_headers_and_bodies_are_closed_after_their_deadlines(server):
    """r6: 300 of 300 half-sent requests were still open after 70 s."""
    headers, bodies = [connect(server) for _ in range(5)], [connect(server) for _ in range(5)]
    for sock in headers:
        sock.sendall(HALF_HEADERS)
    for sock in bodies:
        sock.sendall(HALF_BODY)
    start = time.monotonic()
    for _ in range(4):  # a byte now and then keeps nothing open
        time.sleep(DEADLINE / 4)
        for sock in headers + bodies:
            sock.sendall(b" ")
    for sock in headers:
        assert read_until_closed(sock, 3 * DEADLINE) == b""  # closed without an answer, as nginx does
    for sock in bodies:
        answer = read_until_closed(sock, 3 * DEADLINE)
        assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
    assert time.monotonic() - start < 5 * DEADLINE
    assert httpx.post(server.api_url + "/completions", content=WHOLE, timeout=60,
                      headers={"Content-Type": "application/json"}).status_code == 200


def test_the_next_request_on_a_kept_connection_has_a_header_deadline_too(server):
    """uvicorn's keep-alive timeout stops at the next request's first byte: headers begun after an answer were held."""
    sock = connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(WHOLE), WHOLE))
    sock.settimeout(60)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.sendall(HALF_HEADERS)  # uvicorn's own keep-alive timeout (5 s) stops here
    assert read_until_closed(sock, 3 * DEADLINE) is not None


def test_a_request_within_its_deadlines_is_answered(server):
    """Sent slowly, a piece every half deadline, but whole before each deadline: answered."""
    sock = connect(server)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(WHOLE))
    for piece in (head[:20], head[20:], WHOLE[:10], WHOLE[10:]):
        sock.sendall(piece)
        time.sleep(DEADLINE / 3)
    sock.settimeout(60)
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def counts(server) -> dict[str, float]:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(("specdecode_requests_total", "specdecode_errors_total"))}


def test_a_client_hanging_up_mid_upload_is_a_quiet_499(server):
    """r7: each hang-up was counted as a 500 (and an internal_error) and logged two tracebacks."""
    records = Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "specdecode")]
    for logger in loggers:
        logger.addHandler(records)
    try:
        before = counts(server)
        for _ in range(5):
            sock = connect(server)
            sock.sendall(HALF_BODY.replace(b"/v1/completions", b"/v1/chat/completions"))
            time.sleep(0.05)
            sock.close()
        time.sleep(0.5)
        after = counts(server)
    finally:
        for logger in loggers:
            logger.removeHandler(records)
    chat = 'specdecode_requests_total{endpoint="/v1/chat/completions",status="%s"}'
    assert after.get(chat % "499", 0) - before.get(chat % "499", 0) == 5
    assert not [name for name in after if 'status="500"' in name or "internal_error" in name]
    loud = [record for record in records.records if record.levelno > logging.INFO]
    assert not loud, [record.getMessage() for record in loud]


def test_specdecode_serve_bounds_connections():
    from specdecode.cli import build_parser
    from specdecode.server.http_parts import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, LIMIT_CONCURRENCY
    from specdecode.server.serve_command import server_config

    args = build_parser().parse_args(["serve", "--port", "18299"])
    assert (args.header_timeout, args.body_timeout, args.limit_concurrency) == (
        HEADER_TIMEOUT_S, BODY_TIMEOUT_S, LIMIT_CONCURRENCY)
    config = server_config(object(), args)
    assert config.limit_concurrency == LIMIT_CONCURRENCY and config.timeout_keep_alive == 5
    assert config.http.__name__ == "HeaderDeadline" and HEADER_TIMEOUT_S <= 10 and BODY_TIMEOUT_S <= 60
    # the flags reach uvicorn
    args = build_parser().parse_args(["serve", "--header-timeout", "2.5", "--limit-concurrency", "64"])
    config = server_config(object(), args)
    assert config.limit_concurrency == 64 and config.http.header_timeout == 2.5
