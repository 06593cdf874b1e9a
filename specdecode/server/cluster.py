"""`specdecode serve --replicas N`: N engine replicas on a Ray cluster behind one OpenAI-compatible entry point.

    HTTP ─► Ray Serve proxy ─► EntryPoint (app.py's routes over a ClusterBackend)
                                   │ DeploymentHandle, streamed, routed by PrefixAffinityRouter
                                   ▼
                 EngineReplica × N (each: its own engine, caches, threads, Scheduler with a bounded queue)
                                   │ every second: status + Prometheus page
                                   ▼
                 ReplicaBoard (what /health and /metrics of the entry point read)

Ray Serve places the replicas on the cluster's nodes, restarts one that dies and streams the events.
The entry point keeps what the one-process server does (parsing, exposure checks, errors, SSE) by running
the same app; only the backend differs. Routing keeps a conversation on the replica that holds its prefix
(routing.py); the entry point admits at most (queue size + 1) requests per ready replica and answers 429
beyond, and a request whose replica dies before its generation started is sent again.

Imported only in cluster mode: the one-process server never imports Ray.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.request_router import RequestRouter

from .metrics import ServerMetrics, merge_replica_metrics
from .protocol import ApiError, GenerationRequest
from .routing import PrefixRouter

log = logging.getLogger("specdecode.server")

APP_NAME = "specdecode"
REPORT_PERIOD_S = 1.0  # how often a replica posts its state to the board
STALE_AFTER_S = 3.0  # a replica silent this long is not counted as ready (dead, or stuck)
RESEND_ATTEMPTS = 5  # a request whose replica died before starting it goes to another one
ENTRY_FAMILIES = {"specdecode_requests", "specdecode_errors", "specdecode_model_info"}  # counted at the entry point


@dataclass
class ClusterSettings:
    engine_options: dict  # the `serve` flags build_engine reads (model, draft, precision, ctx, threads, ...)
    model_name: str
    replicas: int = 2
    threads_per_replica: int = 1
    queue_size: int = 16
    api_key: str | None = None
    allowed_hosts: set[str] | None = None
    cors_origins: list[str] = field(default_factory=list)
    shutdown_grace_s: float = 30.0
    routing: dict = field(default_factory=dict)  # PrefixRouter's knobs: block_chars, min_prefix_chars, max_imbalance


def _error_fields(exc: ApiError) -> dict:
    """An ApiError as plain data: exceptions with keyword-only fields do not survive pickling."""
    return {"status": exc.status, "message": exc.message, "param": exc.param, "code": exc.code, "type": exc.type,
            "headers": exc.headers}


def _error_from(fields: dict) -> ApiError:
    return ApiError(fields["status"], fields["message"], param=fields["param"], code=fields["code"],
                    type=fields["type"], headers=fields["headers"])


def _load_engine(options: dict):
    from ..cli import build_engine  # the one place this module builds an engine

    return build_engine(argparse.Namespace(**options))


# ---------------------------------------------------------------------------------------------- deployments
class ReplicaBoard:
    """Where replicas post their state; the entry point reads it for /health and /metrics."""

    def __init__(self):
        self.entries: dict[str, dict] = {}

    def post(self, replica: str, entry: dict) -> None:
        self.entries[replica] = {**entry, "seen": time.monotonic()}

    def leave(self, replica: str) -> None:
        self.entries.pop(replica, None)

    def read(self) -> dict[str, dict]:
        now = time.monotonic()
        for replica in [r for r, e in self.entries.items() if now - e["seen"] > STALE_AFTER_S * 10]:
            del self.entries[replica]  # long gone: forget; recently silent ones are reported as not ready
        return {r: {**e, "ready": e["ready"] and now - e["seen"] <= STALE_AFTER_S} for r, e in self.entries.items()}


class EngineReplica:
    """One engine with its Scheduler, as the one-process server runs it; streams the Scheduler's events."""

    async def __init__(self, settings: ClusterSettings, board):
        from .local import LocalBackend
        from .scheduler import Scheduler

        self.replica = serve.get_replica_context().replica_id.unique_id
        self.board = board
        engine, drafter = _load_engine({**settings.engine_options, "threads": settings.threads_per_replica})
        self.metrics = ServerMetrics(settings.model_name)
        self.backend = LocalBackend(Scheduler(engine, drafter, settings.queue_size, self.metrics), warmup=True)
        await self.backend.start()  # measures the drafters' costs before Ray routes anything here
        self.reporter = asyncio.create_task(self._report_forever())

    def info(self) -> dict:
        backend = self.backend
        return {"drafters": backend.drafters, "default_drafter": backend.default_drafter, "max_context": backend.max_context}

    async def generate(self, request: GenerationRequest, user_key: str, prefix_chain=None):
        """("start", replica) | ("step", Step) | ("error", fields). prefix_chain is for the router, unused here."""
        try:
            ticket = await self.backend.submit(request, user_key)
        except ApiError as exc:
            yield "error", _error_fields(exc)
            return
        try:
            while True:
                kind, payload = await ticket.next()
                if kind == "start":
                    yield "start", self.replica
                elif kind == "error":
                    yield "error", _error_fields(payload)
                    return
                else:
                    payload.replica = self.replica
                    yield "step", payload
                    if payload.finished:
                        return
        finally:  # the entry point cancelled (its client left) or the stream ended: free the engine
            ticket.cancel("client_disconnected")

    async def _report_forever(self) -> None:
        while True:
            try:
                status = await self.backend.health()
                await self.board.post.remote(self.replica, {
                    "ready": status.pop("status") == "ok", "status": status, "metrics": self.metrics.render(),
                    "pid": os.getpid()})
            except Exception:  # the board restarting: try again next period
                log.warning("replica %s could not post its state", self.replica, exc_info=True)
            await asyncio.sleep(REPORT_PERIOD_S)

    async def __del__(self):
        self.reporter.cancel()
        await self.backend.stop()


