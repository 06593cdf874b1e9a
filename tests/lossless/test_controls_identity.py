"""Penalties, logit bias, min-p, grammars and log-probabilities under speculation: the answer with any drafter is
plain decoding's answer with the same controls, token for token, and every log-probability is bitwise the value
plain decoding reports; greedy and seeded, alone and in a batch. Each check has a broken twin that must fail:
rows processed one position off (a mask or penalty applied to the wrong row), penalties that count only
confirmed tokens, and log-probabilities read from the wrong row.
"""
from __future__ import annotations

import json

import pytest

from specdecode import step as step_module
from specdecode import verify as verify_module
from specdecode.controls import LogitControls, RowControls, record_logprobs
from specdecode.engine import Engine
from specdecode.errors import InputError
from specdecode.grammar import GrammarSpec
from specdecode.sampling import PositionNoise, SamplingParams, probabilities
from specdecode.verify import Verdict

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "pets": {"type": "array", "items": {"type": "string", "enum": ["cat", "dog", "fish"]}, "maxItems": 3}},
    "required": ["name", "age", "pets"], "additionalProperties": False}
PROMPT = ("Ann is 31 and has a cat and a dog. Ben is 40 and has a fish. Carl is 25 and has a dog. "
          "Describe Ann as JSON with name, age and pets.")
CASES = {
    "penalties": LogitControls(presence_penalty=0.6, frequency_penalty=0.9, repetition_penalty=1.3, logprobs=3),
    "bias": LogitControls(logit_bias=((29, 4.0), (28, -100.0), (30, 2.5)), logprobs=0),
    "json_schema": LogitControls(grammar=GrammarSpec("json_schema", json.dumps(PERSON)), logprobs=2),
    "json_object": LogitControls(grammar=GrammarSpec("json_object", ""), frequency_penalty=0.3),
}
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05, seed=11)}
DRAFTERS = ("lookup", "draft", "auto", "suffix")


@pytest.fixture(scope="module")
def engine():
    """The real smollm2 on the int8 kernel (the default target's path), its float32 copy as the draft model."""
    from specdecode.models.loader import load_model
    from testlib import SMOLLM2

    target = load_model(SMOLLM2, device="cpu", dtype="int8", max_context=1024)
    draft = load_model(SMOLLM2, device="cpu", dtype="float32", max_context=1024)
    return Engine(target, draft, max_context=1024, check_invariants=True)


def logprob_values(result):
    return [(r.token, r.logprob, r.top) for r in result.logprobs]


def run(engine, drafter, controls, sampling, tokens=48, **kwargs):
    return engine.generate(PROMPT, drafter=drafter, controls=controls, sampling=sampling, max_new_tokens=tokens,
                           **kwargs)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=list(SAMPLINGS))
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_controls_give_plain_output_with_every_drafter(engine, case, sampling):
    controls, params = CASES[case], SAMPLINGS[sampling]
    plain = run(engine, "none", controls, params)
    assert len(plain.token_ids) > 5
    if controls.logprobs is not None:
        assert len(plain.logprobs) == len(plain.token_ids)
        assert all(len(r.top) == controls.logprobs for r in plain.logprobs)
    # Each drafter runs the adaptive K in one sampling mode and a fixed K of 5 in the other: both block shapes per
    # drafter and control, at half the runs of every pair.
    ks = ("auto", 5, "auto", 5) if sampling == "greedy" else (5, "auto", 5, "auto")
    for drafter, k in zip(DRAFTERS, ks):
        got = run(engine, drafter, controls, params, k=k)
        assert got.token_ids == plain.token_ids, (drafter, k)
        assert logprob_values(got) == logprob_values(plain), (drafter, k)


def test_the_controls_change_the_answer(engine):
    """Not a vacuous check: each control makes the plain answer differ from the uncontrolled one."""
    free = run(engine, "none", None, SAMPLINGS["greedy"])
    for case in ("penalties", "bias", "json_schema"):
        assert run(engine, "none", CASES[case], SAMPLINGS["greedy"]).token_ids != free.token_ids, case


def test_a_schema_answer_validates_and_forced_tokens_save_passes(engine):
    controls = LogitControls(grammar=GrammarSpec("json_schema", json.dumps(PERSON)))
    plain = run(engine, "none", controls, SAMPLINGS["greedy"], tokens=120)
    answer = json.loads(plain.text)
    assert set(answer) == {"name", "age", "pets"} and isinstance(answer["age"], int)
    assert plain.finish_reason == "stop"
    for drafter in ("auto", "lookup"):
        spec = run(engine, drafter, controls, SAMPLINGS["greedy"], tokens=120)
        assert spec.token_ids == plain.token_ids
        assert spec.stats.target_passes < plain.stats.target_passes  # forced key names and punctuation, free


