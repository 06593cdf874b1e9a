"""End to end on the GPU path: every drafter's greedy output is plain decoding's token for token, a seeded sampled
run is the seeded plain run, and requests arriving at any moment into one batch get their solo output. Tiny models
through the Triton kernels (the interpreter on a CPU); a broken twin (block rows that see the whole block) must
change some output."""
from __future__ import annotations

import functools

import pytest

from specdecode.batch import BatchEngine
from specdecode.engine import Engine
from specdecode.gpu.exact_pass import KEYS, PREFIX, ExactPass
from specdecode.sampling import SamplingParams
from gpu_models import CONTEXT, on_gpu_path, tiny_target_and_draft
from testlib import TINY_CONFIGS, as_loaded, fake_tokenizer, make_tiny_model, perturbed_copy

PROMPT = [17, 3, 99, 250, 3, 17, 42, 8, 200, 5, 17, 3]
NEW_TOKENS = 12
DRAFTERS = [("draft", 4), ("tree", 3), ("lookup", 4), ("auto", 3)]
CHAIN_DRAFTERS = [("draft", 3), ("lookup", 3)]  # the tree drafter is greedy only


class BlockSeesItself(ExactPass):
    """Broken: every row of a multi-row pass attends the whole block (a causal mask forgotten)."""

    def forward(self, meta, pool, *args):
        if meta.shape[1] > 1:
            meta = meta.clone()
            meta[KEYS] = meta[PREFIX] = meta[KEYS].max()
        return super().forward(meta, pool, *args)


@functools.lru_cache(maxsize=None)
def engine(twin: bool = False) -> Engine:
    if twin:
        target = make_tiny_model(seed=9, max_positions=CONTEXT, **TINY_CONFIGS["qwen2-gqa-bias"])
        draft = perturbed_copy(target, 0.05, seed=3, max_positions=CONTEXT)
        target, draft = on_gpu_path(target, BlockSeesItself), on_gpu_path(draft)
    else:
        target, draft = tiny_target_and_draft()
    tokenizer = fake_tokenizer(target.config.vocab_size)
    return Engine(as_loaded(target, tokenizer, "target"), as_loaded(draft, tokenizer, "draft"), max_context=CONTEXT,
                  check_invariants=True)


@functools.lru_cache(maxsize=None)
def looping_engine() -> Engine:
    """A target whose next token follows mostly from the current one (small layers beside a sharp tied head), so
    its output repeats and prompt lookup's copies are accepted: a lookup check must verify copied tokens."""
    target = make_tiny_model(seed=9, scale=0.05, max_positions=CONTEXT, **TINY_CONFIGS["qwen2-tied"])
    target.embed.data *= 40
    target = on_gpu_path(target)
    return Engine(as_loaded(target, fake_tokenizer(target.config.vocab_size), "target"), max_context=CONTEXT,
                  check_invariants=True)


def engine_for(drafter: str) -> Engine:
    return looping_engine() if drafter == "lookup" else engine()


@functools.lru_cache(maxsize=None)
def plain(sampled: bool, drafter: str = "draft") -> list[int]:
    return engine_for(drafter).generate(PROMPT, drafter="none", max_new_tokens=NEW_TOKENS,
                                        sampling=sampling(sampled)).token_ids


def sampling(sampled: bool) -> SamplingParams:
    return SamplingParams(temperature=0.9, top_p=0.95, seed=11) if sampled else SamplingParams()


@pytest.mark.parametrize("drafter,k,sampled", [(d, k, False) for d, k in DRAFTERS] + [(d, k, True) for d, k in CHAIN_DRAFTERS])
def test_every_drafter_gives_plain_decodings_tokens(drafter, k, sampled):
    result = engine_for(drafter).generate(PROMPT, drafter=drafter, k=k, max_new_tokens=NEW_TOKENS,
                                          sampling=sampling(sampled))
    assert result.token_ids == plain(sampled, drafter)
    # rejected drafts test only each verify block's first row: some must be kept
    assert result.stats.accepted > 0, f"none of {result.stats.drafted} drafted tokens was accepted"


def test_the_identity_check_catches_a_block_that_sees_itself():
    twin = engine(twin=True)
    plain_twin = twin.generate(PROMPT, drafter="none", max_new_tokens=NEW_TOKENS).token_ids
    outputs = [twin.generate(PROMPT, drafter=d, k=k, max_new_tokens=NEW_TOKENS).token_ids for d, k in DRAFTERS[:2]]
    assert any(out != plain_twin for out in outputs)


def test_requests_arriving_at_any_moment_get_their_solo_output():
    """Four requests (plain, draft model, tree, lookup; two seeded), arriving over three passes, in one batch that
    hands out each step's event during the next pass, as a batch on a GPU does (overlap)."""
    eng = engine()
    prompts = [PROMPT, PROMPT[3:] + [9, 9], [5, 6, 7, 5, 6, 7, 5], PROMPT[::-1]]
    settings = [dict(drafter="none"), dict(drafter="draft", k=3, sampling=sampling(True)), dict(drafter="tree", k=2),
                dict(drafter="lookup", k=3, sampling=SamplingParams(temperature=0.7, seed=4))]
    solo = [eng.generate(p, max_new_tokens=10, **{**s, "drafter": "none"}).token_ids for p, s in zip(prompts, settings)]
    batch = BatchEngine(eng, max_batch=4, prefill_rows=8, overlap=True)
    tickets = [batch.submit(prompts[0], max_new_tokens=10, **settings[0])]
    for prompt, setting in zip(prompts[1:], settings[1:]):
        batch.step()
        tickets.append(batch.submit(prompt, max_new_tokens=10, **setting))
    batch.run()
    assert [t.result().token_ids for t in tickets] == solo
    assert batch.passes < sum(t.result().stats.target_passes for t in tickets)  # passes were shared
