"""Drafters: prompt lookup and the draft model, on their own (no engine)."""
import pytest
import torch

from specdecode.drafters.base import Draft, Drafter, StopRule
from specdecode.drafters.draft_model import DraftModelDrafter, common_prefix_len
from specdecode.drafters.lookup import PromptLookupDrafter, match_confidence
from specdecode.policy import MinConfidenceRule
from specdecode.sampling import SamplingParams, probabilities
from testlib import make_tiny_model, reference_greedy, token_by_token

GREEDY = SamplingParams()


def gen(seed=0):
    return SamplingParams(temperature=1.0, seed=seed).noise()


# --------------------------------------------------------------------------- prompt lookup
def test_lookup_copies_what_followed_the_latest_match_of_the_longest_ngram():
    drafter = PromptLookupDrafter(max_ngram=3)
    #          0  1  2  3  4  5  6  7  8  9  10 11
    context = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3]
    # "2 3" occurs at 1 and 5; the most recent earlier one (5) wins -> 5, 6, 7
    assert drafter.propose(context, 3, GREEDY, gen()).tokens == [5, 6, 7]
    # a longer n-gram beats a more recent shorter one: "1 2 3" at 0 -> 4, 9
    assert drafter.propose([1, 2, 3, 4, 9, 2, 3, 8, 1, 2, 3], 2, GREEDY, gen()).tokens == [4, 9]


def test_lookup_limits_the_draft_to_k_and_to_the_available_text():
    drafter = PromptLookupDrafter()
    context = [7, 8, 1, 2, 3, 7, 8]
    assert drafter.propose(context, 2, GREEDY, gen()).tokens == [1, 2]
    assert drafter.propose(context, 10, GREEDY, gen()).tokens == [1, 2, 3, 7, 8]


def test_lookup_without_a_match_or_with_no_budget_proposes_nothing():
    drafter = PromptLookupDrafter()
    assert drafter.propose([1, 2, 3, 4, 5], 4, GREEDY, gen()).tokens == []
    assert drafter.propose([1, 2, 1, 2], 0, GREEDY, gen()).tokens == []
    assert drafter.propose([3], 4, GREEDY, gen()).tokens == []


def test_lookup_never_matches_the_suffix_with_itself():
    drafter = PromptLookupDrafter(max_ngram=4, min_ngram=2)
    assert drafter.propose([5, 6, 7, 8], 3, GREEDY, gen()).tokens == []
    assert drafter.propose([5, 5, 5, 5], 3, GREEDY, gen()).tokens == [5]


def test_lookup_prefers_the_occurrence_whose_match_reaches_furthest_back():
    drafter = PromptLookupDrafter(max_ngram=2)
    #          0  1  2  3  4  5  6  7  8  9  10 11 12
    context = [4, 1, 2, 3, 9, 8, 1, 2, 3, 7, 4, 1, 2]
    # "1 2" ends at 2 and 7; only the one at 2 is preceded by 4 as the suffix is, so its match is longer
    draft = drafter.propose(context, 2, GREEDY, gen())
    assert draft.tokens == [3, 9]
    assert draft.confidences == [match_confidence(3), match_confidence(4)]


def test_lookup_index_follows_a_growing_context_and_restarts_on_a_new_one():
    drafter = PromptLookupDrafter()
    context = [1, 2, 3, 4]
    assert drafter.propose(context, 2, GREEDY, gen()).tokens == []
    context += [1, 2]
    assert drafter.propose(context, 2, GREEDY, gen()).tokens == [3, 4]
    assert drafter.propose([9, 8, 9], 2, GREEDY, gen()).tokens == [8, 9]  # another sequence: index rebuilt


class _Rule(StopRule):
    """Keeps a token while the predicted chance that the whole copy survives stays above a floor."""

    def __init__(self, floor):
        self.floor = floor

    def acceptance(self, confidence):
        return confidence

    def keep(self, drafted, chain_prob, confidence):
        return chain_prob * confidence > self.floor


