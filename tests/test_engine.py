"""Engine API: pairing checks, input validation, streaming, statistics."""
import pytest
import torch

from specdecode.engine import Engine, check_same_tokenizer
from specdecode.errors import InputError, ModelError
from specdecode.sampling import SamplingParams
from testlib import as_loaded, fake_tokenizer, make_tiny_model

PROMPT = [5, 9, 13, 5, 9, 2, 77, 5, 9]


@pytest.fixture(scope="module")
def pair():
    target = make_tiny_model(seed=30)
    draft = make_tiny_model(seed=31)
    return target, draft


@pytest.fixture
def engine(pair):
    target, draft = pair
    return Engine(as_loaded(target, name="target"), as_loaded(draft, name="draft"), max_context=64, check_invariants=True)


# --------------------------------------------------------------------------- pairing
def test_mismatched_tokenizers_are_refused(pair):
    target, draft = pair
    target_lm = as_loaded(target, fake_tokenizer(256, prefix="t"), "target")
    draft_lm = as_loaded(draft, fake_tokenizer(256, prefix="other"), "draft")  # same size, other tokens
    with pytest.raises(ModelError, match="different tokenizers") as info:
        Engine(target_lm, draft_lm)
    assert "draft" in str(info.value) and "target" in str(info.value)


def test_tokenizers_of_different_sizes_are_refused(pair):
    target, _ = pair
    bigger = make_tiny_model(seed=32, vocab_size=300)
    with pytest.raises(ModelError):
        Engine(as_loaded(target), as_loaded(bigger))


def test_same_tokenizer_but_different_output_sizes_limits_what_the_draft_proposes(pair):
    """Padded embedding tables (tests/test_tokenizer_match.py runs them): the draft may propose the real tokens only."""
    target, _ = pair
    bigger = make_tiny_model(seed=32, vocab_size=300)
    assert check_same_tokenizer(as_loaded(target, fake_tokenizer(256)), as_loaded(bigger, fake_tokenizer(256))) == 256


def test_matching_pair_is_accepted(pair):
    target, draft = pair
    Engine(as_loaded(target, fake_tokenizer(256, eos_ids={1})), as_loaded(draft, fake_tokenizer(256)))


def test_auto_leaves_out_a_draft_model_loaded_only_for_other_drafters(pair):
    target, draft = pair
    loaded_for_bench = Engine(as_loaded(target, name="target"), as_loaded(draft, name="draft"), max_context=64,
                              auto_draft_model=False)
    assert loaded_for_bench.drafter("auto").sources == ("lookup", "store")
    assert loaded_for_bench.drafter("draft") is not None  # the draft model's own method still has it
    by_default = Engine(as_loaded(target, name="target"), as_loaded(draft, name="draft"), max_context=64)
    assert by_default.drafter("auto").sources == ("lookup", "store", "draft")


# --------------------------------------------------------------------------- validation
def test_draft_drafter_without_draft_model(pair):
    engine = Engine(as_loaded(pair[0]), None, max_context=64)
    with pytest.raises(InputError, match="draft model"):
        engine.generate(PROMPT, drafter="draft", max_new_tokens=3)
    assert engine.generate(PROMPT, drafter="lookup", k=2, max_new_tokens=3).token_ids


def test_unknown_drafter_name(engine):
    with pytest.raises(InputError, match="unknown drafter"):
        engine.generate(PROMPT, drafter="medusa", max_new_tokens=3)


@pytest.mark.parametrize("k", [-1, 65, "fast", 2.5, None, True, False])
def test_invalid_k(engine, k):
    with pytest.raises(InputError):
        engine.generate(PROMPT, drafter="draft", k=k, max_new_tokens=3)


@pytest.mark.parametrize("max_k", [0, -1, 65, 200, 2.5, "8", True])
def test_invalid_max_k(engine, max_k):
    with pytest.raises(InputError, match="max_k"):
        engine.generate(PROMPT, drafter="draft", max_k=max_k, max_new_tokens=3)


def verify_block_rows(target_model, engine, **kwargs):
    """The row counts of the target passes of one generation (prompt and verify blocks)."""
    rows = []
    hook = target_model.register_forward_pre_hook(lambda module, args: rows.append(int(args[0].shape[0])))
    try:
        engine.generate(PROMPT, max_new_tokens=80, **kwargs)
    finally:
        hook.remove()
    return rows


