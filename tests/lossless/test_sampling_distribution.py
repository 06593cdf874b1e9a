"""Sampled speculative output has exactly the target's distribution, and the test can tell when not.

Method: Pearson chi-square goodness of fit of sampled outputs against the EXACT target
distribution (computed, not sampled), cells with expected count < 5 pooled. Every run uses fixed
seeds, so results are deterministic; the threshold p > 1e-3 is the false-alarm rate a correct
verifier would face on fresh seeds (one run in a thousand). Each check is paired with deliberately
broken verifiers, run through the same machinery, that must come out with p < 1e-6: both
directions are asserted, so a test too weak to see a broken verifier fails too.

Two levels:
- unit: `verify_sampling` called directly on fixed target rows p and draft rows q (fast, many
  samples): the k-th emitted token of a step is distributed as p_k;
- end to end: the engine samples 1200-1500 3-token continuations per case from a tiny random model with
  an 8-token vocabulary (draft model, prompt lookup, a deterministic point-mass drafter, top-k/top-p),
  compared with the exact distribution over all 8^3 continuations from the target's processed
  probabilities. K = 2 with 3 new tokens exercises rejection at each position, full acceptance with
  a bonus token, and a second step after an early rejection.
"""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

import specdecode.step as step_module
import specdecode.tuner as tuner_module
from specdecode.drafters.base import Draft, Drafter
from specdecode.engine import Engine
from specdecode.policy import DraftLengthPolicy, DraftStopRule
from specdecode.sampling import PositionNoise, SamplingParams, probabilities
from specdecode.verify import Verdict, verify_sampling
from testlib import as_loaded, chi_square_pvalue, make_tiny_model

PASS_P = 1e-3  # false-alarm rate of the correct-verifier checks
FAIL_P = 1e-6  # a broken verifier must be rejected far beyond doubt


# --------------------------------------------------------------------------- broken verifiers
def accept_everything(target_logits, draft_tokens, params, noise, position):
    """Keeps every draft token: the output follows the draft, not the target."""
    k = len(draft_tokens)
    return Verdict(k, noise.choose(probabilities(target_logits[k : k + 1], params)[0], position + k))


def race_inverted(target_logits, draft_tokens, params, noise, position):
    """Runs the race with p * E instead of p / E: still a function of (seed, position), but not a draw from p."""
    def draw(i):
        p = probabilities(target_logits[i : i + 1], params)[0].numpy()
        support = np.flatnonzero(p > 0)
        return int(support[np.argmax(p[support] * noise.exponentials(position + i, support))])

    for i, token in enumerate(draft_tokens):
        wanted = draw(i)
        if token != wanted:
            return Verdict(i, wanted)
    return Verdict(len(draft_tokens), draw(len(draft_tokens)))


BROKEN = {"accept_everything": accept_everything, "race_inverted": race_inverted}


# --------------------------------------------------------------------------- unit level
VOCAB_UNIT = 6


def unit_rows(seed):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(1.2 * torch.randn(4, VOCAB_UNIT, generator=gen), -1)  # [K+1, V], K = 3
    q = torch.softmax(1.2 * torch.randn(3, VOCAB_UNIT, generator=gen), -1)  # [K, V]
    return p, q


DRAFT_MODES = ["coupled-q", "independent-q", "point-mass"]


