"""A request's compiled grammar travels with it from the thread that tokenizes it to the engine, and dies with it.

A cache of 64 compiled grammars, keyed by the spec object, stood between the two: a client that pushed its own
queued schema out of it (64 other schemas tokenized meanwhile) made the engine thread compile it while every
stream waited (review turn5 #4), and the cache kept 64 compiled grammars after their requests ended, about 20 MB
each for a large schema (#5). Also here: a 400 the scheduler can name names its field (#8).
"""
from __future__ import annotations

import asyncio
import gc
import json
import threading
import weakref

import openai
import pytest

from specdecode.grammar import GrammarSpec
from specdecode.server.metrics import ServerMetrics
from specdecode.server.protocol import GenerationRequest

from .conftest import MODEL


@pytest.fixture(scope="module")
def engine(models):
    from specdecode.engine import Engine

    return Engine(models[0], None, max_context=256)


def schema_request(properties: int, tag: int) -> GenerationRequest:
    """A chat request whose answer must match a schema of `properties` string fields (named after `tag`, so that
    no two tags give the same grammar)."""
    schema = {"type": "object", "properties": {f"f{tag}_{i}": {"type": "string", "maxLength": 4}
                                               for i in range(properties)}, "required": [f"f{tag}_0"]}
    return GenerationRequest(kind="chat", model=MODEL, prompt=[{"role": "user", "content": "Fill the form."}],
                             max_tokens=6, temperature=0, grammar=GrammarSpec("json_schema", json.dumps(schema)))


def record_compiles(monkeypatch) -> list[str]:
    """The names of the threads that compile a grammar's text or build a matcher from it."""
    from specdecode import grammar

    threads = []
    for name in ("grammar_text", "start_matcher"):
        real = getattr(grammar, name)
        monkeypatch.setattr(grammar, name, lambda *a, real=real: threads.append(threading.current_thread().name)
                            or real(*a))
    return threads


async def finish(next_event) -> tuple:
    """The last message of a job: ("error", ApiError) or ("step", its final Step)."""
    while True:
        kind, payload = await asyncio.wait_for(next_event(), 120)
        if kind == "error" or (kind == "step" and payload.finished):
            return kind, payload


def test_a_queued_schema_is_never_compiled_on_the_engine_thread_however_many_come_after(engine, monkeypatch):
    """One request queued with its schema, then 100 distinct schemas tokenized (each withdrawn once queued, as a
    client hanging up) before the worker admits it: the engine thread compiles nothing."""
    from specdecode.server.local import LocalBackend
    from specdecode.server.scheduler import Scheduler

    threads = record_compiles(monkeypatch)

    async def scenario():
        scheduler = Scheduler(engine, "none", 4, ServerMetrics("fake"), max_batch=2)
        backend = LocalBackend(scheduler)
        queued = await backend.submit(schema_request(40, 0), "victim")
        for tag in range(1, 101):
            (await backend.submit(schema_request(3, tag), "flusher")).cancel("client_disconnected")
        worker = asyncio.create_task(scheduler.run())
        outcome = await finish(queued.next)
        worker.cancel()
        scheduler.close()
        return outcome

    kind, step = asyncio.run(scenario())
    assert kind == "step" and step.finish_reason in ("stop", "length"), step
    assert not [name for name in threads if name.startswith("specdecode-engine")], threads
    assert len(threads) == 2 * 101, "each schema compiled once, with its matcher"


def test_the_engine_refuses_a_grammar_compiled_for_another_spec(engine):
    """What the scheduler hands the engine must be the request's own grammar: another's is a bug, not a compile."""
    from specdecode.controls import LogitControls
    from specdecode.grammar import check_grammar

    mine, other = schema_request(2, 1).grammar, schema_request(2, 2).grammar
    compiled = check_grammar(other, engine.tokenizer, engine.target.vocab_size)
    with pytest.raises(ValueError):
        engine.request([1, 2, 3], drafter="none", controls=LogitControls(grammar=mine), grammar=compiled)
    assert engine.request([1, 2, 3], drafter="none", controls=LogitControls(grammar=other),
                          grammar=compiled).grammar is compiled