def test_lookup_stop_rule_ends_the_copy_where_it_stops_paying():
    drafter = PromptLookupDrafter()
    context = [5, 6, 7, 8, 9, 10, 11, 12, 5]
    assert len(drafter.propose(context, 8, GREEDY, gen()).tokens) == 8  # no rule: the whole follow
    assert len(drafter.propose(context, 8, GREEDY, gen(), _Rule(0.0)).tokens) == 8
    # 1/3 * 2/4 * 3/5 * 4/6 = 0.067, then * 5/7 = 0.048
    assert drafter.propose(context, 8, GREEDY, gen(), _Rule(0.05)).tokens == [6, 7, 8, 9]
    # even the first token (match of one: 1/3) does not pay
    assert drafter.propose(context, 8, GREEDY, gen(), _Rule(0.5)).tokens == []


def test_lookup_draft_has_no_distributions():
    draft = PromptLookupDrafter().propose([1, 2, 1], 3, SamplingParams(temperature=1.0), gen())
    assert draft.tokens == [2, 1] and draft.forward_passes == 0


@pytest.mark.parametrize("bad", [dict(max_ngram=0), dict(min_ngram=0), dict(max_ngram=2, min_ngram=3)])
def test_lookup_rejects_bad_ngram_sizes(bad):
    with pytest.raises(ValueError):
        PromptLookupDrafter(**bad)


def test_base_drafter_interface():
    assert Draft().tokens == [] and Draft().forward_passes == 0
    with pytest.raises(NotImplementedError):
        Drafter().propose([1], 1, GREEDY, gen())


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2


# --------------------------------------------------------------------------- draft model
@pytest.fixture(scope="module")
def model():
    return make_tiny_model(seed=40, arch="qwen2", max_positions=64)


CONTEXT = [3, 14, 15, 92, 65, 35, 89, 79]


def test_greedy_proposal_is_the_draft_models_own_greedy_continuation(model):
    drafter = DraftModelDrafter(model, max_len=64)
    draft = drafter.propose(CONTEXT, 6, GREEDY, gen())
    assert draft.tokens == reference_greedy(model, CONTEXT, 6)
    assert draft.forward_passes == 6
    # the cache holds the context and every proposed token but the last (never fed)
    assert drafter.cache.length == len(drafter.cached) == len(CONTEXT) + 5
    assert drafter.cached == CONTEXT + draft.tokens[:-1]


def test_sync_rolls_the_draft_cache_back_to_the_confirmed_prefix(model):
    drafter = DraftModelDrafter(model, max_len=64)
    draft = drafter.propose(CONTEXT, 5, GREEDY, gen())
    confirmed = CONTEXT + draft.tokens[:2] + [200]  # two accepted, then a correction
    drafter.sync(confirmed)
    assert drafter.cached == CONTEXT + draft.tokens[:2]
    assert drafter.cache.length == len(drafter.cached)
    # the next proposal continues from the confirmed sequence as a fresh drafter would
    again = drafter.propose(confirmed, 4, GREEDY, gen())
    assert again.tokens == reference_greedy(model, confirmed, 4)
    assert drafter.cached == confirmed + again.tokens[:-1]


def test_proposal_after_an_unrelated_context_matches_a_fresh_drafter(model):
    drafter = DraftModelDrafter(model, max_len=64)
    drafter.propose(CONTEXT, 5, GREEDY, gen())
    other = [1, 2, 3, 4]
    reused = drafter.propose(other, 4, GREEDY, gen()).tokens
    assert reused == DraftModelDrafter(model, max_len=64).propose(other, 4, GREEDY, gen()).tokens
    drafter.reset()
    assert drafter.cache.length == 0 and drafter.cached == []


def test_k_is_capped_by_the_room_in_the_draft_cache(model):
    drafter = DraftModelDrafter(model, max_len=12)
    assert len(drafter.propose(CONTEXT, 8, GREEDY, gen()).tokens) == 12 - len(CONTEXT)
    assert drafter.cache.length <= 12
    assert drafter.propose(list(range(12)), 3, GREEDY, gen()).tokens == []


