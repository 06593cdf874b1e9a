"""The engine side of `serve --replicas`: an engine replica, the board replicas post their state to, and the
Ray Serve request router that sends each request to the replica holding its prompt's prefix (routing.py decides).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

from ray import serve
from ray.serve.request_router import RequestRouter

from .metrics import ServerMetrics
from .protocol import ApiError, GenerationRequest
from .routing import PrefixRouter

if TYPE_CHECKING:
    from .cluster_settings import ClusterSettings

log = logging.getLogger("specdecode.server")

REPORT_PERIOD_S = 1.0  # how often a replica posts its state to the board
STALE_AFTER_S = 3.0  # a replica silent this long is not counted as ready (dead, or stuck)


def error_fields(exc: ApiError) -> dict:
    """An ApiError as plain data: exceptions with keyword-only fields do not survive pickling."""
    return {"status": exc.status, "message": exc.message, "param": exc.param, "code": exc.code, "type": exc.type,
            "headers": exc.headers}


def error_from(fields: dict) -> ApiError:
    return ApiError(fields["status"], fields["message"], param=fields["param"], code=fields["code"],
                    type=fields["type"], headers=fields["headers"])


def _load_engine(options: dict):
    from ..build import EngineOptions, build_engine

    return build_engine(EngineOptions(**options))



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
        from ..build import freeze_loaded_objects
        from .scheduler import Scheduler

        self.replica = serve.get_replica_context().replica_id.unique_id
        self.board = board
        engine, drafter = _load_engine({**settings.engine_options, "threads": settings.threads_per_replica})
        self.metrics = ServerMetrics(settings.model_name)
        self.backend = LocalBackend(Scheduler(engine, drafter, settings.queue_size, self.metrics,
                                                max_batch=settings.max_batch), warmup=True)
        await self.backend.start()  # measures the drafters' costs before Ray routes anything here
        freeze_loaded_objects()
        self.reporter = asyncio.create_task(self._report_forever())

    def info(self) -> dict:
        backend = self.backend
        return {"drafters": backend.drafters, "default_drafter": backend.default_drafter, "max_context": backend.max_context}

    async def generate(self, request: GenerationRequest, user_key: str, namespace: str = "", prefix_chain=None):
        """("start", replica) | ("step", Step) | ("error", fields). prefix_chain is for the router, unused here."""
        try:
            ticket = await self.backend.submit(request, user_key, namespace)
        except ApiError as exc:
            yield "error", error_fields(exc)
            return
        try:
            while True:
                kind, payload = await ticket.next()
                if kind == "start":
                    yield "start", self.replica
                elif kind == "error":
                    yield "error", error_fields(payload)
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
        try:
            await self.board.leave.remote(self.replica)
        except Exception:  # the board may be going down too: it forgets silent replicas anyway
            pass


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