@pytest.mark.parametrize("precision", ["float32", "int8"])
@pytest.mark.parametrize("k", [64, "auto"])
def test_a_verify_block_never_exceeds_the_rows_the_target_computes_exactly(pair, precision, k):
    """A tree with a runner-up at every depth verifies 1 + 2K rows: at K 64, 129, past the 128 rows a float32
    target computes row-exactly (a larger block goes to a GEMM). The float32 target drafts at most 63 deep
    then; the int8 target is row-exact at any size and keeps K 64."""
    from specdecode import kernels
    from specdecode.drafters.draft_model import TreeDrafter
    from specdecode.models.loader import _to_quant_weights
    from testlib import perturbed_copy

    target, draft = pair
    target = perturbed_copy(target, noise=0.0, seed=0, max_positions=512)
    if precision == "int8":
        _to_quant_weights(target)
    engine = Engine(as_loaded(target, name="target"), as_loaded(draft, name="draft"), max_context=512)
    tree = TreeDrafter(engine.draft.model, engine.max_context, branch_min_prob=0.0)  # a runner-up at every depth
    for block in range(1, 2 * 64 + 2):  # every block costs a plain step and drafting is free: auto drafts max_k
        engine.tuner.costs.set_measured(block, 1e-3)
    for name in ("tree", "draft"):
        engine.tuner.costs.record_draft(name, 0.0)
    rows = verify_block_rows(target, engine, drafter=tree, k=k, max_k=64)
    exact = kernels.FLOAT32_CHUNKED_MAX_ROWS
    assert max(rows) == (exact - 1 if precision == "float32" else 1 + 2 * 64), rows
    chain_rows = verify_block_rows(target, engine, drafter="draft", k=k, max_k=64)
    assert max(chain_rows) <= 1 + 64


@pytest.mark.parametrize("max_new_tokens", [0, -3, 2.5, "8"])
def test_invalid_max_new_tokens(engine, max_new_tokens):
    with pytest.raises(InputError):
        engine.generate(PROMPT, drafter="draft", k=2, max_new_tokens=max_new_tokens)


@pytest.mark.parametrize("prompt", ["", 42, None])
def test_invalid_prompts(engine, prompt):
    with pytest.raises(InputError):
        engine.generate(prompt, drafter="draft", k=2, max_new_tokens=3)


def test_empty_token_list_prompt(engine):
    with pytest.raises(InputError):
        engine.generate([], drafter="draft", k=2, max_new_tokens=3)


@pytest.mark.parametrize("bad_id", [256, 10_000, -1])
def test_token_ids_outside_the_vocabulary_are_an_input_error(engine, bad_id):
    """A token-id prompt (the server accepts them) with an id the model does not have must be refused
    with a clear InputError, not an IndexError from the embedding, and -1 must not silently wrap
    around to the last token."""
    with pytest.raises(InputError):
        engine.generate([5, bad_id, 7], drafter="draft", k=2, max_new_tokens=3)


def test_chat_on_a_model_without_template(engine):
    with pytest.raises(InputError, match="chat template"):
        engine.generate("<t5><t6>", chat=True, drafter="none", max_new_tokens=2)
    with pytest.raises(InputError, match="chat template"):
        engine.generate([{"role": "user", "content": "hi"}], drafter="none", max_new_tokens=2)


def test_text_prompt_is_encoded_with_the_tokenizer(engine):
    by_text = engine.generate("<t5><t9><t13>", drafter="none", max_new_tokens=5)
    by_ids = engine.generate([5, 9, 13], drafter="none", max_new_tokens=5)
    assert by_text.token_ids == by_ids.token_ids


# --------------------------------------------------------------------------- streaming and stats
@pytest.mark.parametrize("drafter", ["none", "draft", "lookup"])
def test_stream_events_add_up_to_the_result(engine, drafter):
    result = engine.generate(PROMPT, drafter=drafter, k=3, max_new_tokens=25)
    events = list(engine.stream(PROMPT, drafter=drafter, k=3, max_new_tokens=25))
    assert [t for e in events for t in e.tokens] == result.token_ids
    assert "".join(e.text for e in events) == result.text == engine.tokenizer.decode(result.token_ids)
    assert [o for e in events for o in e.origins] == result.origins
    assert all(len(e.origins) == len(e.tokens) for e in events)
    assert events[-1].finished and not any(e.finished for e in events[:-1])


