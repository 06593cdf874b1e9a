"""The fair queue, per-token text pieces and the worker, on a fake engine: no model, no server."""
from __future__ import annotations

import asyncio
import threading

import pytest

from specdecode.server.metrics import ServerMetrics
from specdecode.server.protocol import ApiError, GenerationRequest
from specdecode.server.scheduler import RETRY_AFTER_SECONDS, FairQueue, Job, QueueFull, Scheduler
from specdecode.text import IncrementalDetokenizer


def _job(user: str, tag: int) -> Job:
    job = Job(request=None, user_key=user)
    job.tag = tag
    return job


def test_fair_queue_round_robin_bound_and_remove():
    async def scenario():
        queue = FairQueue(5)
        for user, tag in [("a", 1), ("a", 2), ("a", 3), ("b", 4), ("c", 5)]:
            queue.put_nowait(_job(user, tag))
        with pytest.raises(QueueFull):
            queue.put_nowait(_job("d", 6))
        order = [(await queue.get()).tag for _ in range(2)]
        extra = _job("b", 7)
        queue.put_nowait(extra)
        assert queue.remove(extra) and not queue.remove(extra)
        order += [queue.get_nowait().tag for _ in range(len(queue))]
        assert queue.get_nowait() is None
        return order

    # a's flood does not make b and c wait behind all of it
    assert asyncio.run(scenario()) == [1, 4, 5, 2, 3]


def test_fair_queue_get_waits_for_a_put():
    async def scenario():
        queue = FairQueue(1)
        getter = asyncio.create_task(queue.get())
        await asyncio.sleep(0.01)
        assert not getter.done()
        queue.put_nowait(_job("a", 1))
        return (await asyncio.wait_for(getter, 1)).tag

    assert asyncio.run(scenario()) == 1


class FakeTokenizer:
    """Byte-level tokens: token i is byte i, decoded as UTF-8 with replacement characters."""

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_incremental_detokenizer_keeps_multibyte_characters_whole():
    decoder = IncrementalDetokenizer(FakeTokenizer())
    pieces = [decoder.push(b) for b in "aé€b".encode()]
    assert "".join(pieces) == "aé€b"
    assert pieces == ["a", "", "é", "", "", "€", "b"]


def tiny_engine(max_context=32):
    """A real engine on a tiny random model (token-id prompts): the worker's limits, batching and cancels."""
    from specdecode.engine import Engine
    from testlib import as_loaded, make_tiny_model

    return Engine(as_loaded(make_tiny_model(seed=3)), max_context=max_context)


def request(prompt=(1, 2, 3), max_tokens=None) -> GenerationRequest:
    prompt = list(prompt) if not isinstance(prompt, str) else prompt
    return GenerationRequest(kind="completion", model="fake", prompt=prompt, max_tokens=max_tokens, temperature=0)


async def drain(job: Job) -> list:
    events = []
    while True:
        kind, payload = await asyncio.wait_for(job.events.get(), 30)
        events.append((kind, payload))
        if kind == "error" or (kind == "step" and payload.finished):
            return events


def run_jobs(engine, *requests_, queue_size=4, before=None, max_batch=8):
    async def scenario():
        scheduler = Scheduler(engine, "none", queue_size, ServerMetrics("fake"), default_max_tokens=8, max_batch=max_batch)
        worker = asyncio.create_task(scheduler.run())
        jobs = [Job(r, user_key="u") for r in requests_]
        for job in jobs:
            scheduler.submit(job)
        if before:
            await before(scheduler, jobs)
        results = [await drain(job) for job in jobs]
        worker.cancel()
        scheduler.close()
        return results

    return asyncio.run(scenario())


def last_step(events):
    return [payload for kind, payload in events if kind == "step"][-1]


def test_default_max_tokens_is_capped_by_the_context():
    short, long = run_jobs(tiny_engine(max_context=32), request([1, 2, 3]), request([5] * 29))
    assert last_step(short).stats["generated_tokens"] == 8  # the default
    assert last_step(long).stats["generated_tokens"] == 3  # the room left
    assert last_step(short).finish_reason == last_step(long).finish_reason == "length"


