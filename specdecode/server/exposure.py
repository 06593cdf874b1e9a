"""Who may talk to the server: Host names, browser origins, and the key for its operational pages.

A keyless server on localhost is reachable by every web page its user opens: a page can POST to it
(and, by DNS rebinding, read the answers under a name that resolves to 127.0.0.1). This ASGI middleware
refuses requests whose Host is not one the server answers to, and browser requests from any origin but
the server's own or those named with --cors-origin (which get CORS headers and preflight answers). With
an API key, the operational pages (/docs, /openapi.json) need it too; /metrics needs the metrics key
(--metrics-key), by default the API key: its counters sum up every client's requests, so with several tenants' keys
it needs a metrics key of its own (without one nobody reads it: each tenant would read the others' traffic).
/health is open to all, but shows its counters (queued, running, completed) only to whoever may read /metrics.
"""
from __future__ import annotations

import hmac
import json
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import InputError

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
KEYED_PAGES = {"/docs", "/openapi.json", "/docs/oauth2-redirect"}
METRICS_PAGE = "/metrics"


@dataclass(frozen=True)
class ApiKeys:
    """The keys the API accepts, each under the id of whom it was given to (a tenant). The key id, not the key,
    says whose namespace and whose queue lane a request is in."""

    entries: tuple[tuple[str, str], ...] = ()  # (key id, key)

    @classmethod
    def of(cls, keys: "ApiKeys | str | None") -> "ApiKeys":
        """ApiKeys as is; one key (--api-key) under the id "default"; None: no keys, an open API."""
        if isinstance(keys, ApiKeys):
            return keys
        return cls((("default", keys),)) if keys else cls()

    def __bool__(self) -> bool:
        return bool(self.entries)

    def identify(self, authorization: str) -> str | None:
        """The id of the key an Authorization header carries as `Bearer <key>`, or None. Every key is compared, each
        in constant time, so the time taken says nothing about which key came close."""
        scheme, _, token = authorization.partition(" ")
        presented = token.strip().encode()
        found = None
        for key_id, key in self.entries:
            if hmac.compare_digest(presented, key.encode()) and found is None:
                found = key_id
        return found if scheme.lower() == "bearer" else None

    def merged(self, other: "ApiKeys") -> "ApiKeys":
        ids = {key_id for key_id, _ in self.entries}
        clash = sorted(ids & {key_id for key_id, _ in other.entries})
        if clash:
            raise InputError(f"the key id '{clash[0]}' is given twice (--api-key is the id 'default')")
        keys = {key for _, key in self.entries}
        if keys & {key for _, key in other.entries}:
            raise InputError("the same API key is given under two key ids")
        return ApiKeys(self.entries + other.entries)


KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")


def parse_api_keys(text: str, source: str, commas: bool = False) -> ApiKeys:
    """`id:key` entries, one a line (blank lines and lines starting with # are skipped); with `commas` (an
    environment variable), commas separate entries too."""
    entries: list[tuple[str, str]] = []
    lines = re.split(r"[\n,]", text) if commas else text.splitlines()
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key_id, colon, key = line.partition(":")
        key_id, key = key_id.strip(), key.strip()
        where = f"{source}, entry {number}"
        if not colon or not key:
            raise InputError(f"{where}: write each key as 'id:key'")
        if not KEY_ID.fullmatch(key_id):
            raise InputError(f"{where}: a key id is 1-64 letters, digits or ._@+- (got {key_id!r})")
        if any(c.isspace() for c in key):
            raise InputError(f"{where}: a key cannot hold whitespace")
        entries.append((key_id, key))
    if not entries:
        raise InputError(f"{source} holds no 'id:key' entries")
    keys = ApiKeys()
    for entry in entries:
        keys = keys.merged(ApiKeys((entry,)))
    return keys


def load_api_keys(path: str) -> ApiKeys:
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_api_keys(handle.read(), path)
    except OSError as exc:
        raise InputError(f"cannot read the API key file {path}: {exc.strerror}") from None


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
    def __init__(self, app, allowed_hosts: set[str] | None, cors_origins: list[str], api_key: ApiKeys | str | None,
                 metrics_key: str | None = None):
        self.app = app
        self.allowed_hosts = {h.strip("[]").lower() for h in allowed_hosts} if allowed_hosts is not None else None
        self.cors_origins = {o.rstrip("/") for o in cors_origins}
        self.api_keys = ApiKeys.of(api_key)
        self.metrics_keys = ApiKeys.of(metrics_key) if metrics_key else self.api_keys
        self.metrics_closed = not metrics_key and len(self.api_keys.entries) > 1  # several tenants, no operator key

    def _page_keys(self, path: str) -> ApiKeys:
        """The keys a page takes (none: open to all)."""
        if path == METRICS_PAGE:
            return self.metrics_keys
        return self.api_keys if path in KEYED_PAGES else ApiKeys()

    def reads_metrics(self, authorization: str) -> bool:
        """Whether this caller may read the server-wide counters (/metrics, and those in /health)."""
        if self.metrics_closed:
            return False
        return not self.metrics_keys or self.metrics_keys.identify(authorization) is not None

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
        path, authorization = scope.get("path", ""), headers.get("authorization", "")
        if path == METRICS_PAGE and self.metrics_closed:
            return await self._reply(send, *_error(401, "/metrics sums up every tenant's requests: with several API keys"
                                                   " it takes only the operator's --metrics-key", "invalid_api_key",
                                                   [(b"www-authenticate", b"Bearer")]))
        page_keys = self._page_keys(path)
        if page_keys and page_keys.identify(authorization) is None:
            return await self._reply(send, *_error(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                                                   "invalid_api_key", [(b"www-authenticate", b"Bearer")]))
        # what /health may show this caller (a request's state: Starlette's request.state reads scope["state"])
        scope = {**scope, "state": {**scope.get("state", {}), "reads_metrics": self.reads_metrics(authorization)}}

        async def send_with_cors(message):
            if cors and message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + cors}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    @staticmethod
    async def _reply(send, start, body):
        await send(start)
        await send(body)
