"""The draft model drafts for every sequence of a batched step in one pass per draft position (batch_draft.py),
and each sequence still drafts exactly what it drafts alone: the same tokens (and, sampling, the same draft
distributions) from the same context, and the same final output as plain decoding. The broken twin positions
the draft model's rows as if the batched pass were one sequence: the drafts then differ from the solo ones."""
import pytest
import torch

from specdecode import batch as batch_module
from specdecode.drafters.draft_model import DraftModelDrafter
from specdecode.sampling import SamplingParams

PROMPTS = ["Write a Python function that reverses a string.", "What is the capital of France? Explain.",
           "List five fruits and their colours.", "def fib(n):\n    # return the nth Fibonacci number\n",
           "Explain recursion to a child."]


@pytest.fixture(scope="module")
def engine():
    """The real smollm2 on the int8 kernel, its float32 copy as the draft model (float32 draft passes, split by
    forward_batch within the rows its kernels compute exactly)."""
    from specdecode.engine import Engine
    from specdecode.models.loader import load_model
    from testlib import SMOLLM2

    target = load_model(SMOLLM2, device="cpu", dtype="int8", max_context=512)
    draft = load_model(SMOLLM2, device="cpu", dtype="float32", max_context=512)
    return Engine(target, draft, max_context=512)


def settings_for(sampled: bool, index: int) -> dict:
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=7 + index) if sampled else SamplingParams()
    return dict(drafter="draft", k=4, max_new_tokens=24, sampling=sampling, namespace=f"c{index}")


def run_batch(engine, sampled: bool, monkeypatch):
    """The prompts staggered into one batch (3 at first, then one per pass); every draft proposed, with the
    sequence it was proposed after. Returns (results, drafts, batch)."""
    drafts = []
    real = batch_module.draft_together

    def recording(proposals):
        contexts = [(g, list(g.sequence)) for g, _ in proposals]
        rounds = real(proposals)
        drafts.extend((g, context, g.sampling, g.draft) for g, context in contexts if g.draft.tokens)
        return rounds

    monkeypatch.setattr(batch_module, "draft_together", recording)
    batch = batch_module.BatchEngine(engine, max_batch=5, prefill_rows=16)
    tickets = [batch.submit(p, **settings_for(sampled, i)) for i, p in enumerate(PROMPTS[:3])]
    batch.step()
    for i, prompt in enumerate(PROMPTS[3:], start=3):
        tickets.append(batch.submit(prompt, **settings_for(sampled, i)))
        batch.step()
    batch.run()
    return [t.result() for t in tickets], drafts, batch


def mismatched_drafts(engine, drafts) -> int:
    """How many drafts differ from what the sequence's own draft-model drafter proposes alone, after the same
    context: one drafter per sequence, synced to each context as a generation run alone syncs its drafter."""
    alone_drafters = {}
    bad = 0
    for generation, context, sampling, draft in drafts:
        drafter = alone_drafters.setdefault(generation, DraftModelDrafter(engine.draft.model, engine.max_context))
        drafter.sync(context)
        alone = drafter.propose(context, len(draft.tokens), sampling, sampling.noise())
        # confidences: the draft's top probability per token (NaN where not computed), bitwise
        same_confidences = torch.equal(torch.tensor(alone.confidences, dtype=torch.float64).nan_to_num(-1.0),
                                       torch.tensor(draft.confidences, dtype=torch.float64).nan_to_num(-1.0))
        bad += alone.tokens != draft.tokens or not same_confidences
    return bad


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_a_batch_drafts_each_sequence_its_solo_drafts_in_shared_passes(engine, sampled, monkeypatch):
    solo = [engine.generate(p, **{**settings_for(sampled, i), "drafter": "none"}) for i, p in enumerate(PROMPTS)]
    results, drafts, batch = run_batch(engine, sampled, monkeypatch)
    for i, (alone, got) in enumerate(zip(solo, results)):
        assert got.token_ids == alone.token_ids, f"request {i} changed in the batch"
    assert len(drafts) > 20
    assert mismatched_drafts(engine, drafts) == 0
    # The draft passes were shared: far fewer than the passes the drafts took one sequence at a time.
    assert batch.draft_passes < 0.6 * sum(d.forward_passes for *_, d in drafts)


def test_the_draft_check_catches_draft_rows_that_see_the_batch(engine, monkeypatch):
    """Broken twin: the draft model's batched rows take rotary positions as if the pass were one sequence (each
    sequence's own pass alone is unaffected: its positions are consecutive). The outputs stay plain decoding's
    (the target judges every draft), but the drafts are no longer the solo ones, and the check must say so."""
    model = engine.draft.model
    real_rope = type(model)._rope
    monkeypatch.setattr(model, "_rope", lambda positions: real_rope(
        model, torch.arange(len(positions), device=positions.device) + positions[0]), raising=False)
    _, drafts, _ = run_batch(engine, False, monkeypatch)
    assert mismatched_drafts(engine, drafts) > 0