@pytest.mark.parametrize("prompt, max_tokens, param, code", [
    ([5] * 32, None, "prompt", "context_length_exceeded"),
    ([5] * 20, 13, "max_tokens", "context_length_exceeded"),
    ([5, 300], 2, "prompt", "invalid_prompt"),  # a token id outside the vocabulary
    ("", 2, "prompt", "empty_prompt"),
])
def test_limits_are_checked_before_generation(prompt, max_tokens, param, code):
    engine = tiny_engine(max_context=32)
    (events,) = run_jobs(engine, request(prompt, max_tokens))
    kind, error = events[0]
    assert kind == "error" and isinstance(error, ApiError)
    assert (error.status, error.param, error.code) == (400, param, code)


def test_requests_run_together_and_each_gets_its_solo_tokens():
    """Four jobs admitted at once share passes; each equals the engine's own plain run of it."""
    engine = tiny_engine(max_context=128)
    prompts = [[3 + i, 40 + i, 7, 90 - i] for i in range(4)]
    solo = [engine.generate(p, drafter="none", max_new_tokens=20).token_ids for p in prompts]
    results = run_jobs(engine, *[request(p, 20) for p in prompts])
    for expected, events in zip(solo, results):
        assert [t for kind, step in events if kind == "step" for t in step.tokens][:20] == expected


def test_cancel_stops_the_running_job_and_drops_a_queued_one():
    engine = tiny_engine(max_context=256)

    async def cancel_both(scheduler, jobs):
        kind, step = await asyncio.wait_for(jobs[0].events.get(), 30)  # "start": the first job is running
        jobs[0].events.put_nowait((kind, step))
        scheduler.cancel(jobs[1], "client_disconnected")  # still queued (a batch of one): leaves the queue at once
        assert len(scheduler.queue) == 0 and jobs[1].state == "done"
        scheduler.cancel(jobs[0], "client_disconnected")
        jobs[1].events.put_nowait(("error", ApiError(499, "gone")))  # its handler would have returned already

    first, second = run_jobs(engine, request([1, 2, 3], 200), request([1, 2, 3], 200), before=cancel_both, max_batch=1)
    assert last_step(first).finish_reason == "length" and last_step(first).stats["generated_tokens"] < 200
    assert second == [("error", second[0][1])]


def test_shutdown_fails_queued_jobs_and_cancels_the_running_one():
    engine = tiny_engine(max_context=256)

    async def shut_down(scheduler, jobs):
        kind, step = await asyncio.wait_for(jobs[0].events.get(), 30)
        jobs[0].events.put_nowait((kind, step))
        scheduler.begin_shutdown()
        with pytest.raises(ApiError) as refused:
            scheduler.submit(Job(request(), user_key="late"))
        assert refused.value.status == 503

    running, queued = run_jobs(engine, request([1, 2, 3], 200), request([1, 2, 3], 200), before=shut_down, max_batch=1)
    assert last_step(running).finish_reason == "length"  # OpenAI's word for a cut generation
    assert queued[0][0] == "error" and queued[0][1].status == 503


@pytest.mark.parametrize("queue_size", [1, 6])
def test_queue_full_is_a_429_with_retry_after(queue_size):
    """The Retry-After is the same however many wait and however long their generations took: derived from them, it
    would be a count of other clients' work."""
    async def scenario():
        scheduler = Scheduler(tiny_engine(), "none", queue_size, ServerMetrics("fake"), max_batch=1)
        for index in range(queue_size + 1):  # the batch's free place (no worker took it yet), then the queue's
            scheduler.submit(Job(request(), user_key=f"client {index}"))
        with pytest.raises(ApiError) as err:
            scheduler.submit(Job(request(), user_key="late"))
        scheduler.close()
        return err.value

    error = asyncio.run(scenario())
    assert error.status == 429 and error.code == "queue_full"
    assert error.headers["Retry-After"] == str(RETRY_AFTER_SECONDS) and not any(c.isdigit() for c in error.message)


def test_warmup_measures_every_offered_drafter_before_the_first_request():
    """Whatever the default drafter, a request naming another one must not pay for its cost calibration."""
    from specdecode.engine import Engine
    from testlib import as_loaded, make_tiny_model

    target, draft = make_tiny_model(seed=3), make_tiny_model(seed=4)
    engine = Engine(as_loaded(target), as_loaded(draft), max_context=128)
    scheduler = Scheduler(engine, "draft", 4, ServerMetrics("tiny"))
    asyncio.run(scheduler.warmup())
    scheduler.close()
    for name in ("lookup", "draft"):
        drafter = engine.drafter(name)
        assert engine.tuner.costs.known(engine.resolve_max_k(None, drafter)), name
    assert "draft" in engine.tuner.costs.draft
    result = engine.generate([1, 2, 3, 1, 2], drafter="lookup", max_new_tokens=4)
    assert not any("measured target/draft costs" in note for note in result.stats.notes)