def test_a_job_queued_without_its_compiled_grammar_fails_rather_than_compiling_on_the_engine_thread(engine, monkeypatch):
    from specdecode.server.scheduler import Job, Scheduler

    threads = record_compiles(monkeypatch)

    async def scenario():
        scheduler = Scheduler(engine, "none", 4, ServerMetrics("fake"), max_batch=2)
        request = schema_request(3, 0)
        job = Job(request, user_key="u")
        job.prompt_ids = (await scheduler.tokenize(request)).prompt_ids  # its grammar dropped on the way
        scheduler.submit(job)
        worker = asyncio.create_task(scheduler.run())
        outcome = await finish(job.events.get)
        worker.cancel()
        scheduler.close()
        return outcome

    kind, error = asyncio.run(scenario())
    assert kind == "error" and error.status == 500
    assert not [name for name in threads if name.startswith("specdecode-engine")], threads


def test_no_compiled_grammar_outlives_its_request(engine, monkeypatch):
    """After N schema requests have ended nothing holds their compiled grammars: each died with its request (the
    worker's locals held the last pass's jobs while it waited for more)."""
    from specdecode.server import scheduler as scheduler_module
    from specdecode.server.local import LocalBackend

    compiled, check = [], scheduler_module.check_grammar

    def recording(*args):
        grammar = check(*args)
        compiled.append(weakref.ref(grammar))
        return grammar

    monkeypatch.setattr(scheduler_module, "check_grammar", recording)

    async def scenario():
        scheduler = scheduler_module.Scheduler(engine, "none", 8, ServerMetrics("fake"), max_batch=4)
        backend = LocalBackend(scheduler)
        worker = asyncio.create_task(scheduler.run())
        tickets = [await backend.submit(schema_request(300, tag), f"client-{tag}") for tag in range(6)]
        outcomes = [await finish(ticket.next) for ticket in tickets]
        del tickets
        await asyncio.sleep(0.1)  # the worker, idle, waits for the next request
        gc.collect()
        alive = [ref for ref in compiled if ref() is not None]
        worker.cancel()
        scheduler.close()
        return [kind for kind, _ in outcomes], alive

    kinds, alive = asyncio.run(scenario())
    assert kinds == ["step"] * 6 and len(compiled) == 6 and not alive


def test_the_choices_of_one_request_share_one_compile_and_others_compile_apart(engine, monkeypatch):
    """n choices carry their request's spec object: they wait for one compile of it instead of each compiling (seconds
    of CPU for a large schema, n times over). An equal spec from another request is compiled apart, and nothing is
    kept once the compile is done."""
    import time
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import replace

    from specdecode.server import scheduler as scheduler_module

    compiles, check = [], scheduler_module.check_grammar

    def slow(spec, *args):
        compiles.append(spec)
        time.sleep(0.3)  # long enough for every choice to arrive while it compiles
        return check(spec, *args)

    monkeypatch.setattr(scheduler_module, "check_grammar", slow)
    scheduler = scheduler_module.Scheduler(engine, "none", 8, ServerMetrics("fake"), max_batch=4)
    request = schema_request(20, 1)
    choices = [replace(request, seed=index) for index in range(4)]
    other = replace(request, grammar=GrammarSpec(request.grammar.kind, request.grammar.source))  # equal, not the same
    with ThreadPoolExecutor(5) as pool:
        grammars = list(pool.map(scheduler._check_grammar, choices + [other]))
    assert len({id(g) for g in grammars[:4]}) == 1 and grammars[4] is not grammars[0]
    assert len(compiles) == 2 and not scheduler._compiling
    scheduler.close()


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_logit_bias_id_past_the_vocabulary_is_a_400_naming_logit_bias(client, route):
    bias = {"49152": 5, "3": 1}  # smollm2's vocabulary is 0..49151
    with pytest.raises(openai.BadRequestError) as refused:
        if route == "chat":
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                           logit_bias=bias)
        else:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2, logit_bias=bias)
    assert refused.value.param == "logit_bias" and "49152" in str(refused.value)