def test_controls_in_a_batch_give_each_request_its_solo_output(engine):
    from specdecode.batch import BatchEngine

    settings = [dict(controls=CASES[case], sampling=SAMPLINGS[s], drafter=d)
                for case, s, d in (("penalties", "greedy", "auto"), ("json_schema", "seeded", "lookup"),
                                   ("bias", "seeded", "suffix"), ("json_object", "greedy", "auto"),
                                   ("penalties", "seeded", "lookup"))]
    solo = [run(engine, "none", s["controls"], s["sampling"], tokens=32) for s in settings]
    batch = BatchEngine(engine, max_batch=4)
    tickets = [batch.submit(PROMPT, max_new_tokens=32, **s) for s in settings[:3]]
    batch.step()
    tickets += [batch.submit(PROMPT, max_new_tokens=32, **s) for s in settings[3:]]
    batch.run()
    for i, (ticket, alone) in enumerate(zip(tickets, solo)):
        result = ticket.result()
        assert result.token_ids == alone.token_ids, i
        assert logprob_values(result) == logprob_values(alone), i


# --------------------------------------------------------------------------- broken twins
def verify_chain_broken(push_late: bool):
    """verify_chain with the draft's tokens pushed one row late (push_late: row i sees draft[:i-1], a mask or
    penalty one row off) or never (the rows see only confirmed tokens)."""
    def broken(target_logits, draft_tokens, controls, params, noise, position):
        pushed = 0
        try:
            for i in range(len(draft_tokens) + 1):
                if push_late and i >= 2:
                    controls.push(draft_tokens[i - 2])
                    pushed += 1
                row = controls.process(target_logits[i : i + 1])
                wanted = int(row[0].argmax()) if params.greedy else noise.choose(probabilities(row, params)[0], position + i)
                if i == len(draft_tokens) or draft_tokens[i] != wanted:
                    return Verdict(i, wanted)
        finally:
            controls.undo(pushed)
    return broken


@pytest.mark.parametrize(("case", "push_late"), [("json_schema", True), ("json_schema", False), ("penalties", False)],
                         ids=["mask-one-row-off-json_schema", "confirmed-tokens-only-json_schema",
                              "confirmed-tokens-only-penalties"])
def test_the_identity_check_catches_rows_processed_with_the_wrong_tokens(engine, monkeypatch, case, push_late):
    """End to end, as the identity test runs (its drafters). namespace=None: no drafts copied from the earlier tests'
    answers, so what the drafters propose does not depend on which tests this worker ran before. A penalty one row
    off changes an answer only where the token just drafted is the next token's best candidate, which real text
    rarely makes it: that twin is checked row by row below."""
    controls = CASES[case]
    plain = run(engine, "none", controls, SAMPLINGS["greedy"], namespace=None)
    monkeypatch.setattr(step_module, "verify_chain", verify_chain_broken(push_late))
    # Lazily: the first drafter whose answer differs settles it.
    outputs = (run(engine, drafter, controls, SAMPLINGS["greedy"], k=8, namespace=None).token_ids
               for drafter in ("lookup", "auto", "draft"))
    assert any(out != plain.token_ids for out in outputs)


def plain_row_by_row(logits, controls, params, noise, position):
    """Plain decoding over the same rows: one token at a time, each pushed before the next row is processed."""
    tokens = []
    for i in range(logits.shape[0]):
        row = controls.process(logits[i : i + 1])
        tokens.append(int(row[0].argmax()) if params.greedy else noise.choose(probabilities(row, params)[0], position + i))
        controls.push(tokens[-1])
    controls.undo(len(tokens))
    return tokens


@pytest.mark.parametrize("variant", ["exact", "mask-one-row-off", "confirmed-tokens-only"])
def test_each_row_is_judged_with_the_draft_tokens_before_it(variant):
    """Rows built so that every row's best token is token 3 by a margin a frequency penalty of one occurrence
    outweighs: plain decoding takes 3 once, then 5. A draft of 3s is accepted for exactly one token, and every
    broken variant (the penalty of the token drafted just before missing, or of every drafted token) accepts more."""
    import torch

    logits = torch.zeros(5, 16)
    logits[:, 3], logits[:, 5] = 1.0, 0.5
    spec = LogitControls(frequency_penalty=1.0)
    controls, params, noise = RowControls.start(spec, [1, 2], 16), SamplingParams(), PositionNoise(0)
    expected = plain_row_by_row(logits, controls, params, noise, 0)
    assert expected[:2] == [3, 5]
    chain = verify_module.verify_chain if variant == "exact" else verify_chain_broken(variant == "mask-one-row-off")
    verdict = chain(logits, [3, 3, 3, 3], controls, params, noise, 0)
    assert controls.pushed == []
    if variant == "exact":
        assert (verdict.accepted, verdict.next_token) == (1, expected[1])
    else:
        assert verdict.accepted > 1