def emitted_position_pvalues(verifier, draft_mode: str, samples: int | None = None, seed: int = 0) -> list[float]:
    """Chi-square p-values of "the i-th token emitted by one step ~ p_i", for i = 0, 1, 2.

    Draft token i is a draw from q_i with the target's own noise (as the draft model drafts), with
    unrelated noise, or a fixed token (a point-mass drafter such as prompt lookup). Whatever the draft,
    emitted token i must follow p_i exactly.
    """
    p, q = unit_rows(seed)
    samples = samples or (12000 if draft_mode == "independent-q" else 4000)  # unrelated drafts rarely reach position 2
    params = SamplingParams(temperature=1.0)
    fixed_draft = [int(p[i].argmax()) for i in range(3)]  # likely enough to reach later positions
    counts = [Counter() for _ in range(3)]
    for n in range(samples):
        noise = PositionNoise(seed * 1_000_003 + n)
        if draft_mode == "point-mass":
            draft = fixed_draft
        else:
            draft_noise = noise if draft_mode == "coupled-q" else PositionNoise(10**9 + seed * 1_000_003 + n)
            draft = [draft_noise.choose(q[i], 7 + i) for i in range(3)]
        emitted = verifier(p.log(), draft, params, noise, 7).tokens(draft)
        for i, token in enumerate(emitted[:3]):
            counts[i][token] += 1
    pvalues = []
    for i in range(3):  # positions that enough samples reach (all three for a correct verifier)
        n = sum(counts[i].values())
        if n > 300:
            expected = {token: float(p[i, token]) for token in range(VOCAB_UNIT)}
            pvalues.append(chi_square_pvalue(counts[i], expected, n)[1])
    return pvalues


@pytest.mark.parametrize("draft_mode", DRAFT_MODES)
def test_unit_verify_sampling_emits_target_distribution(draft_mode):
    pvalues = emitted_position_pvalues(verify_sampling, draft_mode)
    print(f"unit correct {draft_mode}: p-values {pvalues}")
    assert len(pvalues) == 3, "too few samples reached a later emitted position"
    assert min(pvalues) > PASS_P, f"p-values per emitted position {pvalues}"


@pytest.mark.parametrize("broken", BROKEN)
@pytest.mark.parametrize("draft_mode", DRAFT_MODES)
def test_unit_statistics_catch_a_broken_verifier(broken, draft_mode):
    pvalues = emitted_position_pvalues(BROKEN[broken], draft_mode)
    print(f"unit {broken} {draft_mode}: p-values {pvalues}")
    assert min(pvalues) < FAIL_P, f"a broken verifier ({broken}) passed: p-values {pvalues}"


# --------------------------------------------------------------------------- end to end
VOCAB = 8
CONTINUATION = 3
PROMPT = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]  # repetitive, so prompt lookup proposes drafts


@pytest.fixture(scope="module")
def pair():
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, n_layers=1, n_heads=4, n_kv_heads=2,
                 head_dim=8, context_length=64)
    target = make_tiny_model(seed=101, scale=0.15, **small)
    draft = make_tiny_model(seed=202, scale=0.15, **small)  # unrelated weights: many rejections
    return target, draft


def exact_distribution(model, prompt, length, sampling) -> dict[tuple, float]:
    """P(continuation) for every continuation of `length` tokens, from the processed target rows."""
    def next_probs(prefix):
        cache = model.new_cache(len(prompt) + length + 1)
        logits = model(torch.tensor(list(prompt) + list(prefix)), cache, logits="last")
        return probabilities(logits, sampling)[0].double()

    dist = {(): 1.0}
    for _ in range(length):
        grown = {}
        for prefix, mass in dist.items():
            if mass == 0.0:
                continue
            row = next_probs(prefix)
            for token in range(model.config.vocab_size):
                if row[token] > 0:
                    grown[prefix + (token,)] = mass * float(row[token])
        dist = grown
    return dist


def sample_continuations(target, draft, drafter, sampling, samples, seed_base, k=2):
    """k="auto" runs the adaptive chain: its stop rule (see VariableStopRule) sets each draft's length."""
    engine = Engine(as_loaded(target), as_loaded(draft), max_context=32, check_invariants=True)
    if drafter == "mode":
        drafter = TargetModeDrafter(target)
    counts = Counter()
    drafted = accepted = bonus = 0
    for i in range(samples):
        params = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, seed=seed_base + i)
        result = engine.generate(PROMPT, drafter=drafter, k=k, sampling=params, max_new_tokens=CONTINUATION)
        assert len(result.token_ids) == CONTINUATION  # no eos in the fake tokenizer
        counts[tuple(result.token_ids)] += 1
        drafted += result.stats.drafted
        accepted += result.stats.accepted
        bonus += result.stats.origins["bonus"]
    return counts, drafted, accepted, bonus


