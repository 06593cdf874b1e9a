"""One engine, many clients: a bounded fair queue and the single worker that owns the engine.

The engine runs up to `max_batch` generations at once (batch.BatchEngine: one target pass for all of them,
each request's tokens those it gets alone) and is not thread-safe, so every call into it runs on one
dedicated thread, one pass per call; the event loop stays free between passes to accept, queue, stream
and cancel requests. Requests join the batch between passes as slots free up. Clients take turns by
lane (http_parts.queue_lane: the API key's id and the peer address, never a field the request chooses; an IPv6
address counts as its /64, client_lane): each lane's requests run in arrival order, and lanes are served
round-robin, so one client flooding the queue cannot starve another, and the last quarter of the places is kept for
lanes that hold none (reserve), so clients flooding it cannot shut another one out.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from ..batch import BatchEngine, Ticket
from ..drafters.registry import available_drafters
from ..errors import ChatTemplateError, InputError, SpecDecodeError, ToolsUnsupported
from ..grammar import CheckedGrammar, check_grammar
from ..sampling import SamplingParams
from .metrics import ServerMetrics
from .logprobs import describe
from .protocol import ApiError, GenerationRequest
from .tools import compulsory_call, forces_call

log = logging.getLogger("specdecode.server")

# Seconds a refused client is told to wait (the 429's Retry-After), the same for every refusal.
RETRY_AFTER_SECONDS = 2


class QueueFull(Exception):
    pass


def engine_error(exc: Exception) -> ApiError:
    """A request's own failure in the engine as its client reads it: an input error's words and the field it names
    (InputError.param), a 400; anything else a 500."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, SpecDecodeError):
        return ApiError(400, str(exc), param=getattr(exc, "param", None), code="invalid_request")
    return ApiError(500, str(exc), code="generation_failed")


class Encoded(NamedTuple):
    """A request made ready off the engine thread (Scheduler.tokenize): its prompt's ids and its grammar compiled."""
    prompt_ids: list[int]
    grammar: CheckedGrammar | None


def peer_group(address: str) -> str:
    """The peers taken for one client: an IPv6 address stands for its /64 (the block one host or subscriber is
    handed, its 2^64 addresses the client's to pick from), an IPv4 address (IPv4-mapped too) for itself. Anything
    else (a /64 already, "?") as it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 4:
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))  # (drops a zone id: fe80::1%eth0)


def client_lane(lane: str) -> str:
    """The fair queue's lane of an http_parts.queue_lane lane (JSON [key id, peer address]): its address grouped
    by peer_group, so that a client's many IPv6 addresses are one lane. Other lanes (tests' names) as they are."""
    try:
        parts = json.loads(lane)
    except ValueError:
        return lane
    if not (isinstance(parts, list) and len(parts) == 2 and all(isinstance(part, str) for part in parts)):
        return lane
    return json.dumps([parts[0], peer_group(parts[1])])


@dataclass(eq=False)
class Job:
    request: GenerationRequest
    user_key: str
    arrived: float = field(default_factory=time.perf_counter)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    state: str = "queued"  # queued | running | done
    cancel_reason: str | None = None
    prompt_ids: list[int] | None = None  # tokenized before queueing (Scheduler.tokenize); else on the engine thread
    grammar: CheckedGrammar | None = None  # request.grammar compiled with the tokenizing: it travels with the job
    ticket: Ticket | None = None  # its place in the batch, once admitted
    started: float = 0.0
    last_token_at: float | None = None
    # Whose text this is: drafters that remember earlier requests (suffix) propose only within one namespace.
    namespace: str = ""

    def cancel(self, reason: str) -> bool:
        """Ask the generation to stop at its next step. False when it had already finished."""
        if self.state == "done" or self.cancel_reason is not None:
            return False
        self.cancel_reason = reason
        return True


class FairQueue:
    """Bounded queue of jobs, one FIFO lane per client (Job.user_key), lanes served round-robin. Event-loop only."""

    def __init__(self, maxsize: int):
        if maxsize < 1:
            raise ValueError("queue size must be at least 1")
        self.maxsize = maxsize
        self._lanes: OrderedDict[str, deque[Job]] = OrderedDict()
        self._size = 0
        self._waiter: asyncio.Future | None = None

    def __len__(self) -> int:
        return self._size

    def put_nowait(self, job: Job) -> None:
        if self._size >= self.maxsize:
            raise QueueFull
        self._lanes.setdefault(job.user_key, deque()).append(job)
        self._size += 1
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def get_nowait(self) -> Job | None:
        if not self._size:
            return None
        user, lane = next(iter(self._lanes.items()))
        job = lane.popleft()
        if lane:
            self._lanes.move_to_end(user)  # this user had a turn; the others go first
        else:
            del self._lanes[user]
        self._size -= 1
        return job

    async def get(self) -> Job:
        await self.wait()
        return self.get_nowait()

    async def wait(self) -> None:
        """Until a job is queued."""
        while not self._size:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    def waiting(self, user: str) -> int:
        """Jobs of this client's lane in the queue."""
        return len(self._lanes.get(user, ()))

    def remove(self, job: Job) -> bool:
        lane = self._lanes.get(job.user_key)
        if lane is None or job not in lane:
            return False
        lane.remove(job)
        if not lane:
            del self._lanes[job.user_key]
        self._size -= 1
        return True

    def drain(self) -> list[Job]:
        jobs = [job for lane in self._lanes.values() for job in lane]
        self._lanes.clear()
        self._size = 0
        return jobs


