"""The generation backend of one process: one engine, its Scheduler (bounded fair queue, one worker thread).

The HTTP layer (app.py) talks to a backend through a small interface, so the same routes, errors and
streaming serve one engine here or many replicas on a Ray cluster (cluster.py):

    backend.drafters, backend.default_drafter, backend.max_context
    backend.max_batch                                      # the most choices (n) one request may ask
    await backend.start() / await backend.stop()          # the app's lifespan
    ticket = await backend.submit(request, user_key, namespace)  # raises ApiError: 400, 429 (queue full), 503
    await ticket.next()   # ("start", prompt_tokens) | ("step", Step) | ("error", ApiError); a Step ends with finished
    ticket.cancel(reason)                                  # no-op once the generation finished
    await backend.health() -> dict, await backend.metrics_text(http_metrics) -> bytes
"""
from __future__ import annotations

import asyncio

from ..drafters.registry import available_drafters
from .metrics import ServerMetrics
from .protocol import GenerationRequest
from .scheduler import Job, Scheduler

class LocalTicket:
    def __init__(self, scheduler: Scheduler, job: Job):
        self.scheduler = scheduler
        self.job = job

    def next(self):
        return self.job.events.get()

    def cancel(self, reason: str) -> None:
        self.scheduler.cancel(self.job, reason)


class LocalBackend:
    def __init__(self, scheduler: Scheduler, warmup: bool = False):
        self.scheduler = scheduler
        self.warmup = warmup
        self.drafters = available_drafters(scheduler.engine.draft is not None)
        self.default_drafter = scheduler.default_drafter
        self.max_context = scheduler.engine.max_context
        self.max_batch = scheduler.max_batch
        self._worker: asyncio.Task | None = None

    @property
    def shutting_down(self) -> bool:
        return self.scheduler.shutting_down

    async def start(self) -> None:
        self._worker = asyncio.create_task(self.scheduler.run(), name="specdecode-worker")
        if self.warmup:
            await self.scheduler.warmup()

    async def stop(self) -> None:
        self.scheduler.begin_shutdown()
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self.scheduler.close()

    async def submit(self, request: GenerationRequest, user_key: str, namespace: str = "") -> LocalTicket:
        """user_key: whose lane of the fair queue; namespace: whose earlier text drafts may copy (suffix store)."""
        job = Job(request, user_key=user_key, namespace=namespace)
        self.scheduler.reserve(user_key)  # 429 / 503 before tokenizing: a full queue must cost no CPU per refused request
        try:
            job.prompt_ids, job.grammar = await self.scheduler.tokenize(request)
        except BaseException:  # a 400 from the tokenizer, or the handler cancelled
            self.scheduler.release(user_key)
            raise
        self.scheduler.submit(job, reserved=True)
        return LocalTicket(self.scheduler, job)

    async def health(self) -> dict:
        return {"status": self.scheduler.state, **self.scheduler.status()}

    async def metrics_text(self, http_metrics: ServerMetrics) -> bytes:
        return http_metrics.render()
