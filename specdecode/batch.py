"""Many requests, one target pass per step: continuous batching with speculation.

Each step packs, for every running request, its verify block (its last token plus its own draft) and,
within a row budget, a chunk of a newly admitted prompt into one `Transformer.forward_batch`: one call per
weight matrix over all rows, attention per request over its own cache. Requests join and leave between
passes. The draft model, where requests draft with it, runs one pass per draft position for all of them
(batch_draft.py). Every request runs in a `Slot` of its own (a target cache, the drafters that keep per-sequence
state) and is judged on its own rows only; the kernels compute each row from its own inputs and position
alone, so a request's tokens are those it gets running by itself (greedy and seeded sampling alike), however
many others share its passes and whenever they arrive.

How much each request drafts is decided for the whole pass (`batch_plan.trim_drafts`): a pass's cost
grows with its rows, so drafts are kept where their expected accepted tokens buy the most per second.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator

import torch

from . import accept, pass_timings
from .batch_ahead import LaterRead, PassInFlight, decodes_plainly, next_row_pays, next_tokens
from .batch_draft import draft_together
from .batch_plan import trim_drafts
from .drafters.base import Draft, Drafter
from .drafters.draft_model import common_prefix_len
from .drafters.registry import build_drafter
from .engine import Engine, GenerationResult, Request, collect_result
from .errors import InputError
from .generation import Generation, StreamEvent
from .models.transformer import Segment
from .sampling import SamplingParams, int64_to_device
from .stats import GenerationStats


class Slot:
    """One running request's place: its target cache, the tokens the cache holds and whose they are, and the
    drafters that keep per-sequence state (the store of earlier requests is the engine's, shared)."""

    def __init__(self, engine: Engine, index: int):
        self.index = index
        self.engine = engine
        self.cache = engine.target.model.new_cache(engine.max_context)
        self.cached_ids: list[int] = []
        self.namespace: str | None = None  # whose tokens the cache holds: a prefix is reused for the same only
        self._drafters: dict[str, Drafter] = {}
        # what drafter builders read (drafters/registry.py)
        self.draft, self.auto_draft_model = engine.draft, engine.auto_draft_model
        self.suffix_store, self.max_context = engine.suffix_store, engine.max_context
        self.opening, self.draft_opening = engine.opening, engine.draft_opening

    def drafter(self, name: str | None) -> Drafter | None:
        return build_drafter(self, self._drafters, name)

    def forget(self) -> None:
        """Drop what the slot holds of its earlier requests: the target cache, and each drafter's state (a draft
        model's cache holds a prompt too; the next client's draft prefill must not find another client's prefix)."""
        self.cache.truncate(0)
        self.cached_ids = []
        for drafter in self._drafters.values():
            drafter.reset()


@dataclass(eq=False)
class Ticket:
    """A submitted request: its events so far are handed to `on_event`; `result` once it has finished."""

    request: Request
    on_event: Callable[["Ticket", StreamEvent], None] | None = None
    generation: Generation | None = None
    slot: Slot | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to read into the cache
    events: list[StreamEvent] = field(default_factory=list)
    error: Exception | None = None
    cancelled: bool = False
    reused: int | None = None  # prompt tokens its cache already held (the same client's), once started
    group: object = None  # the choices of one request (submit_choices) share their prompt whatever the namespace
    donor: "Ticket | None" = None  # a running request reading the same prompt prefix: copied from it, not read again
    shared: int = 0  # prompt tokens to copy from the donor once it holds them

    @property
    def finished(self) -> bool:
        return self.error is not None or bool(self.events and self.events[-1].finished)

    def result(self) -> GenerationResult:
        if self.error is not None:
            raise self.error
        return collect_result(self.events, list(self.request.prompt_ids))


def ran_as_one_block(model, segments, rows: int) -> bool:
    """Whether a pass's rows ran as one block (forward_batch): then it cost what a block of that many rows costs,
    which the cost model may also read as the machine's level. Where rows are not exact (no kernel) or a pass holds
    more rows than stay exact, its sequences ran alone or in groups and it cost about the sum of its parts:
    recorded as one block, it would move that level as if the machine had slowed down."""
    return len(segments) == 1 or rows <= getattr(model, "batch_rows", 0)


class BatchEngine:
    """Runs up to max_batch generations at once on one Engine's models (not thread-safe: one thread calls it).

    prefill_rows: prompt rows a pass may read while other requests are decoding (bounds the pause a new
    long prompt adds to the running streams); a request alone reads its prompt in the engine's usual chunks.
    overlap: hand out a step's events (detokenizing, the callbacks) while the next pass runs, where the answer
    goes on whatever the text says (Generation.event_can_wait); by default where the target's passes run on a
    GPU, which returns from a pass once it is launched. On a CPU the pass is the host's own work: nothing to
    overlap, and the events would only come a pass later.
    device_verdicts: judge the pass's chains together where their logits are (accept.py: one comparison for all,
    two integers a request read back) instead of each on the host from its argmaxes (or draws), all read at once.
    Off by default: it costs the host more than the Python comparison it replaces (16 requests on a CPU: 34 against
    27 us a request and pass, docs/experiments/batch_host_time.py --verdicts both), and pays only once the next
    pass is built on the device too (built for plain decoding only: launch_ahead); scripts/gpu_check.py (part
    verdicts) measures it on a GPU. The verdicts are the same either way.
    launch_ahead: where every running request decodes plainly (greedy or sampled) on the GPU path, launch the next
    pass from the tokens the device chose (argmaxes, seeded draws) before reading this one, and settle this one
    while the next runs (batch_ahead.py).
    The tokens are the same; off by default until a device run has timed it (scripts/gpu_check.py, part verdicts).
    """

    def __init__(self, engine: Engine, max_batch: int = 8, prefill_rows: int = 64, overlap: bool | None = None,
                 device_verdicts: bool | None = None, launch_ahead: bool = False):
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.engine = engine
        self.max_batch = max_batch
        self.prefill_rows = max(1, prefill_rows)
        self.slots: list[Slot] = []  # made on first use (each holds a whole context's cache)
        self.waiting: deque[Ticket] = deque()
        self.running: list[Ticket] = []
        self.passes = 0
        self.draft_passes = 0  # the draft model's passes, each for every request drafting with it
        self.last_rows = self.last_batch = 0  # rows and requests of the latest pass (metrics)
        model = engine.target.model
        self.overlap = model.device.type == "cuda" if overlap is None else overlap
        self.device_verdicts = bool(device_verdicts)
        self.unpublished: dict[Ticket, None] = {}  # running requests whose last step's event waits for the next pass
        self.launch_ahead = launch_ahead
        self.in_flight: PassInFlight | None = None  # a pass launched ahead, read by the next step
        self.passes_ahead = 0  # passes launched before the pass before them was read
        self._read_at = 0.0  # when the last pass in flight was read

    # ------------------------------------------------------------------ the public face
    def submit(self, prompt, on_event=None, **settings) -> Ticket:
        """Queue a request (settings as Engine.request; InputError now if they are wrong)."""
        ticket = Ticket(self.engine.request(prompt, **settings), on_event)
        self.waiting.append(ticket)
        return ticket

    def submit_choices(self, prompt, n: int, on_event=None, **settings) -> list[Ticket]:
        """n answers to one prompt (OpenAI's `n`), side by side in the batch. Choice i samples with
        `sampling.for_choice(i)` (seed + i; greedy choices are all the same answer), so it equals the request
        alone with that seed. The prompt is read once: the other choices copy its keys and values."""
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= self.max_batch:
            raise InputError(f"n must be an integer in 1..{self.max_batch} (the batch size), got {n!r}")
        sampling = settings.pop("sampling", None) or SamplingParams()
        request = self.engine.request(prompt, sampling=sampling, **settings)
        group = object()
        tickets = [Ticket(replace(request, sampling=sampling.for_choice(i)), on_event, group=group) for i in range(n)]
        self.waiting.extend(tickets)
        return tickets

    def generate_choices(self, prompt, n: int, **settings) -> list[GenerationResult]:
        """n answers to one prompt (see submit_choices), in choice order."""
        tickets = self.submit_choices(prompt, n, **settings)
        self.run()
        return [ticket.result() for ticket in tickets]

    def cancel(self, ticket: Ticket) -> None:
        """End the request at the next pass (finish_reason "cancelled"; with no tokens if it has not started)."""
        ticket.cancelled = True

    def abandon(self) -> None:
        """Drop every request (after a failed pass: their caches may hold half-written rows)."""
        for ticket in self.running:
            ticket.slot.forget()
        self.running, self.waiting, self.unpublished, self.in_flight = [], deque(), {}, None

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting or self.unpublished or self.in_flight)

    def run(self) -> None:
        """Step until every submitted request has finished."""
        while self.busy:
            self.step()

    def generate_many(self, prompts: Iterable, **settings) -> list[GenerationResult]:
        """Offline batch: every prompt with the same settings; results in the prompts' order."""
        tickets = [self.submit(prompt, **settings) for prompt in prompts]
        self.run()
        return [ticket.result() for ticket in tickets]

    def as_completed(self, prompts: Iterable, **settings) -> Iterator[tuple[int, GenerationResult]]:
        """(index, result) of each prompt as it finishes."""
        tickets = [self.submit(prompt, **settings) for prompt in prompts]
        done: set[int] = set()
        while len(done) < len(tickets):
            self.step()
            for index, ticket in enumerate(tickets):
                if index not in done and ticket.finished:
                    done.add(index)
                    yield index, ticket.result()

    # ------------------------------------------------------------------ one pass
    def step(self) -> int:
        """Admit what fits, then one target pass for every running request. Returns the pass's rows."""
        if self.in_flight is not None:
            return self._settle_in_flight()
        self._admit()
        self._share_prompts()
        decoding = [t for t in self.running if not t.pending and not t.finished]
        proposals = [(t.generation, self._isolated_steps(t, steps)) for t in decoding
                     if (steps := self._isolated(t, self._plan, t)) is not None]
        self.draft_passes += draft_together(proposals)  # the draft model's passes for all of them at once
        planned = [t for t in decoding if not t.finished]
        reads = self._prompt_chunks(planned)
        if len(planned) > 1:  # alone, a request drafts exactly as Engine.stream would
            trim_drafts([t.generation for t in planned], self.engine.tuner.costs, sum(len(c) for _, c in reads))
        blocks = [(t, segment) for t in planned if (segment := self._isolated(t, t.generation.segment)) is not None]
        planned = [t for t, _ in blocks]
        segments = [segment for _, segment in blocks]
        segments += [Segment(chunk, ticket.slot.cache, "none") for ticket, chunk in reads]
        if not segments:
            self._publish()
            self._retire()
            return 0
        starts = [seg.cache.length for seg in segments]
        t0 = time.perf_counter()
        logits = self.engine.target.model.forward_batch(segments)
        if not reads and self._goes_ahead(planned):
            self.in_flight = PassInFlight.of(planned, torch.cat(logits), starts)
            return self._settle_in_flight()
        self._publish()  # the last pass's events, while a GPU runs this one
        pass_timings.wait_for_device(self.engine.target.model.device)
        seconds = time.perf_counter() - t0
        rows = sum(seg.rows for seg in segments)
        self.passes, self.last_rows, self.last_batch = self.passes + 1, rows, len(planned) + len(reads)
        if not reads and ran_as_one_block(self.engine.target.model, segments, rows):
            self.engine.tuner.costs.record_target(rows, seconds)
        solo = len(segments) == 1
        choices, verdicts = greedy_together([t.generation for t in planned], logits, self.device_verdicts,
                                            draws_join(self.engine.target.model))
        for ticket, seg, out, start, choice, verdict in zip(planned, segments, logits, starts, choices, verdicts):
            # Each request's share of the pass, by its rows: what its verify time is taken to be (its tuning
            # judges drafting by it; the pass's cost by its total rows is recorded above).
            share = seconds if solo else seconds * seg.rows / rows
            self._apply(ticket, out, start, share, solo, choice, verdict)
        for ticket, chunk in reads:
            self._isolated(ticket, self._read, ticket, chunk)
        self._retire()
        return rows

    # ------------------------------------------------------------------ the next pass launched before this one is read
    def _goes_ahead(self, tickets: Iterable[Ticket]) -> bool:
        """Whether the pass after these tickets' may be launched before theirs is read: every running request is
        among them and decodes plainly, and no waiting request could join the next pass instead."""
        if not self.launch_ahead or (self.waiting and len(self.running) < self.max_batch):
            return False
        tickets = set(tickets)
        return all(ticket in tickets and decodes_plainly(ticket) for ticket in self.running if not ticket.finished)

    def _settle_in_flight(self) -> int:
        """Settle the pass in flight (its rows' argmaxes in one read), with the next pass launched before the read
        where the requests still go ahead: the host reads, judges and publishes while the device runs it."""
        passed, self.in_flight = self.in_flight, None
        owners = [None] * passed.logits.shape[0]
        for ticket, (row, _) in passed.rows.items():
            owners[row] = ticket.generation
        choice, feed = next_tokens(owners, passed.logits)
        read = LaterRead(choice)
        after = self._launch_after(passed, feed)
        self._publish()  # the events that waited, while the device runs
        tokens = read.tolist()
        now = time.perf_counter()
        seconds, self._read_at = now - max(passed.launched, self._read_at), now
        rows = len(passed.rows)
        self.passes, self.last_rows, self.last_batch = self.passes + 1, rows, rows
        for ticket, (row, start) in passed.rows.items():
            cache = ticket.slot.cache
            ahead = after is not None and ticket in after.rows
            if ahead:
                cache.length -= 1  # the row launched after: back once this step is settled and the request goes on
            self._apply(ticket, passed.logits[row : row + 1], start, seconds / rows, False, [tokens[row]])
            if ahead and not ticket.finished and ticket.generation.sequence[-1] == tokens[row]:
                cache.length += 1
            elif ahead:  # it ended here (or failed): its next row is dropped, as a rejected draft's
                del after.rows[ticket]
        self.in_flight = after if after is not None and after.rows else None
        self._retire()
        return rows

    def _launch_after(self, passed: PassInFlight, choice: torch.Tensor) -> PassInFlight | None:
        """The next pass, its tokens those the device chose from the pass in flight (`choice`: next_tokens' to feed),
        for the requests whose next row can be kept; None where it is not launched."""
        if not self._goes_ahead(passed.rows):
            return None
        tickets = [ticket for ticket in passed.rows if next_row_pays(ticket.generation, ticket.slot.cache)]
        if not tickets:
            return None
        picked = [passed.rows[ticket][0] for ticket in tickets]
        if picked != list(range(len(choice))):
            choice = choice.index_select(0, int64_to_device(picked, choice.device))
        starts = [ticket.slot.cache.length for ticket in tickets]
        logits = self.engine.target.model.steps_from_device([t.slot.cache for t in tickets], choice)
        if logits is None:
            return None
        self.passes_ahead += 1
        return PassInFlight.of(tickets, logits, starts)

    def _isolated(self, ticket: Ticket, work: Callable, *args):
        """`work(*args)`, one request's own part of the pass; an exception there (something its own settings or
        drafter met) fails that request only and returns None: the others' rows are computed apart, so they go on
        with the bits they get alone (review turn5 S1)."""
        try:
            return work(*args)
        except Exception as exc:
            self._fail(ticket, exc)
            return None

    def _isolated_steps(self, ticket: Ticket, steps):
        """The request's proposal (batch_draft runs it in lockstep with the others'); an exception in it fails this
        request only, which then leaves the lockstep with an empty draft."""
        try:
            return (yield from steps)
        except Exception as exc:
            self._fail(ticket, exc)
            return Draft()

    def _read(self, ticket: Ticket, chunk: list[int]) -> None:
        """A prompt chunk the pass wrote to the request's cache."""
        ticket.generation.read(chunk)
        if not ticket.pending:
            self.engine.prefilled(ticket.generation)

    def _prompt_chunks(self, decoding: list[Ticket]) -> list[tuple[Ticket, list[int]]]:
        """Prompt tokens this pass reads, per request still reading its prompt: a bounded chunk beside running
        streams (so a long prompt does not stall them), the engine's usual chunk when nothing else runs."""
        budget = self.prefill_rows if decoding else self.engine.prefill_chunk
        reads = []
        for ticket in self.running:
            if not ticket.pending or ticket.finished:
                continue
            if ticket.cancelled:
                self._isolated(ticket, lambda: self._emit(ticket, ticket.generation.end_now("cancelled")))
                continue
            if budget > 0 and ticket.donor is None:  # (one waiting for a donor's prompt reads nothing meanwhile)
                chunk, ticket.pending = ticket.pending[:budget], ticket.pending[budget:]
                budget -= len(chunk)
                reads.append((ticket, chunk))
        return reads

    def _plan(self, ticket: Ticket):
        """The request's proposal for this pass (batch_draft.py runs them together); None when it ends instead."""
        generation = ticket.generation
        if ticket.cancelled:
            return self._emit(ticket, generation.end_now("cancelled"))
        proposal = generation.plan_steps()
        if proposal is None:
            self._emit(ticket, generation.end_now("length"))
        return proposal

    def _apply(self, ticket: Ticket, logits, start: int, seconds: float, solo: bool, choice=None, verdict=None) -> None:
        """The request's verdict on its own rows; its event now, or with the next pass (overlap). A failure there
        (something its own settings met) ends that request only: the other requests' rows were computed apart, and
        their verdicts are theirs."""
        generation = ticket.generation
        try:
            generation.settle(logits, start, seconds, solo=solo, choice=choice, verdict=verdict)
            if self.overlap and generation.event_can_wait:
                self.unpublished[ticket] = None
            else:
                self._emit(ticket, generation.publish())
        except Exception as exc:
            self._fail(ticket, exc)

    def _publish(self) -> None:
        """The events that waited for this pass (see `overlap`), in the order their requests run."""
        waiting, self.unpublished = self.unpublished, {}
        for ticket in waiting:
            try:
                self._emit(ticket, ticket.generation.publish())
            except Exception as exc:
                self._fail(ticket, exc)

    def _fail(self, ticket: Ticket, exc: Exception) -> None:
        ticket.error = exc
        ticket.slot.forget()  # its cache may hold rows of a verdict never reached
        self.unpublished.pop(ticket, None)
        if ticket.on_event is not None:
            ticket.on_event(ticket, None)

    def _emit(self, ticket: Ticket, event: StreamEvent) -> None:
        # An event holds every token its request has settled (Stopper.release): one that waited is in this one.
        self.unpublished.pop(ticket, None)
        ticket.events.append(event)
        if ticket.on_event is not None:
            ticket.on_event(ticket, event)

    def _retire(self) -> None:
        for ticket in [t for t in self.running if t.finished]:
            self.running.remove(ticket)

    # ------------------------------------------------------------------ admission
    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_batch:
            ticket = self.waiting.popleft()
            if ticket.cancelled:  # it still ends: whoever waits on it (a server's job, as_completed) must see that
                self._emit(ticket, StreamEvent("", [], [], GenerationStats(finish_reason="cancelled"), finished=True))
                continue
            try:
                self._start(ticket)
            except Exception as exc:  # this request fails; the others go on
                ticket.error = exc
                if ticket.on_event is not None:
                    ticket.on_event(ticket, None)
                continue
            self.running.append(ticket)

    def _free_slot(self, request: Request) -> Slot:
        busy = {id(t.slot) for t in self.running}
        free = [slot for slot in self.slots if id(slot) not in busy]
        if len(self.slots) < self.max_batch:
            free.append(self._new_slot())
        # The cache that already holds the longest prefix of this prompt, from the same client only: a prefix
        # another client left must cost the same as none, or its timing tells what that client sent.
        def reuse(slot: Slot) -> int:
            if slot.namespace is None or slot.namespace != request.namespace:
                return 0
            return common_prefix_len(slot.cached_ids, list(request.prompt_ids[:-1]))
        return max(free, key=lambda slot: (reuse(slot), not slot.cached_ids))

    def _new_slot(self) -> Slot:
        slot = Slot(self.engine, len(self.slots))
        self.slots.append(slot)
        return slot

    def _start(self, ticket: Ticket) -> None:
        request = ticket.request
        slot = self._free_slot(request)
        if slot.namespace is None or slot.namespace != request.namespace:
            slot.forget()
        slot.namespace = request.namespace
        name = request.drafter
        drafter = name if isinstance(name, Drafter) or name is None else slot.drafter(name)
        ticket.slot = slot
        ticket.generation = self.engine.new_generation(request, slot, drafter)
        ticket.pending = ticket.generation.reuse_prefix()
        ticket.reused = len(request.prompt_ids) - 1 - len(ticket.pending)
        ticket.donor, ticket.shared = self._donor_for(ticket)
        if not ticket.pending:
            self.engine.prefilled(ticket.generation)

    # ------------------------------------------------------------------ a prompt read once for several requests
    def _may_share(self, a: Ticket, b: Ticket) -> bool:
        """Choices of one request, or requests of one client (a prefix another client's request computed must
        cost the same as none, as in _free_slot)."""
        if a.group is not None and a.group is b.group:
            return True
        return a.request.namespace is not None and a.request.namespace == b.request.namespace

    def _donor_for(self, ticket: Ticket) -> tuple[Ticket | None, int]:
        """The running request whose prompt shares the longest prefix with this one's, where that is more than
        this one's slot already holds: (donor, tokens to copy), or (None, 0)."""
        prompt = list(ticket.request.prompt_ids[:-1])
        best, best_len = None, len(prompt) - len(ticket.pending)
        for other in self.running:
            if other is not ticket and self._may_share(ticket, other):
                shared = common_prefix_len(list(other.request.prompt_ids[:-1]), prompt)
                if shared > best_len:
                    best, best_len = other, shared
        return (best, best_len) if best is not None else (None, 0)

    def _share_prompts(self) -> None:
        """Requests waiting on a donor take its prompt's keys and values once it holds them (the rows are those
        they would compute: every row depends on its own tokens and position only); a donor that ended first
        leaves them to read on their own."""
        for ticket in self.running:
            donor = ticket.donor
            if donor is None or ticket.finished:
                continue
            if donor.finished or donor not in self.running:
                ticket.donor = None
                continue
            self._isolated(ticket, self._copy_from_donor, ticket, donor)

    def _copy_from_donor(self, ticket: Ticket, donor: Ticket) -> None:
        """The donor's prompt rows this request shares, once the donor holds them."""
        prompt = list(ticket.request.prompt_ids[:-1])
        if common_prefix_len(donor.slot.cached_ids, prompt[: ticket.shared]) < ticket.shared:
            return  # the donor has not read that far yet
        slot = ticket.slot
        slot.cache.copy_prefix(donor.slot.cache, ticket.shared)
        slot.cached_ids = prompt[: ticket.shared]
        ticket.reused += ticket.shared - (len(prompt) - len(ticket.pending))
        ticket.pending, ticket.donor = prompt[ticket.shared :], None
        if not ticket.pending:
            self.engine.prefilled(ticket.generation)


