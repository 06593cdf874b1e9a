"""Batch invariance: a sequence's rows computed in a pass beside other sequences' rows (any number of them,
any lengths, chains, trees and prompt chunks) are bitwise the rows it computes alone, in logits and in the
keys/values its cache keeps; and end to end, a request served by the batched engine beside others arriving at
any moment gives token for token what it gives alone. Each has a broken twin that must fail."""
import pytest
import torch

from specdecode import kernels
from specdecode.models.loader import _to_quant_weights
from specdecode.models.transformer import Segment, Transformer
from testlib import TINY_CONFIGS, kquant_model, make_tiny_model, tokens_for

PRECISIONS = ["float32", "int8", "kquant"]


def model_for(precision: str, name: str = "qwen2-gqa-bias"):
    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    if precision == "kquant":  # Q4_K / Q6_K weights in the interleaved tiles the default target uses, two blocks a row
        model, blocks = kquant_model(seed=4, width=512)
        _to_quant_weights(model, blocks)
        return model
    model = make_tiny_model(seed=9, **TINY_CONFIGS[name])
    if precision == "int8":
        _to_quant_weights(model)
    return model


def batch_of(model, shapes, seed=0):
    """Per sequence (prefix length, new rows, logits, tree?): a cache holding its prefix and its new tokens."""
    out = []
    for index, (prefix, rows, logits, tree) in enumerate(shapes):
        tokens = tokens_for(model, prefix + rows, seed=seed + index).tolist()
        cache = model.new_cache()
        if prefix:
            model(torch.tensor(tokens[:prefix]), cache, logits="none")
        parents = [0] + [i for i in range(rows - 2)] if tree and rows > 2 else None  # root, a chain, a sibling
        out.append((tokens[prefix:], cache, logits, parents))
    return out


def alone(model, batch):
    """Each sequence's pass on its own, on a copy of its cache: (logits, cache) per sequence."""
    results = []
    for tokens, cache, logits, parents in batch:
        own = model.new_cache()
        own.keys.copy_(cache.keys), own.values.copy_(cache.values)
        own.length = cache.length
        results.append((model.forward_batch([Segment(tokens, own, logits, parents)])[0], own))
    return results


def together(model, batch):
    return model.forward_batch([Segment(t, c, l, p) for t, c, l, p in batch]), [c for _, c, _, _ in batch]


SHAPES = {
    "8 decode steps": [(3 + 5 * i, 1, "all", False) for i in range(8)],
    "verify blocks of 1-16": [(7, 16, "all", False), (30, 1, "all", False), (2, 5, "all", False), (51, 9, "all", False)],
    "blocks, a tree and a prompt chunk": [(12, 6, "all", False), (0, 64, "none", False), (20, 7, "all", True),
                                          (9, 3, "last", False)],
    "8 sequences, 100+ rows": [(4 * i, 1 + 2 * i, "all", i == 3) for i in range(8)],
}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_row_among_other_sequences_rows_is_the_row_alone(precision, shape):
    check_batch_is_rows_alone(model_for(precision), SHAPES[shape])


@pytest.mark.parametrize("precision", ["float32", "int8"])
@pytest.mark.parametrize("name", ["gemma3-windowed", "mistral-window"])
def test_windowed_layers_in_a_batch_are_the_rows_alone(name, precision):
    """Sliding windows of 6 (Gemma 3's windowed layers) and 5 (Mistral's every layer) against prefixes of up to 51
    positions: the window cuts most sequences' rows, chains, trees and prompt chunks alike."""
    model = model_for(precision, name)
    assert any(layer.window for layer in model.layers)
    for shape in SHAPES.values():
        check_batch_is_rows_alone(model, shape)


def check_batch_is_rows_alone(model, shapes):
    batch = batch_of(model, shapes)
    solo = alone(model, batch)
    logits, caches = together(model, batch)
    for index, ((expected, own), got, cache) in enumerate(zip(solo, logits, caches)):
        assert (expected is None) == (got is None)
        if expected is not None:
            assert torch.equal(got, expected), f"sequence {index}: logits differ from its pass alone"
        n = own.length
        assert cache.length == n
        assert torch.equal(cache.keys[:, :, :n], own.keys[:, :, :n]), f"sequence {index}: cached keys differ"
        assert torch.equal(cache.values[:, :, :n], own.values[:, :, :n]), f"sequence {index}: cached values differ"


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_the_batch_test_catches_rows_that_see_the_batch(precision, monkeypatch):
    """Broken twin: rotary positions taken as if the pass were one sequence (a classic batching bug)."""
    model = model_for(precision)
    batch = batch_of(model, SHAPES["verify blocks of 1-16"])
    solo = alone(model, batch)
    real_rope = Transformer._rope
    monkeypatch.setattr(Transformer, "_rope", lambda self, positions: real_rope(
        self, torch.arange(len(positions), device=positions.device) + positions[0]))
    logits, _ = together(model, batch)
    assert any(not torch.equal(got, expected) for (expected, _), got in zip(solo, logits))


def test_float32_passes_stay_within_the_rows_computed_exactly(monkeypatch):
    """The float32 path is row-exact only up to FLOAT32_CHUNKED_MAX_ROWS rows a product (beyond, a GEMM):
    a batch with more rows runs in groups that stay within it; forcing one big pass (the broken twin) is
    caught by the same comparison."""
    model = model_for("float32")
    shapes = [(5 + i, 16, "all", False) for i in range(10)]  # 160 rows
    batch = batch_of(model, shapes)
    solo = alone(model, batch)
    logits, _ = together(model, batch)
    assert all(torch.equal(got, expected) for (expected, _), got in zip(solo, logits))
    monkeypatch.setattr(Transformer, "batch_rows", property(lambda self: 1 << 20))
    batch = batch_of(model, shapes)
    logits, _ = together(model, batch)
    assert any(not torch.equal(got, expected) for (expected, _), got in zip(solo, logits))


