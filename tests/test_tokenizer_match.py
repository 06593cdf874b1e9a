"""Draft and target tokenizers: the same tokenizer with embedding tables padded to different lengths works (the
draft never proposes a padding row); tokenizers that really differ (vocabulary, merges, special tokens) are refused
in one line before anything is drafted. Real tokenizers (smollm2's, Qwen2.5's) and padded tiny models."""
from __future__ import annotations

import functools
import json

import pytest

from specdecode.engine import Engine, check_same_tokenizer
from specdecode.errors import ModelError
from specdecode.models.transformer import Transformer
from specdecode.tokenizer import Tokenizer
from testlib import QWEN_05B, SMOLLM2, as_loaded, make_tiny_model


@functools.lru_cache(maxsize=None)
def real_tokenizer(name: str) -> Tokenizer:
    """A registry model's tokenizer as load_model builds it (from its converted GGUF: padded to the embedding)."""
    from specdecode import registry
    from specdecode.models.loader import _load_hf_tokenizer, convert_gguf

    return Tokenizer.from_hf(_load_hf_tokenizer(convert_gguf(registry.pull(name), quiet=True) / "tokenizer"))


def variant(tokenizer: Tokenizer, change) -> Tokenizer:
    """The tokenizer with its tokenizer.json edited by `change` (a real fast tokenizer, rebuilt)."""
    from tokenizers import Tokenizer as Backend
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.hf.backend_tokenizer.to_str())
    change(spec)
    return Tokenizer.from_hf(PreTrainedTokenizerFast(tokenizer_object=Backend.from_str(json.dumps(spec))))


def drop_a_merge(spec):
    del spec["model"]["merges"][1000]


def unmark_im_end(spec):
    for added in spec["added_tokens"]:
        if added["content"] == "<|im_end|>":
            added["special"] = False


def loaded(model, tokenizer, name):
    return as_loaded(model, tokenizer, name)


def test_really_different_tokenizers_are_refused_in_one_line():
    smollm2, qwen = real_tokenizer(SMOLLM2), real_tokenizer(QWEN_05B)
    assert "different vocabularies: 49152 vs 151665 tokens" in smollm2.difference(qwen)
    rebuilt = variant(qwen, lambda spec: None)
    assert qwen.difference(rebuilt) is None, "the same tokenizer rebuilt (without its GGUF padding) must agree"
    assert qwen.difference(variant(qwen, drop_a_merge)) == "the same vocabulary but different merges"
    assert "different special tokens: id 151645" in qwen.difference(variant(qwen, unmark_im_end))
    target = loaded(make_tiny_model(seed=1, vocab_size=64), qwen, "qwen-tiny")
    draft = loaded(make_tiny_model(seed=2, vocab_size=64), smollm2, "smollm2-tiny")
    with pytest.raises(ModelError, match=r"draft 'smollm2-tiny' and target 'qwen-tiny' use different tokenizers"
                                         r" \(different vocabularies.*speculation needs the same one") as info:
        Engine(target, draft, max_context=64)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- padded embedding tables
QWEN_05B_ROWS, QWEN_7B_ROWS = 151936, 152064


def padded_pair(target_rows: int, draft_rows: int):
    """A tiny target and a draft that is the target's own weights (a strong draft) with a table of another length.
    The draft's real-token logits are shrunk and its extra rows left large, so a draft that could propose its
    padding rows would (every time)."""
    target = make_tiny_model(seed=5, vocab_size=target_rows, hidden_size=32, intermediate_size=64, n_heads=2,
                             n_kv_heads=1, head_dim=16, context_length=128)
    config = target.config.__class__(**{**target.config.__dict__, "vocab_size": draft_rows})
    draft = make_tiny_model(seed=6, vocab_size=draft_rows, hidden_size=32, intermediate_size=64, n_heads=2,
                            n_kv_heads=1, head_dim=16, context_length=128)
    assert draft.config == config
    shared = min(target_rows, draft_rows)
    for (name, mine), (_, theirs) in zip(draft.named_parameters(), target.named_parameters()):
        if name in ("embed", "lm_head"):
            mine.data[:shared] = theirs.data[:shared]
        else:
            mine.data = theirs.data.clone()
    draft.lm_head.data[:shared] *= 0.01  # argmax among real tokens unchanged; the padding rows now dominate
    return target, draft