def greedy_together(generations: list, logits: list, on_device: bool, join_draws: bool = False
                    ) -> tuple[list, list]:
    """Per generation whose verdict reads nothing but its rows' argmaxes (judges_by_argmax), or on the GPU path its
    rows' seeded draws (judges_by_draws, where join_draws), what the pass reads for it at once: (choices, verdicts), each a list
    with None where there is nothing. On a GPU each read is a sync that waits for the device to drain, and each
    launch costs the host microseconds: one argmax, one race and one read per pass instead of per request. The
    draws: each sampled row processed alone, as verify_sampling does, then all raced in one launch and spliced over
    their rows' argmaxes. on_device: chains get their Verdict, judged together where the logits are (accept.py),
    trees their argmaxes; otherwise each gets its rows' choices and judges on the host. An argmax takes no
    arithmetic, the race is the host's bits (sampling.py) and the comparison only integers, so a verdict is the
    same either way."""
    wanted = [i for i, (generation, out) in enumerate(zip(generations, logits))
              if out is not None and (generation.judges_by_argmax or join_draws and judges_by_draws(generation))]
    choices: list = [None] * len(generations)
    verdicts: list = [None] * len(generations)
    if len(wanted) < 2:
        return choices, verdicts  # alone, a request reads its own argmaxes as Engine.stream does
    rows, firsts = accept.one_tensor([logits[i] for i in wanted])  # one tensor: one argmax launch for all
    first_of = dict(zip(wanted, firsts))
    chains = [i for i in wanted if on_device and not generations[i].draft.is_tree]
    walked = [i for i in wanted if i not in chains]  # judged on the host
    sampled = [i for i in wanted if not generations[i].sampling.greedy]
    judged, picked = accept.greedy_verdicts(rows, [first_of[i] for i in chains],
                                            [generations[i].draft.tokens for i in chains], argmaxes=bool(walked),
                                            draws=accept.seeded_draws(generations, logits, sampled, first_of))
    for i, verdict in zip(chains, judged):
        # a draw of -1: a row without mass, which the request's own verify reports (its failure alone)
        verdicts[i] = verdict if verdict.next_token >= 0 else None
    for i in walked:
        choices[i] = picked[first_of[i] : first_of[i] + logits[i].shape[0]]
    return choices, verdicts


def draws_join(model) -> bool:
    """Whether sampled chains join the pass's read: on the GPU path (CUDA, or the Triton path in the interpreter),
    where their rows race in the device's kernel. On a CPU each request's own verify_sampling stops at its first
    rejected row instead of racing every row over the whole vocabulary."""
    return model.device.type == "cuda" or getattr(model, "exact_pass", None) is not None


def judges_by_draws(generation) -> bool:
    """A sampled chain nothing shapes the rows of: its verdict compares its draft with its rows' seeded draws."""
    controls = generation.controls
    return (not generation.sampling.greedy and not generation.draft.is_tree
            and not (controls is not None and controls.spec.shapes_rows))