class TargetModeDrafter(Drafter):
    """Deterministic drafter proposing the target's own most likely tokens: a point-mass q that is
    accepted often (prompt lookup on a random model is accepted too rarely to stress the residual)."""

    name = "mode"

    def __init__(self, model):
        self.model = model

    def propose(self, context, k, sampling, generator, stop_rule=None):
        if k <= 0:
            return Draft()
        cache = self.model.new_cache(len(context) + k)
        logits = self.model(torch.tensor(context), cache, logits="last")[0]
        tokens = []
        while True:
            tokens.append(int(logits.argmax()))
            if len(tokens) == k:
                return Draft(tokens)
            logits = self.model(torch.tensor(tokens[-1:]), cache, logits="last")[0]


class VariableStopRule(DraftStopRule):
    """A stop rule driven only by the draft's own distribution, like the real one, but tuned so that on
    the tiny random model chains end at every length 0..K, including after a wasted draft pass."""

    def keep(self, drafted, chain_prob, confidence):
        return int(confidence * 1000) % 4 != 0

    def extend(self, drafted, chain_prob, confidence):
        return int(confidence * 1000) % 3 != 0


E2E_CASES = {
    # name: (drafter, sampling, samples, k)
    "draft-model": ("draft", SamplingParams(temperature=1.0), 1500, 2),
    "lookup-point-mass": ("lookup", SamplingParams(temperature=1.0), 1500, 2),
    "mode-point-mass": ("mode", SamplingParams(temperature=1.0), 1200, 2),
    "draft-model-top-k-top-p": ("draft", SamplingParams(temperature=0.8, top_k=5, top_p=0.9), 1200, 2),
    "draft-model-adaptive-chain": ("draft", SamplingParams(temperature=1.0), 1200, "auto"),
    # prompt lookup with K auto: the stop rule ends each copy by its match-length score (0..K tokens)
    "lookup-adaptive": ("lookup", SamplingParams(temperature=1.0), 1500, "auto"),
    # the default drafter: copies from this sample's text and from earlier samples (the suffix store), else
    # the draft model; each source with its own stop rule
    "auto-adaptive": ("auto", SamplingParams(temperature=1.0), 1200, "auto"),
}


class AlwaysDraftPolicy(DraftLengthPolicy):
    """Adaptive mode that never falls back to plain decoding, whatever the tiny model's costs say."""

    def choose(self):
        return 2 if self.fixed_k is None else self.fixed_k


@pytest.fixture(autouse=True)
def variable_stop_rule(monkeypatch):
    monkeypatch.setattr(tuner_module, "DraftStopRule", VariableStopRule)
    monkeypatch.setattr(tuner_module, "DraftLengthPolicy", AlwaysDraftPolicy)


def run_case(pair, name, seed_base, samples=None):
    target, draft = pair
    drafter, sampling, default_samples, k = E2E_CASES[name]
    samples = samples or default_samples
    exact = exact_distribution(target, PROMPT, CONTINUATION, sampling)
    assert abs(sum(exact.values()) - 1.0) < 1e-5
    assert max(exact.values()) < 0.2, "the test model is too peaked to say much"
    counts, drafted, accepted, bonus = sample_continuations(target, draft, drafter, sampling, samples, seed_base, k)
    stat, pvalue, df = chi_square_pvalue(counts, exact, samples)
    return pvalue, stat, df, drafted, accepted, bonus