class PrefixAffinityRouter(RequestRouter):
    """Ray Serve's request router for EngineReplica: the replica routing.PrefixRouter picks comes first, the
    others (least loaded first, by Ray's count of requests on each) after it, should it be full."""

    def initialize_state(self, **knobs):
        self.table = PrefixRouter(**knobs)

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if pending_request is None or not candidate_replicas:
            return [candidate_replicas]
        loads = {r.replica_id.unique_id: self.replica_queue_len_cache.get(r.replica_id) or 0 for r in candidate_replicas}
        route = self.table.choose(pending_request.kwargs.get("prefix_chain") or [], loads)
        first = [r for r in candidate_replicas if r.replica_id.unique_id == route.replica]
        rest = sorted((r for r in candidate_replicas if r.replica_id.unique_id != route.replica),
                      key=lambda r: loads[r.replica_id.unique_id])
        return [first, rest] if rest else [first]

    def on_request_routed(self, pending_request, replica_id, result):
        self.table.record(pending_request.kwargs.get("prefix_chain") or [], replica_id.unique_id)

    def update_replicas(self, replicas):
        super().update_replicas(replicas)
        self.table.keep_only({r.replica_id.unique_id for r in replicas})


# ---------------------------------------------------------------------------------------------- entry point
class ClusterTicket:
    """One request's events from whichever replica runs it (see local.py for the interface)."""

    def __init__(self, backend: "ClusterBackend", request: GenerationRequest, user_key: str):
        self.backend = backend
        self.request = request
        self.user_key = user_key
        self.chain = backend.router.chain(request.prompt)
        self.stream = None
        self.started = False
        self.done = False
        self.attempts = 0
        self.born = time.monotonic()

    def _call(self):
        return self.backend.engines.options(stream=True).generate.remote(self.request, self.user_key,
                                                                         prefix_chain=self.chain)

    async def next(self):
        while True:
            if self.stream is None:
                self.stream = self._call()
            try:
                kind, payload = await self.stream.__anext__()
            except StopAsyncIteration:
                return self._end(("error", ApiError(502, "the replica ended the generation without a final step",
                                                    code="replica_failed")))
            except RayActorError:  # the replica died or cannot be reached
                if not self.started and self.attempts < RESEND_ATTEMPTS:
                    self.attempts += 1
                    self.backend.resent += 1
                    self.stream = None
                    await asyncio.sleep(0.2 * self.attempts)  # Ray's router learns of the death meanwhile
                    continue
                return self._end(("error", ApiError(
                    502 if self.started else 503, "the replica running this request stopped; send it again",
                    code="replica_failed", headers={"Retry-After": "1"})))
            if kind == "start":
                self.started = True
                return "start", payload
            if kind == "error":
                return self._end(("error", _error_from(payload)))
            if payload.finished:
                self.backend.record_service_time(time.monotonic() - self.born)
                return self._end(("step", payload))
            return "step", payload

    def _end(self, message):
        if not self.done:
            self.done = True
            self.backend.in_flight -= 1
        return message

    def cancel(self, reason: str) -> None:
        if not self.done:
            if self.stream is not None:
                self.stream.cancel()  # Ray cancels the replica's generator, which cancels its job
            self._end(None)