def test_a_full_queue_refuses_before_tokenizing():
    """Every request was tokenized (up to the 4 MB body limit) before the 429 and 503 checks: the queue bounded
    memory, not CPU. A request now holds its place while it is tokenized, and one that finds no place is refused
    without any work on its prompt."""
    from specdecode.server.local import LocalBackend

    async def scenario():
        scheduler = Scheduler(tiny_engine(), "none", 1, ServerMetrics("fake"), max_batch=1)  # room: 1 + 1 free slot
        backend = LocalBackend(scheduler)
        tokenized, gate, real = [], asyncio.Event(), scheduler.tokenize

        async def slow_tokenize(request_):
            tokenized.append(request_)
            await gate.wait()
            return await real(request_)

        scheduler.tokenize = slow_tokenize
        holding = [asyncio.create_task(backend.submit(request(), "a")), asyncio.create_task(backend.submit(request(), "b"))]
        await asyncio.sleep(0.05)
        assert len(tokenized) == 2 and len(scheduler.queue) == 0
        with pytest.raises(ApiError) as full:
            await asyncio.wait_for(backend.submit(request(), "c"), 5)
        assert full.value.status == 429 and len(tokenized) == 2
        assert scheduler.reserved == 2 and not scheduler.idle()  # a drain waits for them
        gate.set()
        await asyncio.gather(*holding)
        assert len(scheduler.queue) == 2 and scheduler.reserved == 0
        with pytest.raises(ApiError) as still_full:
            await backend.submit(request(), "d")
        assert still_full.value.status == 429 and len(tokenized) == 2
        for job in scheduler.queue.drain():
            job.state = "done"
        with pytest.raises(ApiError) as bad:  # refused by the tokenizer: its place is given back
            await backend.submit(request([5, 300]), "e")
        assert bad.value.status == 400 and scheduler.reserved == 0
        scheduler.begin_drain()
        with pytest.raises(ApiError) as draining:
            await backend.submit(request(), "f")
        assert draining.value.status == 503 and len(tokenized) == 3
        scheduler.close()

    asyncio.run(scenario())


def test_the_drains_idle_check_counts_a_job_taken_off_the_queue_but_not_yet_running():
    """SIGTERM's drain thread polls idle() while the event loop admits jobs: a job off the queue but not yet in
    `running` made the server look idle, and it stopped with that request unanswered."""
    scheduler = Scheduler(tiny_engine(), "none", 4, ServerMetrics("fake"))
    scheduler.submit(Job(request(), user_key="a"))
    take = scheduler.queue.get_nowait
    seen, lookers = [], []

    def take_then_look():
        job = take()
        looker = threading.Thread(target=lambda: seen.append(scheduler.idle()))  # the drain's thread, right now
        looker.start()
        looker.join(timeout=0.5)
        lookers.append(looker)
        return job

    scheduler.queue.get_nowait = take_then_look
    try:
        assert len(scheduler._admissions()) == 1
        lookers[0].join(timeout=10)
        assert seen == [False], "idle() while a job moved from the queue to the batch"
        assert not scheduler.idle()
    finally:
        scheduler.close()


def test_a_failed_pass_fails_each_of_its_jobs_once():
    """The jobs admitted for the failing pass are in `running` already: listing them twice sent each two errors."""
    async def scenario():
        scheduler = Scheduler(tiny_engine(), "none", 4, ServerMetrics("fake"))

        def broken_step():
            raise RuntimeError("device lost")

        scheduler.batch.step = broken_step
        worker = asyncio.create_task(scheduler.run())
        job = Job(request(), user_key="a")
        scheduler.submit(job)
        events = await drain(job)
        await asyncio.sleep(0.2)
        leftover = job.events.qsize()
        worker.cancel()
        scheduler.close()
        return events, leftover, scheduler

    events, leftover, scheduler = asyncio.run(scenario())
    assert [kind for kind, _ in events][-1] == "error" and events[-1][1].status == 500
    assert leftover == 0, "a second error for the same job"
    assert scheduler.idle() and scheduler.completed == 1


