"""OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (with tool calls: tools.py), /v1/responses
(responses.py), /v1/models, /health, /metrics, and a playground page at /.

    app = create_app(engine, "draft", "smollm2-135m")      # testable: any ASGI server can run it
    specdecode serve --model smollm2-135m --draft lookup    # serve_command.run_server: uvicorn + signal handling

Requests are parsed and validated (protocol.py), handed to a backend (local.py: one engine with its Scheduler in
this process; cluster.py: engine replicas on a Ray cluster), and answered as JSON or as server-sent events in
OpenAI's chunk format (shaping.py). The HTTP plumbing (bodies, disconnects, client identity) is in http_parts.py.
"""
from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import InputError
from .choices import ChoicesStreamingResponse, check_choices, joined_body, run_choices, stream_end
from .exposure import ApiKeys, ExposureGuard
from .http_parts import (BODY_TIMEOUT_S, ClientGone, DisconnectWatch, JobStreamingResponse, RequestCounter, peer_address,
                         queue_lane, read_json_body, request_namespace)
from .local import LocalBackend
from .metrics import ServerMetrics
from .protocol import ApiError, GenerationRequest, parse_chat, parse_completion
from .responses import ChatHost, register_responses
from .scheduler import Scheduler
from .shaping import ChunkStream, Shaper, fingerprint, gather_steps, parsed_off_the_loop_if_long, response_id

log = logging.getLogger("specdecode.server")
# What /health tells anyone: whether to send requests here and what this server is. Its counts (queued, running,
# completed; a cluster's per-replica queues) sum up every client's requests: only for who may read /metrics.
PUBLIC_HEALTH = {"status", "model", "drafters", "default_drafter", "max_context", "auth", "queue_size", "max_batch",
                 "replicas", "replicas_ready"}


def _playground_html() -> str:
    return resources.files("specdecode.server").joinpath("playground.html").read_text(encoding="utf-8")


def create_app(engine, default_drafter: str, model_name: str, api_key: ApiKeys | str | None = None, queue_size: int = 16,
               *, default_max_tokens: int = 256, max_k: int | None = None, warmup: bool = False,
               allowed_hosts: set[str] | None = None, cors_origins: list[str] = (), max_batch: int = 8,
               metrics_key: str | None = None, expose_timings: bool = False) -> FastAPI:
    """The ASGI app around one engine. `default_drafter` is used when a request names none.
    api_key: one key, or ApiKeys (several, each under a tenant's key id); None: an open API.
    allowed_hosts: the Host names it answers to (None: any); cors_origins: other origins browsers may call it from;
    metrics_key: the key /metrics asks for (None: the API key); expose_timings: put each request's timings in its
    response (`stats.time`, `tokens_per_s`, ...), which tell a client how busy the server was and what was cached."""
    if queue_size < 1:
        raise InputError(f"the queue size must be at least 1, got {queue_size}")
    if max_batch < 1:
        raise InputError(f"the batch size must be at least 1, got {max_batch}")
    metrics = ServerMetrics(model_name)
    scheduler = Scheduler(engine, default_drafter, queue_size, metrics, default_max_tokens, max_k, max_batch)
    app = create_http_app(LocalBackend(scheduler, warmup), model_name, metrics, api_key=api_key,
                          allowed_hosts=allowed_hosts, cors_origins=cors_origins, metrics_key=metrics_key,
                          expose_timings=expose_timings, fingerprint=fingerprint(engine))
    app.state.scheduler = scheduler
    app.state.engine = engine
    return app