class ClusterBackend:
    def __init__(self, engines, board, settings: ClusterSettings, info: dict):
        self.engines = engines
        self.board = board
        self.settings = settings
        self.drafters = info["drafters"]
        self.default_drafter = info["default_drafter"]
        self.max_context = info["max_context"]
        self.router = PrefixRouter(**settings.routing)  # only to cut prompts into blocks; Ray's router decides
        self.in_flight = 0
        self.resent = 0  # requests sent again because their replica died before starting them
        self.shutting_down = False
        self._service_time = 2.0
        self._board_cache: tuple[float, dict] = (0.0, {})

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.shutting_down = True

    def record_service_time(self, seconds: float) -> None:
        self._service_time = 0.8 * self._service_time + 0.2 * seconds

    async def replicas(self, max_age_s: float = 0.5) -> dict[str, dict]:
        read_at, entries = self._board_cache
        if time.monotonic() - read_at > max_age_s:
            entries = await self.board.read.remote()
            self._board_cache = (time.monotonic(), entries)
        return entries

    async def submit(self, request: GenerationRequest, user_key: str) -> ClusterTicket:
        if self.shutting_down:
            raise ApiError(503, "the server is shutting down", code="shutting_down", headers={"Retry-After": "5"})
        ready = sum(e["ready"] for e in (await self.replicas()).values())
        capacity = max(1, ready) * (self.settings.queue_size + 1)
        if self.in_flight >= capacity:
            waiting = self.in_flight / max(1, ready)
            retry = max(1, min(120, math.ceil(waiting * self._service_time)))
            raise ApiError(429, f"the server is busy: all {max(1, ready)} replicas have full queues; retry later",
                           type="rate_limit_error", code="queue_full", headers={"Retry-After": str(retry)})
        self.in_flight += 1
        return ClusterTicket(self, request, user_key)

    async def health(self) -> dict:
        entries = await self.replicas(max_age_s=0)
        ready = [r for r, e in entries.items() if e["ready"]]
        totals = {key: sum(e["status"].get(key, 0) for e in entries.values() if e["ready"])
                  for key in ("queue_depth", "queue_size", "running", "completed")}
        status = "shutting_down" if self.shutting_down else ("ok" if ready else "unavailable")
        return {"status": status, "replicas": self.settings.replicas, "replicas_ready": len(ready),
                "in_flight": self.in_flight, **totals,
                "replica_states": {r: {"ready": e["ready"], **e["status"]} for r, e in sorted(entries.items())}}

    async def metrics_text(self, http_metrics: ServerMetrics) -> bytes:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        entries = await self.replicas(max_age_s=0)
        ready = GaugeMetricFamily("specdecode_replicas_ready", "Engine replicas ready to serve",
                                  value=sum(e["ready"] for e in entries.values()))
        in_flight = GaugeMetricFamily("specdecode_entry_in_flight", "Requests the entry point has sent to replicas",
                                      value=self.in_flight)
        resent = CounterMetricFamily("specdecode_resent", "Requests sent to another replica after theirs died before"
                                     " starting them", value=self.resent)
        return merge_replica_metrics(http_metrics.render(), ENTRY_FAMILIES,
                                     {r: e["metrics"] for r, e in entries.items()}, [ready, in_flight, resent])


class EntryPoint:
    """The HTTP entry point: app.py's routes over a ClusterBackend (built in the replica, see serve.ingress)."""

    async def __init__(self, engines, board, settings: ClusterSettings):
        info = await engines.info.remote()  # drafters and context, as a loaded engine knows them
        self.backend = ClusterBackend(engines, board, settings, info)
        self.settings = settings

    def __serve_build_asgi_app__(self):
        from .app import create_http_app

        s = self.settings
        return create_http_app(self.backend, s.model_name, ServerMetrics(s.model_name), api_key=s.api_key,
                               allowed_hosts=s.allowed_hosts, cors_origins=s.cors_origins)