def test_health_answers_503_while_draining_and_while_shutting_down():
    """Load balancers kept sending to a draining server that answered /health 200."""
    from starlette.testclient import TestClient

    from specdecode.server.app import create_app

    app = create_app(tiny_engine(), "none", "fake")
    scheduler = app.state.scheduler
    client = TestClient(app)  # no lifespan: /health needs no worker
    try:
        ok = client.get("/health")
        assert ok.status_code == 200 and ok.json()["status"] == "ok"
        scheduler.begin_drain()
        draining = client.get("/health")
        assert draining.status_code == 503 and draining.json()["status"] == "draining"
        scheduler.begin_shutdown()
        down = client.get("/health")
        assert down.status_code == 503 and down.json()["status"] == "shutting_down"
    finally:
        scheduler.close()


def test_a_job_cancelled_while_it_is_admitted_still_ends_and_frees_its_place():
    """A client hanging up between _admissions (event loop) and _tick's cancels (engine thread) left its ticket
    dropped by the batch with no final event: the job stayed in `running` for good, holding a batch place, and
    the worker spun. max_batch such hang-ups stopped the server."""
    async def scenario():
        scheduler = Scheduler(tiny_engine(max_context=64), "none", 4, ServerMetrics("fake"), max_batch=1)
        gone = Job(request([1, 2, 3], 4), user_key="a")
        scheduler.submit(gone)
        admitted = scheduler._admissions()
        scheduler.cancel(admitted[0], "client_disconnected")  # while _begin would run on the engine thread
        for job, message in scheduler._tick(admitted):
            scheduler._deliver(job, message)
        assert gone.state == "done" and not scheduler.running and scheduler.idle()
        worker = asyncio.create_task(scheduler.run())
        healthy = Job(request([1, 2, 3], 4), user_key="b")
        scheduler.submit(healthy)
        events = await drain(healthy)
        worker.cancel()
        scheduler.close()
        return events

    assert last_step(asyncio.run(scenario())).stats["generated_tokens"] == 4


def test_a_ticket_cancelled_before_it_starts_ends_with_no_tokens():
    from specdecode.batch import BatchEngine

    batch = BatchEngine(tiny_engine(max_context=64), max_batch=1)
    ticket = batch.submit([1, 2, 3], drafter="none", max_new_tokens=4)
    batch.cancel(ticket)
    batch.step()
    assert ticket.finished and not batch.busy
    assert ticket.result().token_ids == [] and ticket.result().stats.finish_reason == "cancelled"


def test_an_unexpected_error_admitting_one_job_fails_that_job_only():
    """Only ApiError and SpecDecodeError were caught around _begin: anything else failed the whole pass, and every
    running request got a 500 carrying that exception's text."""
    async def scenario():
        scheduler = Scheduler(tiny_engine(max_context=64), "none", 4, ServerMetrics("fake"))
        begin = scheduler._begin

        def broken_for_b(job):
            if job.user_key == "b":
                raise RuntimeError("secret of b")
            return begin(job)

        scheduler._begin = broken_for_b
        worker = asyncio.create_task(scheduler.run())
        a, b = Job(request([1, 2, 3], 6), user_key="a"), Job(request([4, 5, 6], 6), user_key="b")
        scheduler.submit(a)
        scheduler.submit(b)
        results = await drain(a), await drain(b)
        worker.cancel()
        scheduler.close()
        return results

    a_events, b_events = asyncio.run(scenario())
    assert last_step(a_events).stats["generated_tokens"] == 6
    kind, error = b_events[-1]
    assert kind == "error" and error.status == 500 and "secret" not in error.message


def test_one_client_filling_the_queue_leaves_room_for_another():
    """The queue's bound was global: one lane took every place and every other client's first request got 429."""
    async def scenario():
        scheduler = Scheduler(tiny_engine(), "none", 8, ServerMetrics("fake"), max_batch=4)  # room: 8 + 4 free slots
        flooded = 0
        with pytest.raises(ApiError) as refused:
            while True:
                scheduler.submit(Job(request(), user_key="flooder"))
                flooded += 1
        other = Job(request(), user_key="other")
        scheduler.submit(other)  # a place is still there for it
        scheduler.close()
        return flooded, refused.value, other

    flooded, refused, other = asyncio.run(scenario())
    assert refused.status == 429 and flooded == 9 and other.state == "queued"


