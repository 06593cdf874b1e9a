"""A batch that hands out each step's event while the next pass runs (BatchEngine overlap, the default on a GPU,
forced here on the CPU's int8 path) gives every request the tokens, text and finish it gets alone and in a batch
that publishes at once, with stop strings, budgets, EOS and a cancel among them; each request's events end with
exactly one final event. The broken twin defers the events of requests whose text may end them (a stop string):
they then draft and decode past their stop, and the check must catch it."""
import pytest

from specdecode.batch import BatchEngine
from specdecode.generation import Generation

PROMPTS = ["Write a Python function that reverses a string.", "What is the capital of France? Explain.",
           "List five fruits and their colours.", "def fib(n):\n    # return the nth Fibonacci number\n",
           "Explain recursion to a child.", "Repeat after me: the cat sat on the mat, the cat sat on the mat.",
           "Name three planets.", "Translate 'good morning' into French and Spanish."]
DRAFTERS = ["none", "lookup", "suffix", "auto"]
CANCELLED = 5  # this request is cancelled after a few passes


def settings_for(i: int) -> dict:
    stops = {1: ["."], 4: [" a ", "\n\n"], 6: [","]}.get(i, [])
    return dict(drafter=DRAFTERS[i % len(DRAFTERS)], max_new_tokens=12 + 5 * i, stop=stops, namespace=f"c{i % 3}")


@pytest.fixture(scope="module")
def engine():
    from specdecode.engine import Engine
    from specdecode.models.loader import load_model
    from testlib import SMOLLM2

    return Engine(load_model(SMOLLM2, device="cpu", dtype="int8", max_context=512), max_context=512)


def run_batch(engine, overlap: bool):
    """The prompts staggered into one batch (4, then one a pass), one of them cancelled on the 6th pass. Returns
    the tickets and how many steps' events waited for the next pass, summed over the passes."""
    batch = BatchEngine(engine, max_batch=6, prefill_rows=16, overlap=overlap)
    tickets = [batch.submit(p, **settings_for(i)) for i, p in enumerate(PROMPTS[:4])]
    waited, passes = 0, 0

    def step():
        nonlocal waited, passes
        batch.step()
        passes += 1
        waited += len(batch.unpublished)
        if passes == 6:
            batch.cancel(tickets[CANCELLED])

    step()
    for i, prompt in enumerate(PROMPTS[4:], start=4):
        tickets.append(batch.submit(prompt, **settings_for(i)))
        step()
    while batch.busy:
        step()
    return tickets, waited


def test_events_published_during_the_next_pass_change_nothing(engine):
    at_once, waited = run_batch(engine, overlap=False)
    assert waited == 0
    overlapped, waited = run_batch(engine, overlap=True)
    assert waited >= 5  # the events of several steps did wait for the next pass (how many depends on the tuner)
    for i, (a, b) in enumerate(zip(at_once, overlapped)):
        ra, rb = a.result(), b.result()
        assert (rb.token_ids, rb.text, rb.stats.finish_reason) == (ra.token_ids, ra.text, ra.stats.finish_reason), i
        assert [e.finished for e in b.events] == [False] * (len(b.events) - 1) + [True], i
        assert "".join(e.text for e in b.events) == rb.text  # what was streamed is the answer
        if i != CANCELLED:
            alone = engine.generate(PROMPTS[i], **{**settings_for(i), "drafter": "none"})
            assert (rb.token_ids, rb.text, rb.stats.finish_reason) == (alone.token_ids, alone.text, alone.stats.finish_reason), i
    reasons = [t.result().stats.finish_reason for t in overlapped]
    assert reasons[CANCELLED] == "cancelled" and "stop" in [reasons[i] for i in (1, 4, 6)] and "length" in reasons


def test_the_overlap_check_catches_deferred_text_that_may_end_the_answer(engine, monkeypatch):
    """Broken twin: a step's event waits even where a stop string may end the answer."""
    monkeypatch.setattr(Generation, "event_can_wait", property(lambda self: self.stopper.finish is None))
    at_once, _ = run_batch(engine, overlap=False)
    broken, _ = run_batch(engine, overlap=True)
    assert any(a.result().token_ids != b.result().token_ids or len([e for e in b.events if e.finished]) != 1
               for a, b in zip(at_once, broken))