class ChatApi:
    """What the generation routes share over one backend: key checks, namespaces, queueing a request and
    answering it whole or streamed."""

    def __init__(self, backend, model_name: str, api_keys: ApiKeys, shaper: Shaper):
        self.backend = backend
        self.model_name = model_name
        self.api_keys = api_keys
        self.shaper = shaper
        self.created = int(time.time())

    def check_api_key(self, request: Request) -> str:
        """The id of the key the request shows ("" on a server without keys)."""
        if not self.api_keys:
            return ""
        key_id = self.api_keys.identify(request.headers.get("authorization", ""))
        if key_id is None:
            raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return key_id

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise ApiError(404, f"the model '{name}' does not exist here; this server serves '{self.model_name}'",
                           param="model", code="model_not_found")

    def model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "specdecode",
                "specdecode": {"drafters": self.backend.drafters, "default_drafter": self.backend.default_drafter,
                               "max_context": self.backend.max_context}}

    def namespace_of(self, request: Request, key_id: str, user: str | None) -> str:
        presented = "" if self.api_keys else request.headers.get("authorization", "")
        return request_namespace(key_id, peer_address(request), user, presented)

    def lane_of(self, request: Request, key_id: str) -> str:
        """Who the client is, whatever token or `user` it shows: its fair-queue lane and its quotas."""
        return queue_lane(key_id, peer_address(request))

    async def generate(self, request: Request, kind: str):
        key_id = self.check_api_key(request)
        body = await read_json_body(request)
        gen = parse_chat(body) if kind == "chat" else parse_completion(body)
        if gen.n > 1 or gen.prompts:
            return await self.generate_choices(request, gen, key_id)
        return await self.run_generation(request, gen, key_id, self._answer(gen),
                                         lambda ticket: ChunkStream(self.shaper, gen).events(ticket))

    def _answer(self, gen: GenerationRequest):
        async def answer(ticket, watch):
            done = await gather_steps(ticket, watch)
            return await parsed_off_the_loop_if_long(done.text if gen.tools else "", self.shaper.completion_body, gen, done)

        return answer

    async def generate_choices(self, request: Request, gen: GenerationRequest, key_id: str):
        """n > 1 (choices.py): the choices run side by side, each its own generation; one response joins them."""
        self.check_model(gen.model)
        check_choices(gen, self.backend.max_batch)
        joined_id = response_id(gen.kind)
        usages: list[dict] = []  # each streamed choice's usage, as it finishes
        parts = await run_choices(gen, lambda index, one: self.run_generation(
            request, one, key_id, self._answer(one),
            lambda ticket: ChunkStream(self.shaper, one, index, joined_id, usages).events(ticket)))
        if not gen.stream:
            gone = next((part for part in parts if not isinstance(part, dict)), None)  # a client gone: 499
            return gone if gone is not None else joined_body(parts, gen.n)
        head = {"id": joined_id, "object": "chat.completion.chunk" if gen.kind == "chat" else "text_completion",
                "model": self.model_name, "system_fingerprint": self.shaper.fingerprint}
        return ChoicesStreamingResponse(parts, lambda: stream_end(gen, head, usages), media_type="text/event-stream",
                                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def run_generation(self, request: Request, gen: GenerationRequest, key_id: str, answer, stream):
        """Queue `gen`, wait for its start, then answer: `await answer(ticket, watch)` (a JSON body) or, for a
        streamed request, server-sent events from `stream(ticket)`."""
        self.check_model(gen.model)
        if gen.drafter is not None and gen.drafter not in self.backend.drafters:
            raise ApiError(400, f"drafter '{gen.drafter}' needs a draft model; this server has none (try 'lookup')",
                           param="speculative.drafter", code="drafter_unavailable")
        ticket = await self.backend.submit(gen, self.lane_of(request, key_id), self.namespace_of(request, key_id, gen.user))
        watch = DisconnectWatch(request)
        try:
            first = await watch.wait(ticket.next())  # waits in the queue, then for the tokenizer and checks
            if first[0] == "error":
                raise first[1]
            if gen.stream:
                watch.close()  # from here the streaming response watches the connection itself
                return JobStreamingResponse(stream(ticket), ticket, media_type="text/event-stream",
                                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return await answer(ticket, watch)
        except ClientGone:
            ticket.cancel("client_disconnected")
            return Response(status_code=499)  # nobody reads it; logs and metrics do
        except BaseException:  # an error answer, or this task cancelled: the job must not run on for nobody
            ticket.cancel("aborted")
            raise
        finally:
            watch.close()

    def chat_host(self) -> ChatHost:
        """What the Responses API's routes borrow from these."""
        return ChatHost(self.model_name, self.check_api_key, read_json_body, self.namespace_of, self.lane_of,
                        self.run_generation, gather_steps)


def add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Every error in OpenAI's shape, counted by kind."""

    def error_response(exc: ApiError) -> JSONResponse:
        metrics.errors.labels(exc.kind).inc()
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError):
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code,
                                       headers=dict(exc.headers or {})))

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, exc: ClientGone):
        # The client hung up before its request was whole (r7: counted as a 500, with two tracebacks in the log):
        # nobody reads this answer; the metrics count a 499 and the access log says so in one line.
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception):
        log.exception("unhandled error")
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}", code="internal_error"))


def add_routes(app: FastAPI, api: ChatApi, metrics: ServerMetrics) -> None:
    backend, playground = api.backend, _playground_html()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await api.generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await api.generate(request, "chat")

    @app.get("/v1/models")
    async def list_models(request: Request):
        api.check_api_key(request)
        return {"object": "list", "data": [api.model_card()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(request: Request, name: str):
        api.check_api_key(request)
        api.check_model(name)
        return api.model_card()

    @app.get("/health")
    async def health(request: Request):
        state = await backend.health()
        body = {"status": state.pop("status"), "model": api.model_name, "drafters": backend.drafters,
                "default_drafter": backend.default_drafter, "max_context": backend.max_context,
                "auth": bool(api.api_keys), **state}
        if not getattr(request.state, "reads_metrics", False):  # the counts of every client's requests: the operator's
            body = {key: value for key, value in body.items() if key in PUBLIC_HEALTH}
        # Draining, shutting down or no replica ready: 503, so that load balancers stop sending meanwhile.
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(await backend.metrics_text(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse)
    async def index():
        return HTMLResponse(playground)


def create_http_app(backend, model_name: str, metrics: ServerMetrics, *, api_key: ApiKeys | str | None = None,
                    allowed_hosts: set[str] | None = None, cors_origins: list[str] = (), metrics_key: str | None = None,
                    expose_timings: bool = False, fingerprint: str | None = None) -> FastAPI:
    """The routes, errors and streaming around a generation backend (the interface is in local.py).
    `metrics` counts this app's HTTP requests and errors (and, for a local backend, its generations)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await backend.start()
        try:
            yield
        finally:
            await backend.stop()

    app = FastAPI(title="specdecode", version="0.1.0", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.backend = backend
    app.state.metrics = metrics
    app.state.body_timeout = BODY_TIMEOUT_S  # read_json_body's deadline on a whole request body
    app.add_middleware(ExposureGuard, allowed_hosts=allowed_hosts, cors_origins=list(cors_origins), api_key=api_key,
                       metrics_key=metrics_key)
    app.add_middleware(RequestCounter, metrics=metrics)
    add_error_handlers(app, metrics)
    api = ChatApi(backend, model_name, ApiKeys.of(api_key), Shaper(model_name, expose_timings, fingerprint))
    register_responses(app, api.chat_host())
    add_routes(app, api, metrics)
    return app
