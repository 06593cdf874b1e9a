"""speculative_step: one propose / verify / roll-back, and the origin of each token it returns."""
import pytest
import torch

from specdecode.drafters.lookup import PromptLookupDrafter
from specdecode.sampling import SamplingParams
from specdecode.step import speculative_step, step_origins
from testlib import make_tiny_model, reference_greedy

GREEDY = SamplingParams()


@pytest.mark.parametrize("accepted, drafted, expected", [
    (0, 0, ["plain"]),
    (0, 3, ["recovered"]),
    (2, 3, ["accepted", "accepted", "recovered"]),
    (3, 3, ["accepted", "accepted", "accepted", "bonus"]),
])
def test_origins_name_each_token(accepted, drafted, expected):
    assert step_origins(accepted, drafted) == expected


def test_a_step_extends_the_sequence_as_plain_decoding_would_and_rolls_the_cache_back():
    model = make_tiny_model(seed=40)
    prompt = [3, 7, 3, 7, 3, 7, 3]
    expected = reference_greedy(model, prompt, 12)
    cache = model.new_cache(64)
    model(torch.tensor(prompt[:-1]), cache, logits="none")
    sequence = list(prompt)
    drafter = PromptLookupDrafter()
    noise = GREEDY.noise()
    while len(sequence) < len(prompt) + 12:
        step = speculative_step(model, cache, drafter, sequence, 4, GREEDY, noise)
        assert len(step.origins) == len(step.tokens) == step.accepted + 1
        assert step.block_size == 1 + len(step.draft.tokens)
        sequence += step.tokens
        assert cache.length == len(sequence) - 1  # the cache holds every confirmed token but the last
    assert sequence[len(prompt):len(prompt) + 12] == expected


def test_tree_drafts_record_the_same_logprobs_as_plain_decoding():
    """The tree branch of judge_block returned no log-probabilities: a `drafter: tree` request with logprobs got
    none for its tree steps, and the list came out shorter than the tokens and out of step with them."""
    from specdecode.controls import LogitControls
    from specdecode.engine import Engine
    from testlib import as_loaded, fake_tokenizer, perturbed_copy

    model = make_tiny_model(seed=0, vocab_size=256, context_length=256)
    tokenizer = fake_tokenizer(256)
    engine = Engine(as_loaded(model, tokenizer), as_loaded(perturbed_copy(model, 0.05, seed=1), tokenizer, "draft"),
                    max_context=256)
    prompt, controls = list(range(10, 40)), LogitControls(logprobs=2)
    plain = engine.generate(prompt, drafter=None, max_new_tokens=24, controls=controls)
    tree = engine.generate(prompt, drafter="tree", k=4, max_new_tokens=24, controls=controls)
    assert tree.stats.origins["accepted"] > 0, "the tree drafts were never accepted: nothing checked"
    assert tree.token_ids == plain.token_ids and len(tree.logprobs) == len(tree.token_ids)
    assert tree.logprobs == plain.logprobs  # bitwise: each row scored as a single-row pass scores it