def test_the_logprob_check_catches_values_from_the_wrong_row(engine, monkeypatch):
    controls = CASES["json_schema"]  # forced tokens: steps of several tokens
    plain = run(engine, "none", controls, SAMPLINGS["greedy"])
    monkeypatch.setattr(step_module, "record_logprobs",
                        lambda logits, tokens, top: record_logprobs(logits.roll(1, dims=0), tokens, top))
    got = run(engine, "auto", controls, SAMPLINGS["greedy"])
    assert got.token_ids == plain.token_ids
    assert logprob_values(got) != logprob_values(plain)


# --------------------------------------------------------------------------- requests and drafts
def test_bad_controls_are_input_errors(engine):
    with pytest.raises(InputError, match="vocabulary"):
        engine.request(PROMPT, controls=LogitControls(logit_bias=((10**6, 1.0),)))
    with pytest.raises(InputError, match="schema"):
        engine.request(PROMPT, controls=LogitControls(grammar=GrammarSpec("json_schema", "{not json")))
    with pytest.raises(InputError):
        engine.request(PROMPT, controls=LogitControls(grammar=GrammarSpec("lark", "start: (")))
    with pytest.raises(InputError, match="tree"):
        engine.request(PROMPT, drafter="tree", controls=LogitControls(presence_penalty=1.0))
    for bad in (dict(presence_penalty=3.0), dict(repetition_penalty=0.0), dict(logprobs=21),
                dict(logit_bias=((1, 200.0),))):
        with pytest.raises(InputError):
            LogitControls(**bad)
    engine.request(PROMPT, drafter="tree", controls=LogitControls(logprobs=2))  # nothing shapes the rows


def test_drafts_are_cut_where_the_grammar_forbids_and_extended_where_it_forces(engine):
    from specdecode.drafters.base import Draft, Drafter
    from specdecode.step import propose

    class Fixed(Drafter):
        name = "fixed"

        def __init__(self, tokens):
            self.tokens = tokens

        def propose(self, context, k, sampling, noise, stop_rule=None):
            return Draft(list(self.tokens[:k]), confidences=[0.5] * min(k, len(self.tokens)))

    tokenizer = engine.tokenizer
    request = engine.request(PROMPT, controls=LogitControls(grammar=GrammarSpec("json_schema", json.dumps(PERSON))))
    controls = engine.row_controls(request)
    good = tokenizer.encode('{"name": "Ann", "age": 31,')
    noise = PositionNoise(0)
    draft = propose(Fixed(good + tokenizer.encode(" years")), [1], 20, SamplingParams(), noise, None, controls, 30)
    assert draft.tokens[: len(good)] == good and tokenizer.decode(draft.tokens[len(good):]).startswith(' "pets"')
    assert draft.forced == len(draft.tokens) - len(good) > 0 and len(draft.confidences) == len(draft.tokens)
    cut = propose(Fixed(tokenizer.encode('{"nome": 1}')), [1], 20, SamplingParams(), noise, None, controls, 30)
    # '{"nome"' is cut after '{"n' (the schema's only key starts so), and the rest of the key is forced
    assert tokenizer.decode(cut.tokens) == '{"name":' and 0 < cut.forced < len(cut.tokens)
    plain = propose(None, [1], 0, SamplingParams(), noise, None, controls, 30)
    assert plain.tokens == []  # plain decoding drafts nothing, not even forced tokens
    assert controls.pushed == [] and controls.valid_prefix(good) == len(good)  # the state is untouched


def test_row_controls_push_and_undo_restore_the_state(engine):
    spec = LogitControls(frequency_penalty=1.0, presence_penalty=0.5, repetition_penalty=1.2,
                         grammar=GrammarSpec("json_object", ""))
    controls = RowControls.start(spec, [5, 6, 7], engine.target.vocab_size,
                                 engine.row_controls(engine.request(PROMPT, controls=spec)).matcher,
                                 engine.tokenizer.eos_ids)
    import torch

    row = torch.randn(1, engine.target.vocab_size)
    before = controls.process(row)
    tokens = engine.tokenizer.encode('{"a": 1')
    controls.commit(tokens[:2])
    middle = controls.process(row)
    for token in tokens[2:]:
        controls.push(token)
    controls.undo(len(tokens) - 2)
    assert torch.equal(controls.process(row), middle)
    controls.undo(2)
    assert torch.equal(controls.process(row), before) and not controls.answer
