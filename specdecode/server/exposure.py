"""Who may talk to the server: Host names, browser origins, and the key for its operational pages.

A keyless server on localhost is reachable by every web page its user opens: a page can POST to it
(and, by DNS rebinding, read the answers under a name that resolves to 127.0.0.1). This ASGI middleware
refuses requests whose Host is not one the server answers to, and browser requests from any origin but
the server's own or those named with --cors-origin (which get CORS headers and preflight answers). With
an API key, the operational pages (/docs, /openapi.json) need it too; /metrics needs the metrics key
(--metrics-key), by default the API key: its counters sum up every client's requests.
"""
from __future__ import annotations

import hmac
import json
from urllib.parse import urlsplit

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
KEYED_PAGES = {"/docs", "/openapi.json", "/docs/oauth2-redirect"}
METRICS_PAGE = "/metrics"


def bearer_key_matches(authorization: str, api_key: str) -> bool:
    """Whether an Authorization header carries `Bearer <api_key>` (compared in constant time)."""
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def default_allowed_hosts(bound_host: str) -> set[str] | None:
    """Loopback binds answer to loopback names only; other binds to any name unless --allowed-hosts says."""
    host = bound_host.strip("[]").lower()
    if host in LOOPBACK:
        return set(LOOPBACK)
    return None


def _host_name(host_header: str) -> str:
    """'example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    return (urlsplit("//" + host_header).hostname or "").lower()


def _error(status: int, message: str, code: str, headers: list[tuple[bytes, bytes]] | None = None):
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}).encode()
    start = {"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())] + (headers or [])}
    return start, {"type": "http.response.body", "body": body}


class ExposureGuard:
    def __init__(self, app, allowed_hosts: set[str] | None, cors_origins: list[str], api_key: str | None,
                 metrics_key: str | None = None):
        self.app = app
        self.allowed_hosts = {h.strip("[]").lower() for h in allowed_hosts} if allowed_hosts is not None else None
        self.cors_origins = {o.rstrip("/") for o in cors_origins}
        self.api_key = api_key
        self.metrics_key = metrics_key or api_key

    def _page_key(self, path: str) -> str | None:
        """The key a page asks for (None: open to all)."""
        if path == METRICS_PAGE:
            return self.metrics_key
        return self.api_key if path in KEYED_PAGES else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if self.allowed_hosts is not None and _host_name(host) not in self.allowed_hosts:
            return await self._reply(send, *_error(421, f"this server does not answer to the host '{host}' (see --allowed-hosts)",
                                                   "host_not_allowed"))
        origin = headers.get("origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None:
            same = origin.rstrip("/") == f"{scope.get('scheme', 'http')}://{host}"
            if not same and origin.rstrip("/") not in self.cors_origins and "*" not in self.cors_origins:
                return await self._reply(send, *_error(403, f"cross-origin requests from '{origin}' are refused (see --cors-origin)",
                                                       "origin_not_allowed"))
            if not same:
                cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
                if scope["method"] == "OPTIONS":  # the browser's preflight
                    return await self._reply(send, {"type": "http.response.start", "status": 204, "headers": cors + [
                        (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                        (b"access-control-allow-headers", b"authorization, content-type"),
                        (b"access-control-max-age", b"600")]}, {"type": "http.response.body", "body": b""})
        page_key = self._page_key(scope.get("path", ""))
        if page_key and not bearer_key_matches(headers.get("authorization", ""), page_key):
            return await self._reply(send, *_error(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                                                   "invalid_api_key", [(b"www-authenticate", b"Bearer")]))

        async def send_with_cors(message):
            if cors and message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + cors}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    @staticmethod
    async def _reply(send, start, body):
        await send(start)
        await send(body)
