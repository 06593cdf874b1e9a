"""What a GPU pass allocates and launches follows what it uses, never the pool's length or the row count (issue 63):
the attention scratch and grid cover the segments a pass's rows reach; the output head runs for the rows whose logits
are wanted; every pass is cut to a row cap and a scratch budget; Triton's specialisation does not see the row
count; graphs never read a replaced head; launches run on the model's device; a GPU the kernels cannot serve, or a
matrix the kernel would read out of bounds, is refused at load. Each test fails on the code before its fix."""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from types import SimpleNamespace

import pytest
import torch

from specdecode.gpu import triton_kernels as tk
from specdecode.gpu.exact_pass import ExactPass, Tiles
from specdecode.models.transformer import Segment
from gpu_models import TEST_TILES, on_gpu_path, tiny_gpu_model
from testlib import TINY_CONFIGS, make_tiny_model, tokens_for


class Launches:
    """Stands in for the kernels module of a pass: records each launch (kernel name, grid, arguments), and runs it
    unless `run` is off (then the pass computes garbage, but launches what it would). `watched()` is recorded with
    each launch (the devices made current, for one test)."""

    def __init__(self, run: bool = True, watched=lambda: None):
        self.calls, self.run, self.watched, self.seen = [], run, watched, []

    def __getattr__(self, name):
        kernel = getattr(tk, name)
        outer = self

        class Launcher:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    outer.calls.append((name, grid, args, kwargs))
                    outer.seen.append(outer.watched())
                    if outer.run:
                        kernel[grid](*args, **kwargs)
                return launch

        return Launcher()

    def of(self, name):
        return [(grid, args, kwargs) for kernel, grid, args, kwargs in self.calls if kernel == name]


def arg(name: str, args: tuple, param: str):
    """The argument `param` of a recorded launch of kernel `name`."""
    return args[list(inspect.signature(getattr(tk, name).fn).parameters).index(param)]


def recorded(model) -> Launches:
    model.exact_pass.k = Launches()
    return model.exact_pass.k


# ------------------------------------------------------------------ scratch and grid by the keys used (F2)
def test_attention_scratch_follows_the_keys_a_pass_uses_not_the_pool():
    """A pool of 2,048 positions (128 segments of 16) holding a 12-token sequence: the attention's grid and scratch
    cover the one segment the rows reach, and the logits are those of a 64-position pool, bitwise."""
    model = on_gpu_path(make_tiny_model(seed=9, max_positions=2048, **TINY_CONFIGS["qwen2-gqa-bias"]))
    tokens = tokens_for(model, 12, seed=3)
    small = model(tokens, model.new_cache(64))
    launches = recorded(model)
    large = model(tokens, model.new_cache(2048))
    assert torch.equal(large, small)
    for grid, args, _ in launches.of("attention_partial_kernel"):
        assert grid[2] == 1 and arg("attention_partial_kernel", args, "m_ptr").shape[2] == 1  # [rows, HKV, segs, g]


def test_the_merge_visits_only_the_segments_a_row_reaches():
    """The merge loops from a row's first reached segment to its last: loads of segments past them would read
    scratch that no program wrote. Poisoned scratch (NaN in every unused segment) must not reach a row."""
    model = tiny_gpu_model("gemma3-windowed", tiles=dataclasses.replace(TEST_TILES, fused_sums=False))
    tokens = tokens_for(model, 40, seed=4)
    cache = model.new_cache()
    model(tokens[:36], cache, logits="none")
    expected = model(tokens[36:], cache)
    empty = torch.empty

    def poisoned(*shape, **kwargs):
        return empty(*shape, **kwargs).fill_(float("nan")) if kwargs.get("dtype") == torch.float32 else empty(*shape, **kwargs)

    cache.truncate(36)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "empty", poisoned)
        got = model(tokens[36:], cache)
    assert torch.equal(got, expected)


# ------------------------------------------------------------------ the head only for rows that want logits (F3)
def head_rows(launches: Launches, head: torch.Tensor) -> list[int]:
    """The rows of each product over the output head."""
    return [arg("linear_partial_kernel", args, "M") for _, args, _ in launches.of("linear_partial_kernel")
            if arg("linear_partial_kernel", args, "w_ptr") is head]