@pytest.mark.parametrize("name", E2E_CASES)
def test_engine_samples_follow_the_exact_target_distribution(pair, name):
    pvalue, stat, df, drafted, accepted, bonus = run_case(pair, name, seed_base=10_000)
    print(f"{name}: p = {pvalue:.3g}, chi-square {stat:.1f} on {df} df, alpha {accepted / drafted:.2f}")
    # the speculative paths really ran: acceptances, rejections and bonus tokens all happened
    assert drafted > 0 and 0 < accepted < drafted and bonus > 0, (drafted, accepted, bonus)
    assert pvalue > PASS_P, f"chi-square {stat:.1f} on {df} df, p = {pvalue:.2e}"


@pytest.mark.parametrize(
    "name, broken, samples",
    [("draft-model", "accept_everything", 1000), ("draft-model", "race_inverted", 1000),
     ("mode-point-mass", "race_inverted", 800), ("draft-model-top-k-top-p", "race_inverted", 1500),
     ("draft-model-adaptive-chain", "race_inverted", 1000), ("lookup-adaptive", "accept_everything", 300)],
)
def test_engine_distribution_test_fails_on_a_broken_verifier(pair, name, broken, samples, monkeypatch):
    monkeypatch.setattr(step_module, "verify_sampling", BROKEN[broken])
    pvalue, stat, df, *_ = run_case(pair, name, seed_base=20_000, samples=samples)
    print(f"{name} with {broken}: p = {pvalue:.3g}")
    assert pvalue < FAIL_P, f"broken verifier {broken} passed the {name} test: chi-square {stat:.1f} on {df} df, p = {pvalue:.2e}"


def test_plain_sampling_follows_the_exact_target_distribution(pair):
    """The reference itself: the engine without a drafter samples from the same exact distribution."""
    target, draft = pair
    sampling = SamplingParams(temperature=1.0)
    exact = exact_distribution(target, PROMPT, CONTINUATION, sampling)
    counts, drafted, *_ = sample_continuations(target, draft, "none", sampling, 800, seed_base=50_000)
    assert drafted == 0
    stat, pvalue, df = chi_square_pvalue(counts, exact, 800)
    assert pvalue > PASS_P, f"chi-square {stat:.1f} on {df} df, p = {pvalue:.2e}"


def test_exact_distribution_enumerates_all_continuations(pair):
    target, _ = pair
    exact = exact_distribution(target, PROMPT, 2, SamplingParams(temperature=1.0))
    assert len(exact) == VOCAB**2
    assert set(exact) == set(itertools.product(range(VOCAB), repeat=2))


@pytest.fixture(scope="module")
def int8_pair(pair):
    """The same target with its matrices as Q8_0 blocks times int8 activations (the int8 precision)."""
    from specdecode import kernels
    from specdecode.models.loader import _to_quant_weights
    from testlib import perturbed_copy

    if kernels.load_kernel() is None:
        pytest.skip(f"CPU kernel unavailable: {kernels.kernel_status()}")
    target, draft = pair
    int8_target = perturbed_copy(target, noise=0.0, seed=0)
    _to_quant_weights(int8_target)
    return int8_target, draft


def test_int8_target_samples_follow_its_exact_distribution(int8_pair):
    pvalue, stat, df, drafted, accepted, bonus = run_case(int8_pair, "draft-model", seed_base=30_000)
    assert drafted > 0 and 0 < accepted < drafted and bonus > 0, (drafted, accepted, bonus)
    assert pvalue > PASS_P, f"chi-square {stat:.1f} on {df} df, p = {pvalue:.2e}"


def test_int8_target_distribution_test_fails_on_a_broken_verifier(int8_pair, monkeypatch):
    monkeypatch.setattr(step_module, "verify_sampling", BROKEN["race_inverted"])
    pvalue, stat, df, *_ = run_case(int8_pair, "draft-model", seed_base=40_000, samples=1000)
    assert pvalue < FAIL_P, f"broken verifier passed on the int8 target: chi-square {stat:.1f} on {df} df, p = {pvalue:.2e}"