@dataclass
class Step:
    """One engine step, as handed from the worker to the response writer."""

    text: str
    tokens: list[int]
    origins: list[str]
    pieces: list[str]
    stats: dict  # a snapshot: the engine's stats object keeps changing after the step
    finished: bool
    finish_reason: str | None
    final_stats: object = None  # the engine's GenerationStats, on the last step only
    replica: str | None = None  # which engine replica ran it (a cluster's entry point fills it in)
    sources: list[str] = field(default_factory=list)  # per token: the source of an accepted draft token, else ""
    logprobs: list = field(default_factory=list)  # per token, its entry in chat's logprobs shape (logprobs.py)


class Scheduler:
    def __init__(self, engine, default_drafter: str, queue_size: int, metrics: ServerMetrics,
                 default_max_tokens: int = 256, max_k: int | None = None, max_batch: int = 8):
        self.engine = engine
        self.batch = BatchEngine(engine, max_batch=max_batch, launch_ahead=engine.launch_ahead)
        # Grammars being compiled, by the spec object: a request's n choices share its spec and wait for one compile
        # instead of each compiling (seconds of CPU for a large schema, n times over). Only while compiling: nothing
        # here outlives it, and another request's equal spec is another object, compiled apart.
        self._compiling: dict[int, tuple[object, Future]] = {}
        self._compiling_lock = threading.Lock()
        self.max_batch = max_batch
        self.default_drafter = default_drafter
        self.queue_size = queue_size
        self.queue = FairQueue(queue_size + max_batch)
        self.metrics = metrics
        self.default_max_tokens = default_max_tokens
        self.max_k = max_k
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdecode-engine")
        self.running: list[Job] = []
        self.reserved = 0  # places held for requests being tokenized (reserve), counted against the queue's bound
        self._reserved_by: Counter[str] = Counter()  # the same, per lane
        self.shutting_down = False  # refusing new work: draining (finishing what it has) or shutting down
        self.draining = False
        self._shut_down = False  # begin_shutdown ran
        self._halt = False  # read by the engine thread between steps: stop whatever is running
        # Held while a job moves from the queue to `running`, so that idle() (the drain's thread) never sees it
        # in neither place. Never taken by anything a signal handler calls.
        self._moving = threading.Lock()
        self.completed = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ called by request handlers
    def reserve(self, lane: str = "") -> None:
        """Hold a place in the queue for a request of this lane (Job.user_key) about to be tokenized, or refuse it
        (503 shutting down, 429 full) before any work on its prompt: the queue's bound then bounds the tokenizing
        too. Hand the place to `submit` (reserved=True) or give it back with `release`."""
        if self.shutting_down:
            raise ApiError(503, "the server is shutting down", code="shutting_down", headers={"Retry-After": "5"})
        lane = client_lane(lane)
        # The batch's free places count as room too: a burst arriving between two passes waits for them here.
        room = self.queue_size + max(0, self.max_batch - len(self.running))
        # The last quarter of the room is kept for lanes that hold no place: however many places any number of
        # lanes take (two addresses, two keys), another client's first request finds one. A per-lane cap did not:
        # two lanes of three quarters each took every place (review turn5 #2).
        mine = self.queue.waiting(lane) + self._reserved_by[lane]
        limit = room if not mine else room - max(1, room // 4)
        if len(self.queue) + self.reserved >= limit:
            raise self._busy()
        self.reserved += 1
        self._reserved_by[lane] += 1

    def release(self, lane: str = "") -> None:
        """Give back a place `reserve` held (the request was refused or withdrawn while it was tokenized)."""
        lane = client_lane(lane)
        self.reserved -= 1
        self._reserved_by[lane] -= 1
        if not self._reserved_by[lane]:
            del self._reserved_by[lane]

    def submit(self, job: Job, reserved: bool = False) -> None:
        """Queue a job, in the place `reserve` held for it (reserved=True) or in one taken now."""
        job.user_key = client_lane(job.user_key)  # the lane `reserve` counted it in
        if not reserved:
            self.reserve(job.user_key)
        self.release(job.user_key)  # the place reserved becomes the queued job's
        if self._halt:  # shut down while it was tokenized
            raise ApiError(503, "the server is shutting down", code="shutting_down", headers={"Retry-After": "5"})
        try:
            self.queue.put_nowait(job)
        except QueueFull:  # not with a reservation: reserved places and queued jobs stay within the queue's bound
            raise self._busy() from None
        self.metrics.queue_depth.set(len(self.queue))

    def _busy(self) -> ApiError:
        # No count in the words: how many wait is other clients' business (Retry-After stays, bounded, for backoff).
        return ApiError(429, "the server is busy; retry later",
                        type="rate_limit_error", code="queue_full", headers={"Retry-After": str(self.retry_after())})

    def cancel(self, job: Job, reason: str) -> None:
        """Stop a job: drop it from the queue, or make its generation stop at the next step."""
        if not job.cancel(reason):
            return
        self.metrics.cancelled.labels(reason).inc()
        if self.queue.remove(job):
            job.state = "done"
            self.metrics.queue_depth.set(len(self.queue))

    def retry_after(self) -> int:
        """A constant: derived from how many wait or how long generations take, it would tell one client what the
        others are doing (review turn4 #8)."""
        return RETRY_AFTER_SECONDS

    def status(self) -> dict:
        return {"queue_depth": len(self.queue), "queue_size": self.queue_size, "running": len(self.running),
                "max_batch": self.max_batch, "completed": self.completed, "tokenizing": self.reserved}

    # ------------------------------------------------------------------ lifecycle
    async def warmup(self) -> None:
        """Measure the costs the adaptive K needs for every drafter this server offers, before it reports
        ready, so no request pays for them (the first request would otherwise wait for the timing passes)."""
        engine = self.engine
        loop = asyncio.get_running_loop()
        for name in available_drafters(engine.draft is not None):
            try:
                drafter = engine.drafter(name)
                # Drafters sharing a draft length and a model share their costs: time each set once.
                if engine.tuner.needs_costs(drafter, None, engine.resolve_max_k(self.max_k, drafter)):
                    await loop.run_in_executor(self.executor, engine.measure_costs, self.max_k, drafter)
                if self.max_batch > 1 and drafter is not None:  # what passes of several requests' rows cost
                    rows = self.max_batch * (engine.resolve_max_k(self.max_k, drafter) + 1)
                    await loop.run_in_executor(self.executor, engine.measure_batch_costs, rows)
            except Exception:  # a warm-up failure must not keep the server down; requests calibrate lazily
                log.exception("warm-up calibration of %s failed", name)

    def begin_shutdown(self) -> None:
        """Refuse new work, fail the queued requests, cancel the one in flight. Event-loop thread only. Also after
        begin_drain (the grace period over): a drain refuses new work but must not make this a no-op."""
        if self._shut_down:
            return
        self._shut_down = self.shutting_down = True
        self._halt = True
        for job in self.queue.drain():
            job.cancel("shutdown")
            job.state = "done"
            self.metrics.cancelled.labels("shutdown").inc()
            job.events.put_nowait(("error", ApiError(503, "the server is shutting down", code="shutting_down")))
        self.metrics.queue_depth.set(0)
        for job in self.running:
            if job.cancel("shutdown"):
                self.metrics.cancelled.labels("shutdown").inc()

    def begin_drain(self) -> None:
        """Refuse new work (503 with Retry-After) but finish the running and queued requests."""
        self.draining = True
        self.shutting_down = True

    @property
    def state(self) -> str:
        """"ok", "draining" (finishing its requests, taking no new ones) or "shutting_down" (cutting them)."""
        if self._halt or self._shut_down:
            return "shutting_down"
        return "draining" if self.draining else ("shutting_down" if self.shutting_down else "ok")

    def idle(self) -> bool:
        """No request queued, being tokenized or running. Safe from another thread (the drain's): a job being
        admitted counts."""
        with self._moving:
            return not self.running and len(self.queue) == 0 and not self.reserved

    def begin_shutdown_threadsafe(self) -> None:
        """For signal handlers: flag at once (the running generation polls it), clean up on the loop."""
        self._halt = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.begin_shutdown)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        while True:
            if not self.running and not len(self.queue):
                await self.queue.wait()
            admitted = self._admissions()
            if not self.running and not admitted:
                continue
            try:
                messages = await self._loop.run_in_executor(self.executor, self._tick, admitted)
            except Exception:  # a bug or a device error in the pass: fail its requests, keep serving
                log.exception("generation failed")
                # The same words for every request in the pass: an exception's text may quote one request's input.
                error = ApiError(500, "generation failed: an internal error in the engine's pass", code="generation_failed")
                messages = [(job, ("error", error)) for job in list(self.running)]  # the admitted are running too
                self.batch.abandon()
            for job, message in messages:
                self._deliver(job, message)
            # While the worker waits for work, its locals must not keep the finished jobs (their compiled grammars:
            # megabytes each for a large schema).
            admitted = messages = job = message = None

    def _admissions(self) -> list[Job]:
        """Jobs that join the batch at the next pass: as many as it has free slots for, fairly across clients."""
        jobs = []
        while len(self.queue) and len(self.running) < self.max_batch:  # `running` holds the jobs taken so far
            with self._moving:  # off the queue and into `running` at once, as idle() sees it
                job = self.queue.get_nowait()
                if job.cancel_reason is not None:
                    job.state = "done"
                    continue
                job.state, job.started = "running", time.perf_counter()
                self.running.append(job)
            self.metrics.queue_wait.observe(job.started - job.arrived)
            jobs.append(job)
        self.metrics.queue_depth.set(len(self.queue))
        self.metrics.running.set(len(self.running))
        return jobs

    def _deliver(self, job: Job, message: tuple) -> None:
        """Event-loop thread: hand a job its message; account for it when it is the last."""
        kind = message[0]
        if kind == "step":
            step: Step = message[1]
            now = time.perf_counter()
            if step.tokens:
                if job.last_token_at is None:
                    self.metrics.ttft.observe(now - job.arrived)
                else:
                    per_token = (now - job.last_token_at) / len(step.tokens)
                    for _ in step.tokens:
                        self.metrics.token_latency.observe(per_token)
                job.last_token_at = now
            if step.finished:
                self.metrics.record_generation(step.final_stats)
                self.metrics.record_store(self.engine.suffix_store)
                self.metrics.request_duration.observe(now - job.arrived)
        if kind == "error" or (kind == "step" and message[1].finished):
            self._finish(job, message)
            if job in self.running:
                self.running.remove(job)
                self.completed += 1
            self.metrics.running.set(len(self.running))
        else:
            job.events.put_nowait(message)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ the worker
    def _should_stop(self, job: Job):
        return lambda: job.cancel_reason is not None or self._halt

    async def tokenize(self, request: GenerationRequest) -> Encoded:
        """Before queueing (in a place `reserve` holds), off the engine thread: a long prompt, or a large schema to
        compile, must not hold up the generations running. The job carries both to the engine (Job.prompt_ids,
        Job.grammar).
        A text too long to fit the context at the tokenizer's longest token is refused without tokenizing."""
        texts = [request.prompt] if isinstance(request.prompt, str) else (
            [m["content"] for m in request.prompt if isinstance(m, dict)] if isinstance(request.prompt, list) else [])
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts if isinstance(t, str))
        tokenizer = self.engine.tokenizer
        if size and size > self.engine.max_context * await asyncio.to_thread(lambda: tokenizer.longest_token_bytes):
            raise ApiError(400, f"the prompt has {size} bytes, more than this model's context of {self.engine.max_context}"
                           " tokens can hold", param="messages" if request.kind == "chat" else "prompt",
                           code="context_length_exceeded")
        return await asyncio.to_thread(self._encode, request)

    def _encode(self, request: GenerationRequest) -> Encoded:
        try:  # the engine checks token ids and emptiness; the API names the field at fault
            if request.tools:  # listed by the chat template
                tokenizer = self.engine.tokenizer
                prompt = tokenizer.chat_prompt(request.prompt, tools=request.tools)
                if forces_call(request.tool_choice):  # in this thread, in a queue place: see compulsory_call
                    request.grammar = compulsory_call(request.tools, request.tool_choice, request.parallel_tool_calls,
                                                      tokenizer)
                ids = tokenizer.encode(prompt)
            else:
                ids = self.engine.encode_prompt(request.prompt, chat=False)  # chat requests carry messages
            self._check_logit_bias(request)
            return Encoded(ids, self._check_grammar(request))
        except ToolsUnsupported as exc:
            raise ApiError(400, str(exc), param="tools", code="tools_unsupported") from None
        except InputError as exc:
            code = "chat_template_error" if isinstance(exc, ChatTemplateError) else "invalid_prompt"
            param = exc.param or ("messages" if request.kind == "chat" else "prompt")
            raise ApiError(400, str(exc), param=param, code=code) from None

    def _check_logit_bias(self, request: GenerationRequest) -> None:
        """Token ids past the vocabulary, refused here where the field is known (on the engine thread the 400 named
        no field: review turn5 #8)."""
        vocab = self.engine.target.vocab_size
        bad = [token for token, _ in request.controls.logit_bias if token >= vocab] if request.controls else []
        if bad:
            raise ApiError(400, f"logit_bias names token ids past this model's vocabulary (0..{vocab - 1}): {bad[:5]}",
                           param="logit_bias", code="invalid_value")

    def _check_grammar(self, request: GenerationRequest) -> CheckedGrammar | None:
        """Compile the answer's grammar here, off the engine thread (where every running stream would wait for it);
        the job hands it to the engine. A 400 naming the field it came from."""
        if request.grammar is None:
            return None
        try:
            return self._compile_once(request.grammar)
        except InputError as exc:
            param = "tool_choice" if request.tools and forces_call(request.tool_choice) else "response_format"
            raise ApiError(400, str(exc), param=param, code="invalid_value") from None

    def _compile_once(self, spec) -> CheckedGrammar:
        """check_grammar(spec), or the result of the compile of this very spec object already under way."""
        with self._compiling_lock:
            held = self._compiling.get(id(spec))
            mine = held is None or held[0] is not spec
            if mine:
                held = self._compiling[id(spec)] = (spec, Future())
        future = held[1]
        if not mine:
            return future.result()
        try:
            future.set_result(check_grammar(spec, self.engine.tokenizer, self.engine.target.vocab_size))
        except BaseException as exc:
            future.set_exception(exc)
        finally:
            with self._compiling_lock:
                self._compiling.pop(id(spec), None)
        return future.result()

    def _begin(self, job: Job) -> int:
        """Engine thread: check the limits and queue the request in the batch (the engine validates eagerly).
        Returns the prompt's length."""
        request, engine = job.request, self.engine
        if job.prompt_ids is None:  # a job queued without Scheduler.tokenize (tests): made ready here
            job.prompt_ids, job.grammar = self._encode(request)
        if request.grammar is not None and job.grammar is None:  # never compiled here, where every stream waits
            raise RuntimeError("the request's grammar was not compiled before it was queued")
        prompt_ids = job.prompt_ids
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", param="prompt", code="empty_prompt")
        room = engine.max_context - len(prompt_ids)
        if room < 1:
            raise ApiError(400, f"the prompt has {len(prompt_ids)} tokens; this model's context holds {engine.max_context}"
                           " (prompt plus completion)", param="messages" if request.kind == "chat" else "prompt",
                           code="context_length_exceeded")
        max_tokens = request.max_tokens
        if max_tokens is None:
            max_tokens = min(self.default_max_tokens, room)
        elif max_tokens > room:
            raise ApiError(400, f"this model's context holds {engine.max_context} tokens, but you asked for"
                           f" {len(prompt_ids) + max_tokens} ({len(prompt_ids)} in the prompt, {max_tokens} to"
                           " generate); lower max_tokens or shorten the prompt",
                           param="max_tokens", code="context_length_exceeded")
        sampling = SamplingParams(request.temperature, request.top_k, request.top_p, request.seed, request.min_p)
        drafter = request.drafter or self.default_drafter
        job.ticket = self.batch.submit(
            prompt_ids, drafter=drafter, k=request.k, sampling=sampling, max_new_tokens=max_tokens,
            stop=request.stop, max_k=self.max_k, should_stop=self._should_stop(job), namespace=job.namespace,
            controls=request.engine_controls(), grammar=job.grammar,
        )
        return len(prompt_ids)

    def _tick(self, admitted: list[Job]) -> list[tuple[Job, tuple]]:
        """Engine thread: queue the admitted jobs in the batch, run one pass; every job's messages since."""
        messages = []
        for job in admitted:
            try:
                messages.append((job, ("start", self._begin(job))))
            except ApiError as exc:
                messages.append((job, ("error", exc)))
            except SpecDecodeError as exc:  # InputError / ModelError: the engine's message is for the user
                messages.append((job, ("error", engine_error(exc))))
            except Exception:  # a bug met by this request's input fails this request only, not the whole pass
                log.exception("admitting a request failed")
                messages.append((job, ("error", ApiError(500, "internal error while admitting the request",
                                                          code="generation_failed"))))
        for job in self.running:
            if job.ticket is not None and (job.cancel_reason is not None or self._halt):
                self.batch.cancel(job.ticket)
        seen = {id(job.ticket): len(job.ticket.events) for job in self.running if job.ticket is not None}
        if self.batch.busy:
            self.batch.step()
            self.metrics.batch_size.observe(self.batch.last_batch)
            self.metrics.rows_per_pass.observe(self.batch.last_rows)
        for job in self.running:
            ticket = job.ticket
            if ticket is None:
                continue
            if job in admitted and ticket.reused is not None:  # within this client's own earlier text only
                self.metrics.record_prefix_reuse(ticket.reused)
            if ticket.error is not None:
                exc = ticket.error
                if not isinstance(exc, (ApiError, SpecDecodeError)):
                    log.error("a request failed in the engine", exc_info=exc)
                messages.append((job, ("error", engine_error(exc))))
                continue
            for event in ticket.events[seen.get(id(ticket), 0):]:
                messages.append((job, ("step", self._as_step(event, ticket.reused or 0))))
        return messages

    def _as_step(self, event, cached_tokens: int = 0) -> Step:
        """cached_tokens: prompt tokens the request found in its cache (its own client's earlier text, or a choice's
        sibling), OpenAI's usage.prompt_tokens_details.cached_tokens."""
        stats = event.stats
        # "cancelled" is the engine's word; the only client that can still read it is one whose generation
        # the server cut at shutdown, for which OpenAI's vocabulary says "length".
        reason = ("length" if stats.finish_reason == "cancelled" else stats.finish_reason) if event.finished else None
        return Step(event.text, list(event.tokens), list(event.origins), list(event.pieces),
                    {**stats.brief(), "cached_tokens": cached_tokens}, event.finished, reason,
                    stats if event.finished else None, sources=list(event.sources),
                    logprobs=describe(self.engine.tokenizer, self.engine.target.vocab_size, event.logprobs))

    def _finish(self, job: Job, event: tuple) -> None:
        """Hand the job its last event; from here on a disconnect of its client cancels nothing."""
        job.state = "done"
        job.events.put_nowait(event)