# --------------------------------------------------------------------------- end to end
CHAT_PROMPTS = ["Write a Python function that reverses a string.", "What is the capital of France? Explain.",
                "List five fruits and their colours.", "def fib(n):\n    # return the nth Fibonacci number\n",
                "Translate 'good morning' into German, French and Spanish.", "Explain recursion to a child.",
                "Write a haiku about the sea.", "Repeat after me: the cat sat on the mat, the cat sat on the mat."]
DRAFTERS = ["auto", "lookup", "none", "suffix"]


def staggered(batch, prompts, settings_for, first=3, after=2):
    """Submit `first` prompts, run `after` passes, then one more prompt every pass: arrivals mid-batch."""
    tickets = [batch.submit(p, **settings_for(i)) for i, p in enumerate(prompts[:first])]
    for _ in range(after):
        batch.step()
    for i, prompt in enumerate(prompts[first:], start=first):
        tickets.append(batch.submit(prompt, **settings_for(i)))
        batch.step()
    batch.run()
    return [t.result() for t in tickets]


@pytest.fixture(scope="module")
def smollm2_engine():
    """The real smollm2 on the int8 kernel, the default target's path."""
    from specdecode.engine import Engine
    from specdecode.models.loader import load_model
    from testlib import SMOLLM2

    engine = Engine(load_model(SMOLLM2, device="cpu", dtype="int8", max_context=1024), max_context=1024)
    assert engine.target.model.int8
    return engine


@pytest.mark.parametrize("sampled,device_verdicts", [(False, False), (True, False), (False, True)],
                         ids=["greedy", "seeded", "greedy-device-verdicts"])
def test_eight_requests_arriving_at_any_moment_get_their_solo_output(smollm2_engine, sampled, device_verdicts):
    """The real smollm2 (int8): 8 prompts, mixed drafters, staggered arrival into one batch; each request's
    tokens equal the same request run alone with plain decoding. device_verdicts: the greedy chains judged together
    (accept.py, the GPU path's default)."""
    from specdecode.batch import BatchEngine
    from specdecode.sampling import SamplingParams

    engine = smollm2_engine

    def settings_for(i):
        sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=100 + i) if sampled else SamplingParams()
        return dict(drafter=DRAFTERS[i % len(DRAFTERS)], max_new_tokens=40, sampling=sampling, namespace=f"c{i % 3}")

    solo = [engine.generate(p, **{**settings_for(i), "drafter": "none"}) for i, p in enumerate(CHAT_PROMPTS)]
    batch = BatchEngine(engine, max_batch=8, prefill_rows=16, device_verdicts=device_verdicts)
    results = staggered(batch, CHAT_PROMPTS, settings_for)
    for i, (alone_result, got) in enumerate(zip(solo, results)):
        assert got.token_ids == alone_result.token_ids, f"request {i} ({settings_for(i)['drafter']}) changed in the batch"
        assert got.text == alone_result.text
    assert batch.passes < sum(r.stats.target_passes for r in results)  # passes were shared


def test_the_end_to_end_check_catches_a_batch_that_leaks_between_requests(smollm2_engine, monkeypatch):
    """Broken twin: rows positioned as if the pass were one sequence; some request's output must change."""
    from specdecode.batch import BatchEngine

    engine = smollm2_engine
    solo = [engine.generate(p, drafter="none", max_new_tokens=24) for p in CHAT_PROMPTS[:4]]
    real_rope = Transformer._rope
    monkeypatch.setattr(Transformer, "_rope", lambda self, positions: real_rope(
        self, torch.arange(len(positions), device=positions.device) + positions[0]))
    batch = BatchEngine(engine, max_batch=4)
    results = batch.generate_many(CHAT_PROMPTS[:4], drafter="lookup", max_new_tokens=24)
    assert any(r.token_ids != s.token_ids for r, s in zip(results, solo))


def test_draft_model_and_tree_drafters_in_a_batch_give_the_solo_output():
    """Tiny int8 target with a draft model: chains and trees from per-request draft caches, in one batch."""
    from specdecode.batch import BatchEngine
    from specdecode.engine import Engine
    from testlib import as_loaded, perturbed_copy

    target = model_for("float32", "llama-gqa")
    draft = perturbed_copy(target, noise=0.02, seed=5)
    _to_quant_weights(target)
    engine = Engine(as_loaded(target, name="target"), as_loaded(draft, name="draft"), max_context=128)
    prompts = [[(7 * i + j) % 200 + 3 for j in range(5 + 3 * i)] for i in range(6)]
    drafters = ["draft", "tree", "auto", "draft", "lookup", "tree"]
    solo = [engine.generate(p, drafter="none", max_new_tokens=30) for p in prompts]
    batch = BatchEngine(engine, max_batch=4)
    results = staggered(batch, prompts, lambda i: dict(drafter=drafters[i], max_new_tokens=30), first=2, after=1)
    for i, (s, r) in enumerate(zip(solo, results)):
        assert r.token_ids == s.token_ids, f"request {i} ({drafters[i]})"
