"""OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (with tool calls: tools.py), /v1/responses
(responses.py), /v1/models, /health, /metrics, and a playground page at /.

    app = create_app(engine, "draft", "smollm2-135m")      # testable: any ASGI server can run it
    specdecode serve --model smollm2-135m --draft lookup    # run_server(args): uvicorn + signal handling

Requests are parsed and validated here, handed to a backend (local.py: one engine with its Scheduler in this
process; cluster.py: engine replicas on a Ray cluster), and answered as JSON or as server-sent events in
OpenAI's chunk format. Each streamed chunk carries an extra
"specdecode" field with the tokens of the step, their origin (draft / target / bonus), their text and
the running speculation statistics; the playground colours tokens from it.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..build import build_engine
from ..errors import InputError
from .choices import ChoicesStreamingResponse, check_choices, joined_body, run_choices, stream_end
from .exposure import LOOPBACK, ApiKeys, ExposureGuard, default_allowed_hosts, load_api_keys, parse_api_keys
from .local import LocalBackend
from .logprobs import chat_logprobs, completion_logprobs
from .metrics import ServerMetrics
from .protocol import ApiError, GenerationRequest, parse_chat, parse_completion, parse_json_body
from .responses import ChatHost, register_responses
from .scheduler import Scheduler, Step
from .tools import ToolCallStream, chat_message, finish_reason

log = logging.getLogger("specdecode.server")

MAX_BODY_BYTES = 4 * 1024 * 1024
API_ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/models", "/health", "/metrics", "/")


def queue_lane(key_id: str, client: str) -> str:
    """Whose turn in the fair queue: the API key's id (the tenant) and the peer address, which a client cannot
    choose per request (uvicorn believes X-Forwarded-For only from --forwarded-allow-ips)."""
    return json.dumps([key_id, client])


def request_namespace(key_id: str, client: str, user: str | None, presented: str = "") -> str:
    """Whose text a request is: its lane (key id and peer address), then, within it, the `user` field and on a
    server without keys the bearer token shown (a client's own secret). Text remembered from one namespace is
    never drafted for another, nor a cached prefix reused."""
    identity = json.dumps([key_id, client, user or "", presented], ensure_ascii=False)
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


class RequestCounter:
    """Plain ASGI middleware (safe with streaming, unlike BaseHTTPMiddleware): counts requests by status."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = "disconnected"

        async def counting_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
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


# Figures a client could read other clients' activity from: how long its prefill took (whether a prefix was already
# cached), what the passes it shared cost, whether it paid for a calibration. Out of responses unless --expose-timings.
TIMING_STATS = frozenset({"tokens_per_s", "time", "predicted_speedup", "notes"})


def client_stats(stats: dict, expose_timings: bool) -> dict:
    """A generation's statistics as a client may see them."""
    return dict(stats) if expose_timings else {k: v for k, v in stats.items() if k not in TIMING_STATS}


def _usage(stats: dict, expose_timings: bool = False) -> dict:
    usage = {
        "prompt_tokens": stats["prompt_tokens"],
        "completion_tokens": stats["generated_tokens"],
        "total_tokens": stats["prompt_tokens"] + stats["generated_tokens"],
        "drafter": stats["drafter"],
        "drafted": stats["drafted"],
        "accepted": stats["accepted"],
        "alpha": stats["alpha"],
        "tau": stats["tau"],
        "target_passes": stats["target_passes"],
    }
    if expose_timings:
        usage["tokens_per_s"] = stats["tokens_per_s"]
    return usage


def response_logprobs(gen: GenerationRequest, entries: list[dict], text_offset: int = 0) -> dict | None:
    """The choice's `logprobs` field: None unless the request asked for them."""
    if gen.controls is None or gen.controls.logprobs is None:
        return None
    return chat_logprobs(entries) if gen.kind == "chat" else completion_logprobs(entries, text_offset)


async def gather_steps(ticket, watch: DisconnectWatch) -> tuple[str, Step, list[int], list[str], list[str], list[dict]]:
    """A whole generation: (text, last step, tokens, origins, sources, logprob entries)."""
    text, tokens, origins, sources, logprobs = [], [], [], [], []
    while True:
        message = await watch.wait(ticket.next())
        if message[0] == "error":
            raise message[1]
        step: Step = message[1]
        text.append(step.text)
        tokens.extend(step.tokens)
        origins.extend(step.origins)
        sources.extend(step.sources)
        logprobs.extend(step.logprobs)
        if step.finished:
            break
    # A stop string completed a step later can withdraw tokens already handed on: keep the answer's own.
    answer = step.stats["generated_tokens"]
    del tokens[answer:], origins[answer:], sources[answer:], logprobs[answer:]
    return "".join(text), step, tokens, origins, sources, logprobs


def _sse(payload) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


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
                          expose_timings=expose_timings)
    app.state.scheduler = scheduler
    app.state.engine = engine
    return app


