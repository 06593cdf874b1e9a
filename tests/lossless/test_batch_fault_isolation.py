"""One request's exception in its own part of a batched pass (planning its draft, proposing it in the draft model's
lockstep, building its verify block, reading its prompt) fails that request only: the others finish with the tokens
they get alone. Only admission and the verdict were isolated: a fault while proposing failed every request in the
pass (review turn5 S1). The broken twin runs the same faults without the isolation and must be caught."""
import pytest

from specdecode import batch as batch_module
from specdecode.generation import Generation
from specdecode.sampling import SamplingParams

PROMPTS = [[(7 * i + j) % 200 + 3 for j in range(5 + 3 * i)] for i in range(4)]
PROMPTS[1] = [(11 * j) % 190 + 5 for j in range(40)]  # the faulty one: a prompt read in several chunks
DRAFTERS = ["draft", "draft", "lookup", "auto"]
FAULTY = 1


@pytest.fixture(scope="module")
def engine():
    """Tiny int8 target with a draft model: requests drafting with it advance in one lockstep."""
    from specdecode import kernels
    from specdecode.engine import Engine
    from specdecode.models.loader import _to_quant_weights
    from testlib import TINY_CONFIGS, as_loaded, make_tiny_model, perturbed_copy

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    target = make_tiny_model(seed=9, **TINY_CONFIGS["llama-gqa"])
    draft = perturbed_copy(target, noise=0.02, seed=5)
    _to_quant_weights(target)
    return Engine(as_loaded(target, name="target"), as_loaded(draft, name="draft"), max_context=128)


def settings_for(index: int) -> dict:
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=40 + index) if index == 3 else SamplingParams()
    return dict(drafter=DRAFTERS[index], k=3, max_new_tokens=30, sampling=sampling, namespace=f"c{index}")


def inject(monkeypatch, where: str) -> None:
    """Make the faulty request (namespace c1) raise at `where`, once it is under way."""
    calls = {}

    def due(generation) -> bool:
        if generation.request.namespace != f"c{FAULTY}":
            return False
        calls[where] = calls.get(where, 0) + 1
        return calls[where] == 3  # its third plan or verify block: under way beside the others

    real_plan, real_segment, real_read = Generation.plan_steps, Generation.segment, Generation.read

    def plan_steps(self):
        if where == "plan" and due(self):
            raise RuntimeError("a bug met while planning one request's draft")
        steps = real_plan(self)
        if where != "draft pass" or steps is None or not due(self):
            return steps

        def broken():  # one draft-model pass beside the others', then the fault, mid-lockstep
            yield next(steps)
            raise RuntimeError("a bug met by one request's drafter")
        return broken()

    def segment(self):
        if where == "segment" and due(self):
            raise RuntimeError("a bug met building one request's verify block")
        return real_segment(self)

    def read(self, chunk):
        # its first prompt chunk, read beside the others' verify blocks
        if where == "prompt read" and self.request.namespace == f"c{FAULTY}" and calls.setdefault("read", 0) == 0:
            calls["read"] = 1
            raise RuntimeError("a bug met reading one request's prompt")
        return real_read(self, chunk)

    monkeypatch.setattr(Generation, "plan_steps", plan_steps)
    monkeypatch.setattr(Generation, "segment", segment)
    monkeypatch.setattr(Generation, "read", read)


def run_batch(engine) -> list:
    """The prompts staggered into one batch; a pass that raises fails every running request, as Scheduler.run
    does. Per request: its token ids, or the exception it failed with."""
    batch = batch_module.BatchEngine(engine, max_batch=4, prefill_rows=16)
    tickets = [batch.submit(PROMPTS[0], **settings_for(0)), batch.submit(PROMPTS[1], **settings_for(1))]
    pending = [(PROMPTS[i], settings_for(i)) for i in (2, 3)]
    while batch.busy or pending:
        if pending:
            prompt, settings = pending.pop(0)
            tickets.append(batch.submit(prompt, **settings))
        try:
            batch.step()
        except Exception as exc:
            for ticket in batch.running:
                ticket.error = exc
            batch.abandon()
    return [ticket.error if ticket.error is not None else ticket.result().token_ids for ticket in tickets]


@pytest.fixture(scope="module")
def solo(engine):
    return [engine.generate(p, **{**settings_for(i), "drafter": "none"}).token_ids for i, p in enumerate(PROMPTS)]


WHERE = ["plan", "draft pass", "segment", "prompt read"]


@pytest.mark.parametrize("where", WHERE)
def test_one_requests_fault_fails_it_alone_and_the_others_keep_their_solo_tokens(engine, solo, where, monkeypatch):
    assert run_batch(engine) == solo  # (unbroken, for the record)
    inject(monkeypatch, where)
    results = run_batch(engine)
    assert isinstance(results[FAULTY], RuntimeError) and "one request" in str(results[FAULTY])
    for index, (got, alone) in enumerate(zip(results, solo)):
        if index != FAULTY:
            assert got == alone, f"request {index} ({DRAFTERS[index]}) failed or changed beside the faulty one"


@pytest.mark.parametrize("where", WHERE)
def test_the_check_catches_a_batch_where_one_requests_fault_fails_the_others(engine, solo, where, monkeypatch):
    """Broken twin: the former pass, no per-request boundary around these parts."""
    monkeypatch.setattr(batch_module.BatchEngine, "_isolated", lambda self, ticket, work, *args: work(*args))
    monkeypatch.setattr(batch_module.BatchEngine, "_isolated_steps", lambda self, ticket, steps: steps)
    inject(monkeypatch, where)
    results = run_batch(engine)
    assert any(isinstance(got, Exception) for index, got in enumerate(results) if index != FAULTY)