def generate(target, draft, tokenizer, drafter, frequent_vocabulary=False):
    """frequent_vocabulary: the draft scores Qwen's frequent tokens only (the engine's default, drafters/vocab.py),
    which leaves the padding rows out by itself; off, only the limit keeps them out."""
    from specdecode.engine import DRAFT_VOCAB

    prompt = [(37 * i + 11) % 1000 for i in range(16)]
    engine = Engine(loaded(target, tokenizer, "target"), loaded(draft, tokenizer, "draft") if draft else None,
                    max_context=128, check_invariants=True, draft_vocab=DRAFT_VOCAB if frequent_vocabulary else None)
    return engine.generate(prompt, drafter=drafter, k=4, max_new_tokens=30)


@pytest.mark.parametrize("target_rows, draft_rows", [(QWEN_05B_ROWS, QWEN_7B_ROWS), (QWEN_7B_ROWS, QWEN_05B_ROWS)],
                         ids=["draft-padded-longer", "draft-padded-shorter"])
@pytest.mark.parametrize("drafter, frequent", [("draft", False), ("tree", False), ("draft", True)],
                         ids=["chain", "tree", "chain-frequent-vocabulary"])
def test_padded_tables_speculate_exactly(target_rows, draft_rows, drafter, frequent):
    qwen = real_tokenizer(QWEN_05B)
    target, draft = padded_pair(target_rows, draft_rows)
    plain = generate(target, None, qwen, "none").token_ids
    result = generate(target, draft, qwen, drafter, frequent)
    assert result.token_ids == plain
    assert result.stats.drafted > 0 and result.stats.accepted > 0  # the draft drafted, and well
    assert draft.vocab_limit == (qwen.real_vocab_end if draft_rows > qwen.real_vocab_end else None)


def test_broken_twin_a_draft_that_may_propose_its_padding_rows_fails(monkeypatch):
    """Without the limit the longer draft proposes ids the target has no row for: the run breaks."""
    qwen = real_tokenizer(QWEN_05B)
    target, draft = padded_pair(QWEN_05B_ROWS, QWEN_7B_ROWS)
    plain = generate(target, None, qwen, "none").token_ids
    monkeypatch.setattr(Transformer, "set_vocab_limit", lambda self, limit: None)
    try:
        broken = generate(target, draft, qwen, "draft").token_ids
    except (IndexError, RuntimeError, AssertionError):
        return
    assert broken != plain, "the draft's padding rows were never proposed: the twin tests nothing"


def test_a_target_token_past_the_drafts_rows_stops_drafting_not_the_run():
    """A prompt id in the target's padding (which the shorter draft has no row for): plain output, no crash."""
    qwen = real_tokenizer(QWEN_05B)
    target, draft = padded_pair(QWEN_7B_ROWS, QWEN_05B_ROWS)
    prompt = [5, 6, QWEN_05B_ROWS + 3, 7, 8]
    plain = Engine(loaded(target, qwen, "t"), max_context=128).generate(prompt, drafter="none", max_new_tokens=10)
    spec = Engine(loaded(target, qwen, "t"), loaded(draft, qwen, "d"), max_context=128, check_invariants=True)
    assert spec.generate(prompt, drafter="draft", k=4, max_new_tokens=10).token_ids == plain.token_ids


def test_the_limit_is_computed_from_the_real_tokens():
    qwen = real_tokenizer(QWEN_05B)
    assert qwen.real_vocab_end == 151665 and qwen.vocab_size == QWEN_05B_ROWS  # GGUF: padded with [PAD<id>]
    target, draft = padded_pair(QWEN_05B_ROWS, QWEN_7B_ROWS)
    assert check_same_tokenizer(loaded(target, qwen, "t"), loaded(draft, qwen, "d")) == 151665
    assert check_same_tokenizer(loaded(target, qwen, "t"), loaded(target, qwen, "t2")) is None