# ---------------------------------------------------------------------------------------------- deploying
def build_application(settings: ClusterSettings):
    """The Serve application: the board, N engine replicas with the prefix-aware router, the entry point."""
    from ray.serve.config import RequestRouterConfig

    board = serve.deployment(ReplicaBoard, name="ReplicaBoard", num_replicas=1, max_ongoing_requests=1000,
                             ray_actor_options={"num_cpus": 0}).bind()
    engines = serve.deployment(
        EngineReplica, name="EngineReplica", num_replicas=settings.replicas,
        ray_actor_options={"num_cpus": settings.threads_per_replica},
        # Ray sends a replica no more than its Scheduler holds (one running, queue_size waiting) ...
        max_ongoing_requests=settings.queue_size + 1,
        graceful_shutdown_timeout_s=settings.shutdown_grace_s,
        request_router_config=RequestRouterConfig(request_router_class=PrefixAffinityRouter,
                                                  request_router_kwargs=dict(settings.routing)),
    ).bind(settings, board)
    entry = serve.deployment(serve.ingress()(EntryPoint), name="EntryPoint", num_replicas=1,
                             max_ongoing_requests=10_000,  # ... and the entry point admits (429) for all of them
                             ray_actor_options={"num_cpus": 0}).bind(engines, board, settings)
    return entry


def deploy(settings: ClusterSettings, host: str, port: int) -> None:
    """Start Serve's HTTP proxy on host:port and the application; returns once every replica is ready."""
    from ray.serve.schema import LoggingConfig

    quiet = LoggingConfig(log_level="WARNING", enable_access_log=False)  # a line per request and board post otherwise
    serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly", logging_config=quiet)
    serve.run(build_application(settings), name=APP_NAME, route_prefix="/", blocking=False, logging_config=quiet)


def settings_from_args(args, model_name: str, allowed_hosts) -> ClusterSettings:
    options = {k: v for k, v in vars(args).items() if k in ENGINE_FLAGS}
    threads = args.threads_per_replica or max(1, (os.cpu_count() or 1) // args.replicas)
    return ClusterSettings(options, model_name, replicas=args.replicas, threads_per_replica=threads,
                           queue_size=args.queue_size, api_key=args.api_key, allowed_hosts=allowed_hosts,
                           cors_origins=list(args.cors_origin or []), shutdown_grace_s=float(args.shutdown_grace))


ENGINE_FLAGS = {"model", "draft", "draft_dtype", "precision", "device", "ctx", "threads"}


def run_cluster_server(args) -> int:
    """Join (--ray-address) or start a Ray instance, deploy, serve until SIGINT / SIGTERM, then take the application
    down (replicas finish their requests within --shutdown-grace) and exit 0. A joined cluster keeps running."""
    import ray

    from .app import exposure_options, served_model_name

    settings = settings_from_args(args, served_model_name(args), exposure_options(args))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.ray_address:
        ray.init(address=args.ray_address, logging_level=logging.WARNING)
    else:
        cores = os.cpu_count() or 1
        wanted = settings.replicas * settings.threads_per_replica
        if wanted > cores:
            print(f"specdecode: warning: {settings.replicas} replicas x {settings.threads_per_replica} threads on"
                  f" {cores} cores: they will compete for them", file=sys.stderr, flush=True)
        ray.init(num_cpus=wanted, include_dashboard=False, object_store_memory=100 * 1024**2,
                 logging_level=logging.WARNING)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        print(f"specdecode: starting {settings.replicas} replicas of {settings.model_name} on Ray"
              f" ({settings.threads_per_replica} threads each)", flush=True)
        deploy(settings, args.host, args.port)
        print(f"specdecode: serving {settings.model_name} with {settings.replicas} replicas on"
              f" http://{args.host}:{args.port}/ (playground), API under /v1"
              f"{', API key required' if args.api_key else ''}", flush=True)
        while not stop.wait(0.5):
            pass
        print("specdecode: shutting down (finishing running requests)", flush=True)
        if args.ray_address:
            serve.delete(APP_NAME)  # other Serve applications on a shared cluster keep running
        else:
            serve.shutdown()
    finally:
        ray.shutdown()
    return 0