def create_http_app(backend, model_name: str, metrics: ServerMetrics, *, api_key: ApiKeys | str | None = None,
                    allowed_hosts: set[str] | None = None, cors_origins: list[str] = (), metrics_key: str | None = None,
                    expose_timings: bool = False) -> FastAPI:
    """The routes, errors and streaming around a generation backend (the interface is in local.py).
    `metrics` counts this app's HTTP requests and errors (and, for a local backend, its generations)."""
    created = int(time.time())
    playground = _playground_html()
    api_keys = ApiKeys.of(api_key)

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
    app.add_middleware(ExposureGuard, allowed_hosts=allowed_hosts, cors_origins=list(cors_origins), api_key=api_key,
                       metrics_key=metrics_key)
    app.add_middleware(RequestCounter, metrics=metrics)

    # ------------------------------------------------------------------ errors, all in OpenAI's shape
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

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception):
        log.exception("unhandled error")
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}", code="internal_error"))

    # ------------------------------------------------------------------ helpers
    def check_api_key(request: Request) -> str:
        """The id of the key the request shows ("" on a server without keys)."""
        if not api_keys:
            return ""
        key_id = api_keys.identify(request.headers.get("authorization", ""))
        if key_id is None:
            raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return key_id

    async def read_body(request: Request) -> dict:
        # A browser sends text/plain across origins without asking first; JSON only is part of the defence.
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise ApiError(415, f"send the request body as application/json (got '{media_type or 'no content type'}')",
                           code="unsupported_media_type")
        too_large = ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="body_too_large")
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise too_large
        chunks, size = [], 0
        async for chunk in request.stream():  # a chunked upload declares no length: count as it arrives
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise too_large
            chunks.append(chunk)
        return parse_json_body(b"".join(chunks))

    def check_model(name: str) -> None:
        if name != model_name:
            raise ApiError(404, f"the model '{name}' does not exist here; this server serves '{model_name}'",
                           param="model", code="model_not_found")

    def model_card() -> dict:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "specdecode",
                "specdecode": {"drafters": backend.drafters, "default_drafter": backend.default_drafter,
                               "max_context": backend.max_context}}

    # ------------------------------------------------------------------ generation
    def namespace_of(request: Request, key_id: str, user: str | None) -> str:
        client = request.client.host if request.client else "?"
        presented = "" if api_keys else request.headers.get("authorization", "")
        return request_namespace(key_id, client, user, presented)

    async def generate(request: Request, kind: str):
        key_id = check_api_key(request)
        body = await read_body(request)
        gen = parse_chat(body) if kind == "chat" else parse_completion(body)
        if gen.n > 1:
            return await generate_choices(request, gen, key_id)
        return await run_generation(request, gen, key_id, lambda ticket, watch: collect(ticket, gen, watch),
                                    lambda ticket: stream_chunks(ticket, gen))

    async def generate_choices(request: Request, gen: GenerationRequest, key_id: str):
        """n > 1 (choices.py): the choices run side by side, each its own generation; one response joins them."""
        check_model(gen.model)
        check_choices(gen, backend.max_batch)
        response_id, obj = ids(gen.kind)
        usages: list[dict] = []  # each streamed choice's usage, as it finishes
        parts = await run_choices(gen, lambda index, one: run_generation(
            request, one, key_id, lambda ticket, watch: collect(ticket, one, watch),
            lambda ticket: stream_chunks(ticket, one, index, response_id, usages)))
        if not gen.stream:
            bad = next((part for part in parts if not isinstance(part, dict)), None)  # a client gone: 499
            return bad if bad is not None else joined_body(parts)
        chunk_kind = "chat.completion.chunk" if gen.kind == "chat" else obj
        head = {"id": response_id, "object": chunk_kind, "model": model_name}
        return ChoicesStreamingResponse(parts, lambda: stream_end(gen, head, usages), media_type="text/event-stream",
                                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def run_generation(request: Request, gen: GenerationRequest, key_id: str, answer, stream):
        """Queue `gen`, wait for its start, then answer: `await answer(ticket, watch)` (a JSON body) or, for a
        streamed request, server-sent events from `stream(ticket)`."""
        check_model(gen.model)
        if gen.drafter is not None and gen.drafter not in backend.drafters:
            raise ApiError(400, f"drafter '{gen.drafter}' needs a draft model; this server has none (try 'lookup')",
                           param="speculative.drafter", code="drafter_unavailable")
        client = request.client.host if request.client else "?"
        ticket = await backend.submit(gen, queue_lane(key_id, client), namespace_of(request, key_id, gen.user))
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

    def ids(kind: str) -> tuple[str, str]:
        return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex, \
            "chat.completion" if kind == "chat" else "text_completion"

    async def collect(ticket, gen: GenerationRequest, watch: DisconnectWatch):
        text, step, tokens, origins, sources, logprobs = await gather_steps(ticket, watch)
        response_id, obj = ids(gen.kind)
        if gen.kind == "chat" and gen.tools:
            message, reason = chat_message(text, step.finish_reason, gen.tools, gen.parallel_tool_calls)
            choice = {"index": 0, "message": message, "logprobs": response_logprobs(gen, logprobs),
                      "finish_reason": reason}
        elif gen.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": response_logprobs(gen, logprobs), "finish_reason": step.finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": response_logprobs(gen, logprobs),
                      "finish_reason": step.finish_reason}
        extension = {"tokens": tokens, "origins": origins, "sources": sources,
                     "stats": client_stats(step.final_stats.to_dict(), expose_timings)}
        if step.replica is not None:
            extension["replica"] = step.replica
        return {"id": response_id, "object": obj, "created": int(time.time()), "model": model_name,
                "choices": [choice], "usage": _usage(step.stats, expose_timings), "system_fingerprint": None,
                "specdecode": extension}

    async def stream_chunks(ticket, gen: GenerationRequest, index: int = 0, response_id: str | None = None,
                            usages: list | None = None):
        """The answer's server-sent events. For one choice of several (usages given): its chunks carry its index,
        its usage goes to `usages` at the end, and the joined stream (choices.py) sends the usage and [DONE]."""
        response_id = response_id or ids(gen.kind)[0]
        obj = "chat.completion.chunk" if gen.kind == "chat" else "text_completion"
        created_at = int(time.time())

        streamed = [0]  # characters of token text sent so far (the completions API's text offsets)

        def chunk(text: str | None, finish_reason=None, extra=None, role=False, delta=None, logprobs=()) -> dict:
            described = response_logprobs(gen, list(logprobs), streamed[0])
            streamed[0] += sum(len(entry["token"]) for entry in logprobs)
            if gen.kind == "chat":
                if delta is None:
                    delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
                choice = {"index": index, "delta": delta, "logprobs": described, "finish_reason": finish_reason}
            else:
                choice = {"index": index, "text": text or "", "logprobs": described, "finish_reason": finish_reason}
            payload = {"id": response_id, "object": obj, "created": created_at, "model": model_name,
                       "system_fingerprint": None, "choices": [choice]}
            if extra:
                payload.update(extra)
            return payload

        calls = ToolCallStream(gen.parallel_tool_calls, gen.tools) if gen.kind == "chat" and gen.tools else None
        if gen.kind == "chat":
            yield _sse(chunk(None, role=True))
        while True:
            message = await ticket.next()
            if message[0] == "error":  # after the headers went out: report in the stream, as OpenAI does
                yield _sse(message[1].body())
                break
            step: Step = message[1]
            if not (step.text or step.tokens or step.finished):
                continue
            extra = {"specdecode": {"tokens": step.tokens, "origins": step.origins, "sources": step.sources,
                                    "pieces": step.pieces, "stats": client_stats(step.stats, expose_timings)}}
            if step.replica is not None:
                extra["specdecode"]["replica"] = step.replica
            if step.finished and usages is None:
                extra["usage"] = _usage(step.stats, expose_timings)
            elif step.finished:
                usages.append(_usage(step.stats, expose_timings))
            if calls is not None:  # text outside calls as content, each call as tool_calls deltas
                deltas = calls.feed(step.text) + (calls.finish() if step.finished else [])
                reason = finish_reason(step.finish_reason, len(calls.completed)) if step.finished else None
                for delta in deltas[:-1]:
                    yield _sse(chunk(None, delta=delta))
                yield _sse(chunk(None, reason, extra, delta=deltas[-1] if deltas else {}, logprobs=step.logprobs))
            else:
                yield _sse(chunk(step.text if step.text or not step.finished else None,
                                 step.finish_reason if step.finished else None, extra, logprobs=step.logprobs))
            if step.finished:
                if gen.include_usage and usages is None:
                    usage_chunk = chunk(None)
                    usage_chunk["choices"] = []
                    usage_chunk["usage"] = _usage(step.stats, expose_timings)
                    yield _sse(usage_chunk)
                break
        if usages is None:
            yield "data: [DONE]\n\n"

    register_responses(app, ChatHost(model_name, check_api_key, read_body, namespace_of, run_generation, gather_steps))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    # ------------------------------------------------------------------ the rest
    @app.get("/v1/models")
    async def list_models(request: Request):
        check_api_key(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(request: Request, name: str):
        check_api_key(request)
        check_model(name)
        return model_card()

    @app.get("/health")
    async def health():
        state = await backend.health()
        body = {"status": state.pop("status"), "model": model_name, "drafters": backend.drafters,
                "default_drafter": backend.default_drafter, "max_context": backend.max_context,
                "auth": bool(api_keys), **state}
        # Draining, shutting down or no replica ready: 503, so that load balancers stop sending meanwhile.
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(await backend.metrics_text(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse)
    async def index():
        return HTMLResponse(playground)

    return app


def served_model_name(args) -> str:
    return os.path.basename(str(args.model).rstrip("/")) if os.path.exists(str(args.model)) else args.model


def api_keys_from_args(args) -> ApiKeys:
    """The keys the API accepts: --api-key (id "default"), the `id:key` lines of the --api-keys file and the
    entries of $SPECDECODE_API_KEYS."""
    keys = ApiKeys.of(getattr(args, "api_key", None))
    if getattr(args, "api_keys", None):
        keys = keys.merged(load_api_keys(args.api_keys))
    if os.environ.get("SPECDECODE_API_KEYS", "").strip():
        keys = keys.merged(parse_api_keys(os.environ["SPECDECODE_API_KEYS"], "$SPECDECODE_API_KEYS", commas=True))
    return keys


def exposure_options(args) -> set[str] | None:
    """The Host names to answer (None: any), after warning about a keyless server others can reach."""
    allowed_hosts = default_allowed_hosts(args.host)
    if args.allowed_hosts:
        allowed_hosts = (allowed_hosts or set()) | {h.strip() for h in args.allowed_hosts.split(",") if h.strip()} | {args.host}
    keys = api_keys_from_args(args)
    if args.host.strip("[]").lower() not in LOOPBACK and not keys:
        print(f"specdecode: warning: serving on {args.host} without an API key: anyone who can reach this address can"
              " use the model (set SPECDECODE_API_KEY or --api-key, or --api-keys FILE)", file=sys.stderr, flush=True)
    if len(keys.entries) > 1 and not getattr(args, "metrics_key", None):
        print("specdecode: warning: every API key can read /metrics, which sums up all tenants' requests"
              " (set --metrics-key to keep it for the operator)", file=sys.stderr, flush=True)
    return allowed_hosts


def uvicorn_config(app, *, host: str = "127.0.0.1", port: int = 8000, forwarded_allow_ips: str | None = None,
                   **options):
    """uvicorn's settings for this server. X-Forwarded-For names the client only when it comes from a proxy named
    in `forwarded_allow_ips` (--forwarded-allow-ips); uvicorn's default believes it from any local process, which
    could then claim any address and with it another client's namespace and queue lane."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, proxy_headers=bool(forwarded_allow_ips),
                          forwarded_allow_ips=forwarded_allow_ips or "", **options)


def _wants_cluster(args) -> bool:
    replicas = getattr(args, "replicas", None)
    if replicas is not None and replicas < 1:
        raise InputError(f"--replicas must be at least 1, got {replicas}")
    threads = getattr(args, "threads_per_replica", None)
    if threads is not None and threads < 1:
        raise InputError(f"--threads-per-replica must be at least 1, got {threads}")
    if (replicas or 1) == 1 and (getattr(args, "ray_address", None) or threads is not None):
        raise InputError("--ray-address and --threads-per-replica apply with --replicas 2 or more"
                         " (one replica is the one-process server; use --threads)")
    if (replicas or 1) > 1 and getattr(args, "threads", None):
        raise InputError("with --replicas, give each replica its threads with --threads-per-replica")
    return (replicas or 1) > 1


def run_server(args) -> int:
    """`specdecode serve`: load the engine as the flags say, serve until SIGINT / SIGTERM, exit 0 on SIGTERM.
    With --replicas N > 1 the engines run as replicas on a Ray cluster (cluster.py); Ray is imported only then."""
    if args.queue_size < 1:
        raise InputError(f"--queue-size must be at least 1, got {args.queue_size}")
    if getattr(args, "max_batch", 8) < 1:
        raise InputError(f"--max-batch must be at least 1, got {args.max_batch}")
    if _wants_cluster(args):
        try:
            from .cluster import run_cluster_server
        except ImportError as exc:
            raise InputError(f"--replicas needs Ray Serve ({exc}): pip install -e '.[cluster]'") from None
        return run_cluster_server(args)
    import uvicorn

    api_keys = api_keys_from_args(args)  # a bad key file fails before the model loads
    allowed_hosts = exposure_options(args)
    engine, drafter = build_engine(args)
    model_name = served_model_name(args)
    app = create_app(engine, drafter, model_name, api_key=api_keys, queue_size=args.queue_size, warmup=True,
                     allowed_hosts=allowed_hosts, cors_origins=args.cors_origin or [], max_batch=args.max_batch,
                     metrics_key=getattr(args, "metrics_key", None), expose_timings=getattr(args, "expose_timings", False))
    scheduler: Scheduler = app.state.scheduler

    grace = max(0.0, float(args.shutdown_grace))

    class Server(uvicorn.Server):
        """On SIGTERM/SIGINT: keep listening but answer new requests 503 + Retry-After, finish the running
        and queued generations, then stop; past `grace` seconds cut what still runs (finish_reason
        "length", queued requests get a 503 error) and stop. A second signal stops at once."""

        draining = False

        def handle_exit(self, sig, frame):
            if self.draining:
                scheduler.begin_shutdown_threadsafe()
                return super().handle_exit(sig, frame)
            self.draining = True
            scheduler.begin_drain()  # a flag the event loop reads: safe from the signal handler
            threading.Thread(target=self._exit_when_drained, args=(sig, frame), daemon=True).start()

        def _exit_when_drained(self, sig, frame):
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and not scheduler.idle():
                time.sleep(0.05)
            if not scheduler.idle():
                scheduler.begin_shutdown_threadsafe()  # the running generation ends at its next step
                while time.monotonic() < deadline + 10 and not scheduler.idle():
                    time.sleep(0.05)
            super().handle_exit(sig, frame)  # uvicorn then lets open responses finish sending

    config = uvicorn_config(app, host=args.host, port=args.port, forwarded_allow_ips=getattr(args, "forwarded_allow_ips", None),
                            log_level="info", timeout_graceful_shutdown=15)
    server = Server(config)
    # uvicorn re-raises the caught signal after its graceful shutdown; for SIGTERM that would end the
    # process with status -15. This handler (restored by uvicorn before re-raising) swallows it: exit 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    print(f"specdecode: serving {model_name} (default drafter: {drafter}) on http://{args.host}:{args.port}/"
          f" (playground), API under /v1{', API key required' if api_keys else ''}", flush=True)
    server.run()
    return 0
