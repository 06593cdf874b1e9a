"""A batch that judges its chains together where their logits are (BatchEngine device_verdicts, accept.py, forced
here on the CPU's int8 path through the torch reference; the seeded request's rows join as on the GPU path) gives
every request the tokens it gets alone: draft-model chains, trees (still judged on the host from their argmaxes), lookup and auto
drafts, requests that draft nothing, a seeded sampled request and a greedy one recording logprobs, arriving over
several passes. The broken twins (a rejected draft token accepted too; the next token from the block's first row)
must change some request's tokens. tests/gpu/test_triton_identity.py runs the Triton kernel's path the same way."""
from __future__ import annotations

import functools

import pytest

from specdecode import accept
from specdecode import batch as batch_module
from specdecode.batch import BatchEngine
from specdecode.controls import LogitControls
from specdecode.engine import Engine
from specdecode.models.loader import _to_quant_weights
from specdecode.sampling import SamplingParams
from test_accept import next_from_the_first_row, off_by_one
from testlib import TINY_CONFIGS, as_loaded, make_tiny_model, perturbed_copy

PROMPTS = [[(7 * i + j) % 200 + 3 for j in range(5 + 3 * i)] for i in range(7)]
SETTINGS = [dict(drafter="draft", k=2), dict(drafter="tree", k=3), dict(drafter="none"), dict(drafter="lookup", k=4),
            dict(drafter="draft", k=5), dict(drafter="draft", sampling=SamplingParams(temperature=0.8, seed=3)),
            dict(drafter="draft", k=3, controls=LogitControls(logprobs=2))]
NEW_TOKENS = 24


@functools.lru_cache(maxsize=None)
def engine() -> Engine:
    """A tiny int8 target with a draft model of it (its weights plus noise: it drafts well, and misses too)."""
    target = make_tiny_model(seed=9, **TINY_CONFIGS["llama-gqa"])
    draft = perturbed_copy(target, noise=0.02, seed=5)
    _to_quant_weights(target)
    return Engine(as_loaded(target, name="target"), as_loaded(draft, name="draft"), max_context=128)


@functools.lru_cache(maxsize=None)
def solo() -> list[tuple[list[int], list]]:
    return [tokens_and_logprobs(engine().generate(p, max_new_tokens=NEW_TOKENS, **{**s, "drafter": "none"}))
            for p, s in zip(PROMPTS, SETTINGS)]


def tokens_and_logprobs(result):
    return result.token_ids, [(lp.token, lp.logprob) for lp in result.logprobs or []]


@pytest.fixture(autouse=True)
def every_draft_verified_by_torch(monkeypatch):
    """The batch keeps every draft (batch_plan.trim_drafts cuts them by timings; a tiny model's rows cost nearly
    nothing next to the pass, so most would go): each pass then judges drafts of every length."""
    monkeypatch.setattr(batch_module, "trim_drafts", lambda *args: None)
    # the torch reference judges here, also where tests/gpu has turned Triton's interpreter on in this process
    monkeypatch.setattr(accept, "kernel_runs", lambda device: False)
    # and the seeded request's rows join the pass's read as on the GPU path (raced on the host: the same draws)
    monkeypatch.setattr(batch_module, "draws_join", lambda model: True)


def batched(device_verdicts: bool) -> list[tuple[list[int], list]]:
    """The prompts into one batch of 5: three at once, then one a pass."""
    batch = BatchEngine(engine(), max_batch=5, device_verdicts=device_verdicts)
    tickets = [batch.submit(p, max_new_tokens=NEW_TOKENS, **s) for p, s in zip(PROMPTS[:3], SETTINGS[:3])]
    for prompt, settings in zip(PROMPTS[3:], SETTINGS[3:]):
        batch.step()
        tickets.append(batch.submit(prompt, max_new_tokens=NEW_TOKENS, **settings))
    batch.run()
    return [tokens_and_logprobs(t.result()) for t in tickets]


def test_chains_judged_together_give_each_request_its_solo_tokens(monkeypatch):
    judged, mixed = [], []  # every verdict the device gave, with its draft's length; reads that held a tree's too
    real = accept.greedy_verdicts

    def spy(logits, firsts, drafts, argmaxes=False, method=None, draws=None):
        verdicts, picked = real(logits, firsts, drafts, argmaxes, method, draws)
        judged.extend((len(draft), verdict.accepted) for draft, verdict in zip(drafts, verdicts))
        mixed.append(argmaxes and bool(drafts))
        sampled.append(draws is not None)
        return verdicts, picked

    sampled = []  # whether a read held a seeded request's draws

    monkeypatch.setattr(accept, "greedy_verdicts", spy)
    got = batched(device_verdicts=True)
    for i, (want, have) in enumerate(zip(solo(), got)):
        assert have == want, f"request {i} ({SETTINGS[i]}) changed in the batch"
    # the device judged drafts it accepted whole, drafts it rejected, and requests that drafted nothing
    assert any(k > 0 and a == k for k, a in judged) and any(a < k for k, a in judged) and any(k == 0 for k, _ in judged)
    assert any(mixed)  # and chains beside a tree, whose argmaxes came in the same read
    assert any(sampled)  # and the seeded request's chains against its draws


def test_the_host_judges_the_same():
    """The chains' choices (argmaxes, the seeded request's draws) read at once and compared on the host."""
    assert batched(device_verdicts=False) == solo()


@pytest.mark.parametrize("twin", [off_by_one, next_from_the_first_row])
def test_the_batch_check_catches_device_verdicts_one_row_off(twin, monkeypatch):
    monkeypatch.setattr(accept, "verdicts_torch", twin(accept.verdicts_torch))
    assert batched(device_verdicts=True) != solo()


def test_the_batch_check_catches_draws_one_position_late(monkeypatch):
    """The seeded request's rows raced one sequence position late (its draws are then another seed's text)."""
    choose_rows = accept.choose_rows  # where a batch's seeded draws race (accept.seeded_draws)
    monkeypatch.setattr(accept, "choose_rows", lambda probs, positions, noises, device_kernel=None:
                        choose_rows(probs, [p + 1 for p in positions], noises, device_kernel))
    assert batched(device_verdicts=True)[5] != solo()[5]
    assert batched(device_verdicts=False)[5] != solo()[5]