def flood(scheduler, lane: str) -> int:
    """Requests of one lane accepted before its 429."""
    accepted = 0
    with pytest.raises(ApiError) as refused:
        while True:
            scheduler.submit(Job(request(), user_key=lane))
            accepted += 1
    assert refused.value.status == 429
    return accepted


@pytest.mark.parametrize("flooders", [2, 3, 5])
def test_lanes_flooding_the_queue_leave_a_place_for_another_clients_first_request(flooders):
    """One lane held at most three quarters of the room: two lanes (two addresses, or two keys) took every place and a
    third client's first request got 429 (review turn5 #2). The last quarter is now kept for lanes holding none."""
    async def scenario():
        scheduler = Scheduler(tiny_engine(), "none", 16, ServerMetrics("fake"), max_batch=8)  # room: 16 + 8 free
        accepted = [flood(scheduler, f"flooder-{index}") for index in range(flooders)]
        first = Job(request(), user_key="newcomer")
        scheduler.submit(first)  # no 429
        with pytest.raises(ApiError):  # a lane holding a place draws on the flooders' share, which is full
            scheduler.submit(Job(request(), user_key="newcomer"))
        queued = len(scheduler.queue)
        scheduler.close()
        return accepted, first, queued

    accepted, first, queued = asyncio.run(scenario())
    assert first.state == "queued" and queued <= 24  # the global bound holds
    assert accepted[0] == 18 and all(count == 1 for count in accepted[1:])


def test_a_clients_ipv6_addresses_of_one_64_are_one_lane():
    from specdecode.server.http_parts import queue_lane
    from specdecode.server.scheduler import client_lane, peer_group

    assert peer_group("2001:db8:1:2:aaaa::1") == peer_group("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert peer_group("2001:db8:1:3::1") != peer_group("2001:db8:1:2::1")
    assert peer_group("::ffff:10.0.0.1") == "10.0.0.1" and peer_group("10.0.0.1") == "10.0.0.1"
    assert peer_group("fe80::1%eth0") == "fe80::/64" and peer_group("?") == "?"
    lane = client_lane(queue_lane("k1", "2001:db8::7"))
    assert lane == client_lane(queue_lane("k1", "2001:db8::8")) == client_lane(lane)
    assert lane != client_lane(queue_lane("k2", "2001:db8::7"))
    assert client_lane(queue_lane("", "127.0.0.2")) == queue_lane("", "127.0.0.2") and client_lane("u") == "u"

    async def scenario():
        scheduler = Scheduler(tiny_engine(), "none", 16, ServerMetrics("fake"), max_batch=8)
        accepted = [flood(scheduler, queue_lane("", f"2001:db8::{index}")) for index in range(1, 4)]
        scheduler.close()
        return accepted

    assert asyncio.run(scenario()) == [18, 0, 0]  # the second and third addresses are the first's lane


def test_a_request_failing_in_its_verdict_fails_alone(monkeypatch):
    """One request's exception in the batch's pass (a temperature of 1e-300 made NaN probabilities) failed the pass:
    every request in it got a 500. Its verdict is its own: it fails alone, the others keep their tokens."""
    from specdecode.generation import Generation

    settle = Generation.settle

    def broken_for_b(self, *args, **kwargs):
        if self.request.namespace == "b":
            raise ValueError("sampling from a distribution with no mass")
        return settle(self, *args, **kwargs)

    monkeypatch.setattr(Generation, "settle", broken_for_b)
    engine = tiny_engine(max_context=64)
    solo = engine.generate([1, 2, 3], drafter="none", max_new_tokens=6).token_ids

    async def scenario():
        scheduler = Scheduler(engine, "none", 4, ServerMetrics("fake"))
        worker = asyncio.create_task(scheduler.run())
        a = Job(request([1, 2, 3], 6), user_key="a", namespace="a")
        b = Job(request([4, 5, 6], 6), user_key="b", namespace="b")
        scheduler.submit(a)
        scheduler.submit(b)
        results = await drain(a), await drain(b)
        worker.cancel()
        scheduler.close()
        return results

    a_events, b_events = asyncio.run(scenario())
    assert [t for kind, step in a_events if kind == "step" for t in step.tokens] == solo
    assert b_events[-1][0] == "error" and b_events[-1][1].status == 500