@pytest.mark.parametrize("drafter", ["draft", "lookup"])
def test_statistics_are_consistent(engine, drafter):
    result = engine.generate(PROMPT, drafter=drafter, k=4, max_new_tokens=30)
    stats = result.stats
    assert stats.generated_tokens == len(result.token_ids) == 30
    assert stats.prompt_tokens == len(PROMPT)
    assert stats.finish_reason == "length"
    assert stats.alpha == pytest.approx(stats.accepted / stats.drafted)
    assert stats.tau == pytest.approx(stats.generated_tokens / stats.target_passes)
    assert sum(stats.steps_by_k.values()) == stats.target_passes
    assert sum(k * n for k, n in stats.steps_by_k.items()) == stats.drafted
    assert sum(stats.origins.values()) == stats.generated_tokens
    assert stats.origins["accepted"] == stats.accepted
    for origin in ("accepted", "recovered", "bonus", "plain"):
        assert result.origins.count(origin) == stats.origins[origin]
    if drafter == "draft":
        assert stats.draft_passes > 0
    else:
        assert stats.draft_passes == 0
    assert stats.time_total > 0 and stats.tokens_per_s > 0
    as_dict = stats.to_dict()
    for key in ("alpha", "tau", "drafted", "accepted", "target_passes", "draft_passes", "tokens_per_s", "time"):
        assert key in as_dict
    assert any("alpha" in line for line in stats.summary_lines())


def test_plain_decoding_statistics(engine):
    stats = engine.generate(PROMPT, drafter="none", max_new_tokens=12).stats
    assert stats.drafted == 0 and stats.alpha is None
    assert stats.target_passes == 12 and stats.tau == 1.0


def test_should_stop_cancels(engine):
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) >= 3

    result = engine.generate(PROMPT, drafter="draft", k=2, max_new_tokens=50, should_stop=should_stop)
    assert result.finish_reason == "cancelled"
    assert 0 < len(result.token_ids) < 50


def test_sampling_with_every_drafter_runs_and_respects_limits(engine):
    sampling = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=3)
    for drafter in ("none", "draft", "lookup"):
        result = engine.generate(PROMPT, drafter=drafter, k=3, sampling=sampling, max_new_tokens=20)
        assert len(result.token_ids) == 20
        assert all(0 <= t < 256 for t in result.token_ids)


@pytest.mark.parametrize("drafter", ["draft", "lookup"])
def test_sampling_up_to_the_context_limit(engine, drafter):
    prompt = [(5 * i + 1) % 256 for i in range(60)]  # the engine holds 64 positions
    for seed in range(5):
        sampling = SamplingParams(temperature=1.0, seed=seed)
        result = engine.generate(prompt, drafter=drafter, k=8, sampling=sampling, max_new_tokens=100)
        assert result.finish_reason == "length"
        assert len(result.token_ids) == 64 + 1 - 60


def test_tree_drafting_refuses_sampling(engine):
    with pytest.raises(InputError, match="greedy"):
        engine.generate(PROMPT, drafter="tree", k=3, sampling=SamplingParams(temperature=0.8, seed=1), max_new_tokens=5)


def test_tree_drafter_without_draft_model(pair):
    engine = Engine(as_loaded(pair[0]), None, max_context=64)
    with pytest.raises(InputError, match="draft model"):
        engine.generate(PROMPT, drafter="tree", max_new_tokens=3)


# --------------------------------------------------------------------------- knowing when not to draft
def known_costs(engine, draft_prefill_per_token):
    """Pretend calibration ran: cheap draft passes, target blocks barely dearer than a step."""
    for n in range(1, 10):
        engine.tuner.costs.target[n] = 0.01 + 0.0005 * n
    engine.tuner.costs.draft["draft"] = 0.001
    engine.tuner.draft_prefill_cost["draft"] = draft_prefill_per_token


def test_draft_model_skips_a_prompt_prefill_the_answer_cannot_repay(engine, monkeypatch):
    # the engine's measured costs must stay as set: the tiny model's real timings would overwrite them
    monkeypatch.setattr(engine.tuner.costs, "record_target", lambda *a: None)
    monkeypatch.setattr(engine.tuner.costs, "record_draft", lambda *a: None)
    long_prompt = PROMPT * 3
    known_costs(engine, draft_prefill_per_token=1.0)  # reading the prompt costs 27 s; 6 tokens save < 0.1 s
    plain = engine.generate(long_prompt, drafter="none", max_new_tokens=6)
    result = engine.generate(long_prompt, drafter="draft", k="auto", max_new_tokens=6)
    assert result.stats.drafted == 0 and result.stats.draft_passes == 0
    assert engine._drafters["draft"].cache.length == 0  # the draft model never read the prompt
    assert result.token_ids == plain.token_ids
    known_costs(engine, draft_prefill_per_token=1e-6)
    result = engine.generate(long_prompt, drafter="draft", k="auto", max_new_tokens=6)
    assert result.stats.draft_passes > 0
    assert result.token_ids == plain.token_ids