def test_sampled_proposals_are_the_seeded_draws_from_the_processed_rows(model):
    drafter = DraftModelDrafter(model, max_len=64)
    sampling = SamplingParams(temperature=1.0, top_k=20)
    draft = drafter.propose(CONTEXT, 5, sampling, gen(1))
    assert len(draft.tokens) == 5 and draft.forward_passes == 5
    # each token is the seeded draw at its sequence position from the row processed exactly like the target's
    logits, _ = token_by_token(model, torch.tensor(CONTEXT + draft.tokens))
    for i, token in enumerate(draft.tokens):
        row = probabilities(logits[len(CONTEXT) - 1 + i][None], sampling)[0]
        assert (row > 0).sum() == 20 and row[token] > 0
        assert token == gen(1).choose(row, len(CONTEXT) + i)
    # same seed, same proposal
    assert DraftModelDrafter(model, max_len=64).propose(CONTEXT, 5, sampling, gen(1)).tokens == draft.tokens


def test_min_confidence_stops_drafting_early(model):
    drafter = DraftModelDrafter(model, max_len=64)
    draft = drafter.propose(CONTEXT, 6, GREEDY, gen(), MinConfidenceRule(1.0))
    assert len(draft.tokens) == 1  # the first token is always proposed
    assert len(drafter.propose(CONTEXT, 6, GREEDY, gen(), MinConfidenceRule(0.0)).tokens) == 6


def test_chunked_prefill_of_a_long_context(model):
    long_context = [(i * 37 + 11) % 256 for i in range(40)]
    chunked = DraftModelDrafter(model, max_len=64, prefill_chunk=7)
    whole = DraftModelDrafter(model, max_len=64)
    assert chunked.propose(long_context, 4, GREEDY, gen()).tokens == whole.propose(long_context, 4, GREEDY, gen()).tokens
    assert chunked.cache.length == len(chunked.cached) == 43


class ScriptedStopRule(StopRule):
    """keep/extend answers read from lists, so a test can end the chain exactly where it wants."""

    def __init__(self, keep, extend):
        self._keep, self._extend = list(keep), list(extend)
        self.calls = []

    def acceptance(self, confidence):
        return confidence

    def keep(self, drafted, chain_prob, confidence):
        self.calls.append(("keep", drafted, chain_prob, confidence))
        return self._keep.pop(0)

    def extend(self, drafted, chain_prob, confidence):
        self.calls.append(("extend", drafted, chain_prob, confidence))
        return self._extend.pop(0)


def test_stop_rule_refusing_the_first_token_wastes_one_pass_and_drafts_nothing(model):
    drafter = DraftModelDrafter(model, max_len=64)
    draft = drafter.propose(CONTEXT, 6, GREEDY, gen(), ScriptedStopRule(keep=[False], extend=[]))
    assert draft.tokens == [] and draft.forward_passes == 1


def test_stop_rule_ends_the_chain_and_tracks_the_chain_probability(model):
    full = DraftModelDrafter(model, max_len=64).propose(CONTEXT, 6, GREEDY, gen())
    drafter = DraftModelDrafter(model, max_len=64)
    rule = ScriptedStopRule(keep=[True, True, False], extend=[True, True])
    draft = drafter.propose(CONTEXT, 6, GREEDY, gen(), rule)
    assert draft.tokens == full.tokens[:2]  # the same tokens, only fewer of them
    assert draft.forward_passes == 3  # the third token's pass was spent, then refused
    assert len(draft.confidences) == 2 and all(0 < c <= 1 for c in draft.confidences)
    # chain_prob passed to keep is the product of the (identity) calibration of the kept tokens
    keep_calls = [c for c in rule.calls if c[0] == "keep"]
    assert keep_calls[0][2] == 1.0
    assert keep_calls[2][2] == pytest.approx(draft.confidences[0] * draft.confidences[1])
    # extend refusing also ends it, without the extra pass
    short = drafter.propose(CONTEXT, 6, GREEDY, gen(), ScriptedStopRule(keep=[True], extend=[False]))
    assert short.tokens == full.tokens[:1] and short.forward_passes == 1