def test_the_head_runs_for_the_rows_whose_logits_are_wanted():
    model = tiny_gpu_model()
    head = model.exact_pass.head_weight()
    tokens = tokens_for(model, 14, seed=2)
    every = model(tokens, model.new_cache())
    launches = recorded(model)
    assert model(tokens[:9], model.new_cache(), logits="none") is None
    assert head_rows(launches, head) == []
    last = model(tokens, model.new_cache(), logits="last")
    assert head_rows(launches, head) == [1] and torch.equal(last, every[-1:])
    cache = model.new_cache()
    model(tokens[:6], cache, logits="none")
    batch = [Segment(tokens[6:10].tolist(), cache, "last"), Segment(tokens[:5].tolist(), model.new_cache(), "none"),
             Segment(tokens[:3].tolist(), model.new_cache(), "all")]
    got = model.forward_batch(batch)
    assert head_rows(launches, head)[-1] == 1 + 3
    assert got[1] is None and torch.equal(got[0], every[9:10]) and torch.equal(got[2], every[:3])


# ------------------------------------------------------------------ a row cap on every pass (F2, F3)
def test_every_pass_is_cut_to_the_row_cap_with_the_same_bits():
    """max_rows 4: a 14-row prompt is four passes of at most 4 rows; batched segments are packed within the cap,
    a long one cut into pieces; every logit is the uncut pass's."""
    model = tiny_gpu_model()
    tokens = tokens_for(model, 14, seed=5)
    whole = model(tokens, model.new_cache())
    model.exact_pass.max_rows = 4
    launches = recorded(model)
    assert torch.equal(model(tokens, model.new_cache()), whole)
    assert [grid[0] for grid, _, _ in launches.of("rms_norm_kernel")] == [4, 4, 4, 2]
    launches.calls.clear()
    batch = [Segment(tokens[:3].tolist(), model.new_cache()), Segment(tokens.tolist(), model.new_cache(), "last"),
             Segment(tokens[:1].tolist(), model.new_cache())]
    got = model.forward_batch(batch)
    assert all(grid[0] <= 4 for grid, _, _ in launches.of("rms_norm_kernel"))
    assert torch.equal(got[0], whole[:3]) and torch.equal(got[1], whole[-1:]) and torch.equal(got[2], whole[:1])


# Shapes of the models whose passes broke in the review's arithmetic (issue 63: F2, F3)
LLAMA3_8B = dict(arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, n_layers=32, n_heads=32,
                 n_kv_heads=8, head_dim=128, context_length=131072)
LLAMA32_1B = dict(arch="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, n_layers=16, n_heads=32,
                  n_kv_heads=8, head_dim=64, context_length=131072)
GEMMA3_4B = dict(arch="gemma3", vocab_size=262144, hidden_size=2560, intermediate_size=10240, n_layers=34, n_heads=8,
                 n_kv_heads=4, head_dim=256, context_length=131072)