def test_a_long_prompt_is_read_by_the_draft_model_only_once_the_answer_shows_it_will_repay_it(pair, monkeypatch):
    # ~26 unread tokens at 2.5 ms cost 65 ms; a token drafted at the 1.2x prior saves ~1.7 ms of a 10 ms step.
    # The 90-token budget would repay that at once, but the engine counts on the answer's length so far
    # (at least TuningParams.answer_credit = 32 tokens, 53 ms): it decodes plainly until ~39 tokens, then drafts.
    from specdecode import step as step_module

    engine = Engine(as_loaded(pair[0], name="target"), as_loaded(pair[1], name="draft"), max_context=128, check_invariants=True)
    monkeypatch.setattr(engine.tuner.costs, "record_target", lambda *a: None)
    monkeypatch.setattr(engine.tuner.costs, "record_draft", lambda *a: None)
    long_prompt = PROMPT * 3
    plain = engine.generate(long_prompt, drafter="none", max_new_tokens=90)
    known_costs(engine, draft_prefill_per_token=0.0025)
    passes_before_read = []
    verify, read = step_module.verify_block, engine.drafter("draft").prefill
    monkeypatch.setattr(step_module, "verify_block", lambda *a: (passes_before_read.append(None), verify(*a))[1])
    monkeypatch.setattr(engine.drafter("draft"), "prefill", lambda ids: (passes_before_read.append(len(passes_before_read)), read(ids)))
    result = engine.generate(long_prompt, drafter="draft", k="auto", max_new_tokens=90)
    assert result.token_ids == plain.token_ids
    reads = [n for n in passes_before_read if n is not None]
    assert len(reads) == 1 and 36 <= reads[0] <= 45, reads  # one plain target pass per token until then
    assert result.stats.draft_passes > 0
    # an answer that ends before it could repay the read never pays for it
    engine.reset()
    engine.tuner.learned().drafting_speedup.clear()
    known_costs(engine, draft_prefill_per_token=0.0025)
    result = engine.generate(long_prompt, drafter="draft", k="auto", max_new_tokens=engine.tuner.params.answer_credit + 6)
    assert result.stats.draft_passes == 0 and engine._drafters["draft"].cache.length == 0
    assert result.token_ids == plain.token_ids[: len(result.token_ids)]


@pytest.mark.parametrize("drafter", ["lookup", "auto"])
@pytest.mark.parametrize("probe_every", [12, 0])
def test_copies_refused_by_a_wrong_verify_cost_are_still_probed(pair, monkeypatch, drafter, probe_every):
    """Verify rows estimated three steps dear (as one stalled pass could leave a size the policy then avoids): no
    copy can repay one, and with nothing verified nothing corrects the estimate. A copy source probes a single token
    after `copy_probe_every` refusals in a row, and the answer stays plain decoding's; without probes (0) nothing is
    drafted."""
    from specdecode.tuning_params import TuningParams

    engine = Engine(as_loaded(pair[0], name="target"), as_loaded(pair[1], name="draft"), max_context=128,
                    check_invariants=True, tuning_params=TuningParams(copy_probe_every=probe_every))
    monkeypatch.setattr(engine.tuner.costs, "record_target", lambda *a: None)  # the planted costs stay as set
    monkeypatch.setattr(engine.tuner.costs, "record_draft", lambda *a: None)
    for n in range(1, 17):
        engine.tuner.costs.target[n] = 0.01 + 0.03 * (n - 1)
    engine.tuner.costs.draft["draft"] = 0.001
    plain = engine.generate(PROMPT, drafter="none", max_new_tokens=80)
    result = engine.generate(PROMPT, drafter=drafter, k="auto", max_new_tokens=80)
    assert result.token_ids == plain.token_ids
    if not probe_every:
        assert result.stats.drafted == 0
    else:
        assert result.stats.drafted > 0 and set(result.stats.steps_by_k) == {0, 1}, result.stats.steps_by_k
        assert result.stats.steps_by_k[0] >= (probe_every - 1) * result.stats.steps_by_k[1]


