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

from .metrics import ServerMetrics
from .protocol import ApiError, parse_json_body

MAX_BODY_BYTES = 4 * 1024 * 1024
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
    first, so this is part of the defence), at most MAX_BODY_BYTES, counted as it arrives (chunked uploads)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, f"send the request body as application/json (got '{media_type or 'no content type'}')",
                       code="unsupported_media_type")
    too_large = ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="body_too_large")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return parse_json_body(b"".join(chunks))


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
