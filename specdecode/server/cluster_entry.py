"""The entry-point side of `serve --replicas`: app.py's routes over a backend that streams each request from
whichever engine replica Ray routes it to, admits at most (queue size + 1) requests per ready replica (429
beyond), and sends a request again when its replica dies before starting it.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ray.exceptions import RayActorError

from .cluster_replica import error_from
from .metrics import ServerMetrics, merge_replica_metrics
from .protocol import ApiError, GenerationRequest
from .routing import PrefixRouter
from .scheduler import RETRY_AFTER_SECONDS

if TYPE_CHECKING:
    from .cluster_settings import ClusterSettings

RESEND_ATTEMPTS = 5  # a request whose replica died before starting it goes to another one
ENTRY_FAMILIES = {"specdecode_requests", "specdecode_errors", "specdecode_model_info"}  # counted at the entry point


class ClusterTicket:
    """One request's events from whichever replica runs it (see local.py for the interface)."""

    def __init__(self, backend: "ClusterBackend", request: GenerationRequest, user_key: str, namespace: str):
        self.backend = backend
        self.request = request
        self.user_key = user_key
        self.namespace = namespace
        self.chain = backend.router.chain(request.prompt, namespace)  # one client's prefixes never match another's
        self.stream = None
        self.started = False
        self.done = False
        self.attempts = 0

    def _call(self):
        return self.backend.engines.options(stream=True).generate.remote(self.request, self.user_key, self.namespace,
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
                try:  # an unreachable (not dead) replica would otherwise generate on for nobody
                    self.stream.cancel()
                except Exception:
                    pass
                return self._end(("error", ApiError(
                    502 if self.started else 503, "the replica running this request stopped; send it again",
                    code="replica_failed", headers={"Retry-After": "1"})))
            if kind == "start":
                self.started = True
                return "start", payload
            if kind == "error":
                return self._end(("error", error_from(payload)))
            if payload.finished:
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
        self.max_batch = settings.max_batch  # per replica: the most choices (n) one request may ask
        self.router = PrefixRouter(**settings.routing)  # only to cut prompts into blocks; Ray's router decides
        self.in_flight = 0
        self.resent = 0  # requests sent again because their replica died before starting them
        self.shutting_down = False
        self._board_cache: tuple[float, dict] = (0.0, {})

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.shutting_down = True

    async def replicas(self, max_age_s: float = 0.5) -> dict[str, dict]:
        read_at, entries = self._board_cache
        if time.monotonic() - read_at > max_age_s:
            entries = await self.board.read.remote()
            self._board_cache = (time.monotonic(), entries)
        return entries

    async def submit(self, request: GenerationRequest, user_key: str, namespace: str = "") -> ClusterTicket:
        if self.shutting_down:
            raise ApiError(503, "the server is shutting down", code="shutting_down", headers={"Retry-After": "5"})
        ready = sum(e["ready"] for e in (await self.replicas()).values())
        capacity = max(1, ready) * (self.settings.queue_size + self.settings.max_batch)
        if self.in_flight >= capacity:  # no count in the answer: the others' load is not this client's business
            raise ApiError(429, "the server is busy; retry later", type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        self.in_flight += 1
        return ClusterTicket(self, request, user_key, namespace)

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
                               allowed_hosts=s.allowed_hosts, cors_origins=s.cors_origins, metrics_key=s.metrics_key,
                               expose_timings=s.expose_timings)