def test_a_pinned_k_always_drafts(engine):
    known_costs(engine, draft_prefill_per_token=1.0)
    result = engine.generate(PROMPT * 3, drafter="draft", k=2, max_new_tokens=6)
    assert result.stats.draft_passes > 0


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_a_reused_prefix_holds_the_bits_a_fresh_prompt_computes(precision):
    """A chat continuation reuses the cached prefix, which decode steps wrote; a fresh engine computes the
    same positions as a prompt. Both must hold the same keys and values (and so give the same tokens),
    also for prompts longer than one row-exact block."""
    from specdecode import kernels
    from specdecode.models.loader import _to_quant_weights

    if kernels.load_kernel() is None:
        pytest.skip("no CPU kernel")
    target = make_tiny_model(seed=31, vocab_size=256, context_length=512)
    if precision == "int8":
        _to_quant_weights(target)
    first_prompt = [(11 * i + 5) % 256 for i in range(300)]
    warm = Engine(as_loaded(target), max_context=512)
    answer = warm.generate(first_prompt, drafter="none", max_new_tokens=30).token_ids
    follow_up = first_prompt + answer + [7, 8, 9]
    reused = warm.generate(follow_up, drafter="none", max_new_tokens=20)
    fresh_engine = Engine(as_loaded(target), max_context=512)
    fresh = fresh_engine.generate(follow_up, drafter="none", max_new_tokens=20)
    assert reused.token_ids == fresh.token_ids
    length = len(follow_up) - 1
    assert torch.equal(warm.cache.keys[:, :, :length], fresh_engine.cache.keys[:, :, :length])
    assert torch.equal(warm.cache.values[:, :, :length], fresh_engine.cache.values[:, :, :length])


# --------------------------------------------------------------------------- cost measurement
def test_engines_over_the_same_models_time_each_pass_once_per_thread_count(pair, monkeypatch):
    """The timings of a model are the process's: a second engine over the same models starts from them; another
    thread count, or another model, is timed anew."""
    from specdecode import pass_timings

    target, draft = (make_tiny_model(seed=33), make_tiny_model(seed=34))  # models no other test timed
    timings = []
    real_fastest = pass_timings.fastest
    monkeypatch.setattr(pass_timings, "fastest", lambda run, repeats: timings.append(1) or real_fastest(run, repeats))

    def measured(max_k: int) -> tuple[dict, dict]:
        engine = Engine(as_loaded(target, name="target"), as_loaded(draft, name="draft"), max_context=64)
        engine.measure_costs(max_k, engine.drafter("draft"))
        engine.measure_batch_costs(16)
        return engine.tuner.costs.target, engine.tuner.costs.draft

    first = measured(4)
    assert len(timings) == len(first[0]) + 1 and set(first[0]) == {1, 2, 3, 5, 4, 8, 16}
    assert measured(4) == first and len(timings) == len(first[0]) + 1  # nothing timed again
    measured(6)
    assert len(timings) == len(first[0]) + 2  # only the new size, 7 (4 = 6 // 2 + 1 was timed)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        measured(4)
    finally:
        torch.set_num_threads(threads)
    assert len(timings) == 2 * (len(first[0]) + 1) + 1


def test_a_later_process_on_this_machine_reads_the_timings_instead_of_timing_again(pair, monkeypatch, tmp_path):
    """A model loaded from files keeps its timings in the cache folder, per machine: a new model object from the
    same files (a new process) times nothing; other files, or another machine, time anew."""
    from specdecode import pass_timings

    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    timings = []
    real_fastest = pass_timings.fastest
    monkeypatch.setattr(pass_timings, "fastest", lambda run, repeats: timings.append(1) or real_fastest(run, repeats))

    def measured(files: str) -> tuple[dict, dict]:
        target, draft = make_tiny_model(seed=35), make_tiny_model(seed=36)  # as a new process loads them
        pass_timings.keep_on_disk(target, f"target {files}")
        pass_timings.keep_on_disk(draft, f"draft {files}")
        engine = Engine(as_loaded(target, name="target"), as_loaded(draft, name="draft"), max_context=64)
        engine.measure_costs(4, engine.drafter("draft"))
        return engine.tuner.costs.target, engine.tuner.costs.draft

    first = measured("v1")
    assert len(timings) == len(first[0]) + 1 and len(list((tmp_path / "timings").glob("*.json"))) == 2
    assert measured("v1") == first and len(timings) == len(first[0]) + 1  # read, not timed
    measured("v2")
    assert len(timings) == 2 * (len(first[0]) + 1)
    monkeypatch.setattr(pass_timings, "machine_identity", lambda: "another machine")
    measured("v1")
    assert len(timings) == 3 * (len(first[0]) + 1)


def test_the_machine_identity_never_builds_the_cpu_kernel(monkeypatch):
    """A model on a GPU leaves the CPU kernel unbuilt: keying its timings must not build it (a minute of compiling)."""
    from specdecode import pass_timings
    from specdecode.kernels import native

    def no_build():
        raise AssertionError("the identity built the kernel")

    monkeypatch.setattr(native, "_kernel", None)
    monkeypatch.setattr(native, "_kernel_failed", None)
    monkeypatch.setattr(native, "load_kernel", no_build)
    monkeypatch.setattr(native, "_load_or_build", no_build)
    assert "kernel not loaded" in pass_timings.machine_identity()
