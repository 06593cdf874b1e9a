"""The HTTP plumbing around a generation: body reading, client identity, disconnects, request counting.

None of it knows about models; app.py puts it together with the backend and shaping.py.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import uuid

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from .connection_limits import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, LIMIT_CONCURRENCY, TIMEOUT_KEEP_ALIVE_S
from .metrics import ServerMetrics
from .protocol import ApiError, parse_json_body

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024  # h11 bounds a request's headers (16 KB); httptools, uvicorn's choice where installed, not
API_ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/models", "/health", "/metrics", "/")


def queue_lane(key_id: str, client: str) -> str:
    """Whose turn in the fair queue: the API key's id (the tenant) and the peer address, which a client cannot
    choose per request (uvicorn believes X-Forwarded-For only from --forwarded-allow-ips)."""
    return json.dumps([key_id, client])


def request_namespace(key_id: str, client: str, user: str | None, presented: str = "") -> str:
    """Whose text a request is: its lane (key id and peer address), then, within it, the `user` field and on a
    server without keys the bearer token shown (a client's own secret). Text remembered from one namespace is
    never drafted for another, nor a cached prefix reused. Written "lane/namespace" (two digests): the stores that
    hold a client's text (the suffix store) count every namespace of one lane as one owner, so minting tokens or
    `user` values buys no larger share."""
    def digest(*parts: str, length: int) -> str:
        text = json.dumps(parts, ensure_ascii=False).encode("utf-8", "surrogatepass")
        return hashlib.sha256(text).hexdigest()[:length]

    return f"{digest(key_id, client, length=16)}/{digest(key_id, client, user or '', presented, length=24)}"


def peer_address(request: Request) -> str:
    return request.client.host if request.client else "?"


async def read_json_body(request: Request) -> dict:
    """The body as a JSON object: application/json only (a browser sends text/plain across origins without asking
    first, so this is part of the defence), at most MAX_BODY_BYTES, counted as it arrives (chunked uploads), whole
    within the app's body timeout (408, and the connection closed), ClientGone if the client hangs up meanwhile."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, f"send the request body as application/json (got '{media_type or 'no content type'}')",
                       code="unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    timeout = getattr(request.app.state, "body_timeout", BODY_TIMEOUT_S)
    try:
        raw = await asyncio.wait_for(_read_body(request), timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s", code="request_timeout",
                       headers={"Connection": "close"}) from None
    except ClientDisconnect:
        raise ClientGone("the client hung up while sending its request body") from None
    return parse_json_body(raw)


def _too_large() -> ApiError:
    return ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="body_too_large")


async def _read_body(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def connection_options(header_timeout: float = HEADER_TIMEOUT_S, limit_concurrency: int = LIMIT_CONCURRENCY) -> dict:
    """uvicorn.Config's settings that bound what connections may hold (serve_options.uvicorn_config takes them)."""
    return {"http": header_deadline_protocol(header_timeout), "limit_concurrency": limit_concurrency,
            "timeout_keep_alive": TIMEOUT_KEEP_ALIVE_S}


def header_deadline_protocol(timeout: float) -> type:
    """uvicorn's HTTP protocol (its "auto": httptools where installed, else h11) with a deadline and a size bound on
    each request's headers. uvicorn has neither for httptools: its keep-alive timeout runs only between requests and
    stops at the next request's first byte, so headers that never end held a connection forever (r6)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderDeadline(AutoHTTPProtocol):
        header_timeout = timeout
        _deadline = None  # the timer while the connection waits for a request's headers
        _waiting_after = None  # the request cycle it waits after (None: the connection's first)
        _header_bytes = 0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._await_headers()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._await_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._waiting():  # what this data brought did not complete the headers
                self._header_bytes += len(data)
                if self._header_bytes > MAX_HEADER_BYTES:
                    self.transport.close()

        def connection_lost(self, exc) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _await_headers(self) -> None:
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a pipelined request is already running: its answer's end arms the next wait
            if self._deadline is not None:
                self._deadline.cancel()
            self._waiting_after, self._header_bytes = self.cycle, 0
            self._deadline = self.loop.call_later(timeout, self._headers_late)

        def _waiting(self) -> bool:
            return self.cycle is self._waiting_after and not self.transport.is_closing()

        def _headers_late(self) -> None:
            if self._waiting():
                self.transport.close()  # nothing was read, no app runs: a plain close, as nginx does

    return HeaderDeadline


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


class RequestCounter:
    """Plain ASGI middleware (safe with streaming, unlike BaseHTTPMiddleware): counts requests by status, and names
    each answer with an `x-request-id` header, as OpenAI does (its SDK shows it as `_request_id`, for bug reports)."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = "disconnected"
        request_id = ("req_" + uuid.uuid4().hex).encode()

        async def counting_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
                message = {**message, "headers": list(message.get("headers", [])) + [(b"x-request-id", request_id)]}
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            status = "500"
            raise
        finally:
            path = scope.get("path", "")
            if path not in API_ENDPOINTS:
                path = next((f"{base}/{{id}}" for base in ("/v1/models", "/v1/responses") if path.startswith(base + "/")), "other")
            self.metrics.requests.labels(path, status).inc()


class DisconnectWatch:
    """Waits on an awaitable unless the client disconnects first (request body already read)."""

    def __init__(self, request: Request):
        self.request = request
        self.task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self.request.receive()
            if message["type"] == "http.disconnect":
                return

    async def wait(self, awaitable):
        getter = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait({getter, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        raise ClientGone

    def close(self) -> None:
        self.task.cancel()


class JobStreamingResponse(StreamingResponse):
    """A streamed answer that cancels its generation however the response ends (done, disconnect, error)."""

    def __init__(self, content, ticket, **kwargs):
        super().__init__(content, **kwargs)
        self.ticket = ticket

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ticket.cancel("client_disconnected")  # no-op when the generation finished