def stand_in(fields: dict) -> ExactPass:
    """An ExactPass of a real shape, without weights: only what plans passes and sizes their scratch."""
    runner = ExactPass.__new__(ExactPass)
    config = SimpleNamespace(**fields)
    runner.model, runner.tiles, runner.max_rows, runner.scratch_limit = SimpleNamespace(config=config), Tiles(), 128, 1 << 28
    runner.group_pad = max(16, 1 << max(0, (config.n_heads // config.n_kv_heads - 1).bit_length()))
    return runner


@pytest.mark.parametrize("fields", [LLAMA3_8B, LLAMA32_1B, GEMMA3_4B], ids=["llama3-8b", "llama3.2-1b", "gemma3-4b"])
@pytest.mark.parametrize("context", [4096, 32768, 131072])
def test_passes_at_long_contexts_stay_within_the_scratch_budget_and_32_bit_offsets(fields, context):
    """A draft's 1,024-token prefill chunk at the end of a long context, planned: every pass's attention scratch
    (rows x kv heads x segments x group x (D + 2) floats, per layer) within the budget, and its head's partial sums
    (splits x rows x vocabulary) and its scratch under 2^31 elements."""
    runner = stand_in(fields)
    c, tiles = runner.model.config, runner.tiles
    cache = SimpleNamespace(length=context - 1024, max_len=context, pool=None)
    passes = runner.plan([Segment(list(range(1024)), cache, "last")])
    assert sum(piece.rows for p in passes for _, piece in p) == 1024
    for p in passes:
        rows = sum(piece.rows for _, piece in p)
        keys = max(piece.cache.length + piece.rows for _, piece in p)
        assert rows <= runner.max_rows and rows * runner.scratch_per_row(keys) <= runner.scratch_limit < 1 << 31
        splits = -(-c.hidden_size // tiles.split_size(c.hidden_size))
        assert splits * rows * c.vocab_size < 1 << 31


# ------------------------------------------------------------------ no specialisation on the row count (F6)
def jit_options(kernel) -> dict:
    """What a kernel's @triton.jit was given (the interpreter's function keeps it as kwargs, the JIT's as fields)."""
    if hasattr(kernel, "kwargs"):
        return kernel.kwargs
    return {"do_not_specialize": kernel.do_not_specialize,
            "do_not_specialize_on_alignment": kernel.do_not_specialize_on_alignment}


def specialisation(name: str, args: tuple, kwargs: dict):
    """The key Triton 3.6's JIT (not the interpreter) computes for a launch of kernel `name`: every argument's
    type, value specialisation (1 -> constant, multiple of 16 -> divisible) and pointer alignment."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    declared = jit_options(getattr(tk, name))
    jit = JITFunction(getattr(tk, name).fn, do_not_specialize=declared.get("do_not_specialize"),
                      do_not_specialize_on_alignment=declared.get("do_not_specialize_on_alignment"))
    binder = create_function_from_signature(jit.signature, jit.params, BaseBackend)
    options = {k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages")}
    _, spec, _ = binder(*args, **{k: v for k, v in kwargs.items() if k not in options}, **options)
    return tuple((p.name, s) for p, s in zip(jit.params, spec) if not isinstance(s[1], torch.Tensor))


def launched_keys(model, rows: int) -> dict:
    """Each kernel's specialisation keys in a pass of `rows` rows after 40 tokens (kernels not run: keys only)."""
    model.exact_pass.k = launches = Launches(run=False)
    cache = model.new_cache(256)
    cache.length = 40
    model.forward_batch([Segment([1] * rows, cache)])
    keys: dict = {}
    for name, _, args, kwargs in launches.calls:
        keys.setdefault(name, set()).add(specialisation(name, args, kwargs))
    return keys


def test_triton_compiles_one_binary_for_every_row_count():
    """Passes of 1, 5, 16 and 64 rows give every kernel the same specialisation key (the row count, the ancestor
    table's stride and the metadata rows' alignment all vary with the rows)."""
    model = on_gpu_path(make_tiny_model(seed=9, max_positions=256, **TINY_CONFIGS["qwen2-gqa-bias"]))
    keys = [launched_keys(model, rows) for rows in (1, 5, 16, 64)]
    assert {"attention_partial_kernel", "qkv_finish_kernel", "linear_partial_kernel"} <= set(keys[0])
    assert keys[1] == keys[0] and keys[2] == keys[0] and keys[3] == keys[0]


def test_the_specialisation_check_sees_an_int_that_carries_the_rows():
    """Its twin: were anc_stride specialised, 1 and 16 rows would differ."""
    declared = jit_options(tk.attention_partial_kernel)
    if not hasattr(tk.attention_partial_kernel, "kwargs"):
        pytest.skip("the twin edits the interpreter's record of the kernel's options")
    saved = declared["do_not_specialize"]
    declared["do_not_specialize"] = [name for name in saved if name != "anc_stride"]
    try:
        model = on_gpu_path(make_tiny_model(seed=9, max_positions=256, **TINY_CONFIGS["qwen2-gqa-bias"]))
        assert launched_keys(model, 1)["attention_partial_kernel"] != launched_keys(model, 16)["attention_partial_kernel"]
    finally:
        declared["do_not_specialize"] = saved


# ------------------------------------------------------------------ graphs and a replaced head (F8)
class Replays(ExactPass):
    """Graphs on a CPU: a 'capture' is the pass with the output head it read then, replayed with that head (a
    CUDA graph holds the head's address)."""

    def __init__(self, model, tiles=TEST_TILES, **options):
        super().__init__(model, tiles, graphs=True, **options)

    def _capture(self, meta, pool, keys):
        head, logits = self.head_weight(), torch.empty(0)
        runner = self

        class Graph:
            def replay(self):
                saved = runner.head_weight
                runner.head_weight = lambda: head
                try:
                    logits.set_(runner.forward(meta, pool, keys))
                finally:
                    runner.head_weight = saved

        return Graph(), meta, logits


def test_a_graph_captured_before_the_head_subset_changed_is_not_replayed():
    model = tiny_gpu_model(pass_type=Replays)
    fresh = tiny_gpu_model()
    tokens = tokens_for(model, 4, seed=1)
    model.set_vocab_subset(torch.arange(0, 128))
    model(tokens, model.new_cache())
    subset = torch.arange(128, 256)
    model.set_vocab_subset(subset)
    fresh.set_vocab_subset(subset)
    assert torch.equal(model(tokens, model.new_cache()), fresh(tokens, fresh.new_cache()))


# ------------------------------------------------------------------ the model's device (F4)
def test_launches_and_caches_run_with_the_models_device_current(monkeypatch):
    """A model on cuda:1 (faked: the device the pass names; its tensors stay on the CPU): every kernel launch and
    the pool's allocation happen inside torch.cuda.device(cuda:1)."""
    entered, pools = [], []

    @contextlib.contextmanager
    def device(where):
        entered.append(where)
        yield
        entered.pop()

    monkeypatch.setattr(torch.cuda, "device", device)
    model = tiny_gpu_model()
    runner = model.exact_pass
    runner.device = torch.device("cuda", 1)
    runner.k = launches = Launches(watched=lambda: list(entered))
    pool_type = type(runner).__init__.__globals__["KVPool"]
    monkeypatch.setitem(type(runner).__init__.__globals__, "KVPool",
                        lambda *args: pools.append(list(entered)) or pool_type(*args[:-1], "cpu"))
    model(tokens_for(model, 3), model.new_cache(32))
    assert pools == [[torch.device("cuda", 1)]]
    assert launches.seen and all(inside == [torch.device("cuda", 1)] for inside in launches.seen)
    assert not entered


# ------------------------------------------------------------------ a GPU the kernels cannot serve (F5)
def test_a_gpu_below_compute_capability_8_falls_back_at_load(monkeypatch):
    from specdecode import gpu

    config = make_tiny_model(**TINY_CONFIGS["qwen2-gqa-bias"]).config
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    reason = gpu.unavailable_for(config, torch.device("cuda", 0))
    assert reason is not None and "7.5" in reason and "8.0" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert gpu.unavailable_for(config, torch.device("cuda", 0)) is None


def test_no_triton_falls_back_at_load(monkeypatch):
    import sys

    from specdecode import gpu

    config = make_tiny_model(**TINY_CONFIGS["qwen2-gqa-bias"]).config
    monkeypatch.setitem(sys.modules, "triton", None)
    assert "Triton is not installed" in gpu.unavailable_for(config, torch.device("cuda", 0))


# ------------------------------------------------------------------ GGUF shapes the kernel cannot read (F10)
def test_a_gguf_matrix_whose_k_is_not_a_whole_number_of_steps_loads_as_bfloat16():
    """Q8_0 blocks with K = 96 (an odd number of 32-weight blocks per 64-weight step) are not read by the kernel:
    left out of the block matrices at load, and refused by the product."""
    from specdecode.gpu import gguf_blocks
    from testlib import random_gguf_blocks

    raw = random_gguf_blocks(gguf_blocks.Q8_0, 8, 96)
    fine = random_gguf_blocks(gguf_blocks.Q8_0, 8, 128)
    assert list(gguf_blocks.gpu_readable({"odd": [(gguf_blocks.Q8_0, raw)], "fine": [(gguf_blocks.Q8_0, fine)]})) == ["fine"]
    runner = tiny_gpu_model().exact_pass
    runner.tiles = Tiles(block_k=64)
    with pytest.raises(ValueError, match="steps of 64"):
        runner.product(torch.zeros(1, 96), gguf_blocks.block_weight([(gguf_blocks.Q8_0, raw)], "cpu"))
