"""The GPU device check: exactness and speed of the Triton path, peers in the same run (scripts/gpu_check.sh).

Models with random weights in the real shapes of Qwen2.5 0.5B / 1.5B / 7B are built on the device (no weights
travel), as transformers models first and then converted, so that both engines run the same weights. Parts:
- exact: rows of blocks of 1..64 rows and of a prompt chunk against single steps, bitwise; batches of 1..16
  sequences against each sequence alone; every drafter's greedy output and seeded chain drafters' output against
  plain decoding; 8 staggered batched requests against their solo outputs;
- rounds, sampling, verdicts (issue 64, after every exactness part, before the long speed parts): a draft model's
  proposals as device rounds against pass by pass (greedy, seeded, with a stop rule cutting inside rounds);
  sampling's race on the device against the host's bits (its noise, its PTX, choose_rows, verify_sampling's draws
  raced together); accept.py's verdicts and 16 batched requests with device verdicts on and off against solo plain
  outputs. Then their speed: the draft step and K=4 / K=8 proposals in 1.5B and 7B steps, a speculative run against
  plain; sampled plain decoding against greedy; 16 requests against one, device verdicts on and off;
- speed: plain decoding per shape next to its bandwidth bound; verify blocks of 1..16 rows in single steps; the
  batched aggregate at 1..32 requests; the draft step in target steps; transformers' generate (static cache),
  assisted generation and prompt lookup on the same models; our products and attention against cuBLAS and SDPA.
Each part writes its table to OUT/report.md as it finishes (and its numbers to OUT/results.json), and a part that
fails is reported without stopping the others. `--tiny` runs everything on tiny shapes (on a CPU: Triton's
interpreter), to try the script itself without a GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

if __name__ == "__main__" and "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import torch
import triton
import triton.language as tl

from specdecode.build import freeze_loaded_objects
from specdecode.gpu import noise_kernel
from specdecode.gpu.exact_pass import ExactPass
from specdecode.gpu.gguf_blocks import BlockWeight

from qwen_shapes import SHAPES, TINY  # noqa: E402  (scripts/, this script's folder)


class Report:
    def __init__(self, out: Path):
        self.out = out
        self.results: dict = {}
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text("")

    def section(self, name: str, lines: list[str], data) -> None:
        self.results[name] = data
        text = f"\n## {name}\n\n" + "\n".join(lines) + "\n"
        print(text, flush=True)
        with open(self.out / "report.md", "a") as f:
            f.write(text)
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1, default=str))


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --tiny: one timing each (the interpreter's timings mean nothing, the script's flow is what is tried)
QUICK = False


def timed(fn, repeats: int = 10, warmup: int = 2) -> float:
    """Median seconds of fn() (synchronized)."""
    if QUICK:
        repeats, warmup = 1, 0
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def graph_timed(fn, inner: int = 10, repeats: int = 20) -> float:
    """Device seconds of one fn(): `inner` calls captured in one CUDA graph, its replays timed, so that launching
    from Python does not decide the figure (eager launches of small kernels take longer than the kernels)."""
    if not torch.cuda.is_available():
        return timed(fn, repeats)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    return timed(graph.replay, repeats) / inner


# ---------------------------------------------------------------------- models
def qwen2_config(shape: dict):
    from transformers import Qwen2Config

    return Qwen2Config(**shape, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                       head_dim=shape["hidden_size"] // shape["num_attention_heads"])


def hf_model(shape: dict, seed: int, device, std: float = 0.05, dtype=torch.bfloat16):
    from transformers import Qwen2ForCausalLM

    config = qwen2_config(shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # larger than the 0.02 init, so that random models' logits are not all near-ties
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, std if "bias" not in name else 0.2)
    return model.to(dtype).eval()


def native(hf, device, dtype=torch.bfloat16, max_positions: int = 4096):
    from specdecode.models.hf_loader import native_from_hf
    from specdecode.models.loader import _finish_native

    model = native_from_hf(hf.config.to_dict(), dict(hf.state_dict()), device, dtype, max_positions=max_positions)
    return _finish_native(model, dtype)


def attach_if_cpu(model, tiny: bool):
    if model.exact_pass is None and tiny:
        from specdecode import gpu

        assert gpu.attach(model) is None
    return model


def weight_bytes(model) -> int:
    """Bytes a decode step reads: every layer matrix and the output head (an embedding row is negligible)."""
    def size(w):
        return w.nbytes if isinstance(w, BlockWeight) else w.numel() * w.element_size()

    total = sum(size(p) for layer in model.layers for p in (layer.qkv, layer.out_proj, layer.gate_up, layer.down))
    head = model.output_weight()
    return total + (head.nbytes if isinstance(head, BlockWeight) else head.numel() * 2)


# ---------------------------------------------------------------------- GGUF blocks in the product kernel
# A Q4_K_M file's block types (the default target's), and the 0.5B draft file's (mostly Q5_0, a Q8_0 head)
Q4_K_M = {"qkv": ("Q4_K", "Q4_K", "Q6_K"), "out_proj": ("Q4_K",), "gate_up": ("Q4_K", "Q4_K"), "down": ("Q6_K",),
          "lm_head": ("Q6_K",)}
Q5_0_FILE = {"qkv": ("Q5_0",) * 3, "out_proj": ("Q5_0",), "gate_up": ("Q5_0",) * 2, "down": ("Q5_0",),
             "lm_head": ("Q8_0",)}
# A Q3_K_M file's, roughly (llama-quantize gives some layers' V and down matrices Q5_K instead of Q4_K)
Q3_K_M = {"qkv": ("Q3_K", "Q3_K", "Q4_K"), "out_proj": ("Q4_K",), "gate_up": ("Q3_K", "Q3_K"), "down": ("Q4_K",),
          "lm_head": ("Q6_K",)}


def random_block_part(kind: int, first: int, rows: int, cols: int, device, fill: bool = True):
    """A BlockPart of random quants and small scales made on the device (no raw blocks: only speed is measured).
    fill=False: any type's arrays left unwritten (scripts/triton_compile_check.py: launches only, no memory used)."""
    from specdecode.gpu import gguf_blocks as gb

    if not fill:  # each array's row width and type as regroup gives them for one row of zero blocks
        per_block, size = gb.BLOCKS[kind]
        one_row = gb.regroup(kind, np.zeros((1, cols // per_block * size), dtype=np.uint8), cols)
        return gb.BlockPart(kind, first, rows, tuple(
            torch.empty((rows, a.shape[1]), dtype=torch.from_numpy(a).dtype, device=device) for a in one_row))

    def quants(width, low=0, high=256, dtype=torch.uint8):
        return torch.randint(low, high, (rows, width), dtype=dtype, device=device)

    def halves(width, scale):
        return (scale * (0.8 + 0.4 * torch.rand(rows, width, device=device))).half()

    arrays = {gb.Q4_K: lambda: (quants(cols // 2), quants(cols // 32, 0, 64), quants(cols // 32, 0, 64),
                                halves(cols // 256, 1e-3), halves(cols // 256, 7.5e-3)),
              gb.Q6_K: lambda: (quants(cols // 2), quants(cols // 4), quants(cols // 16, -128, 128, torch.int8),
                                halves(cols // 256, 1.8e-4)),
              gb.Q3_K: lambda: (quants(cols // 4), quants(cols // 8), quants(cols // 16, -32, 32, torch.int8),
                                halves(cols // 256, 1e-3)),
              gb.Q5_0: lambda: (quants(cols // 2), quants(cols // 8), halves(cols // 32, 3e-3)),
              gb.Q8_0: lambda: (quants(cols, -128, 128, torch.int8), halves(cols // 32, 4e-4))}[kind]()
    return gb.BlockPart(kind, first, rows, arrays)


def with_random_blocks(model, layout: dict, fill: bool = True):
    """`model` with every matrix replaced by random blocks of the layout's types (part rows as the model's); fill:
    as random_block_part's."""
    from specdecode.gpu import gguf_blocks as gb

    c = model.config
    rows = {"qkv": (c.q_size, c.kv_size, c.kv_size), "out_proj": (c.hidden_size,),
            "gate_up": (c.intermediate_size, c.intermediate_size), "down": (c.hidden_size,), "lm_head": (c.vocab_size,)}
    codes = {name: code for code, name in gb.NAMES.items()}
    owners = [(f"layers.{i}.{name}", layer, name) for i, layer in enumerate(model.layers) for name in rows if name != "lm_head"]
    for key, owner, name in owners + [("lm_head", model, "lm_head")]:
        cols = (model.output_weight() if name == "lm_head" else getattr(owner, name)).shape[1]
        parts, first = [], 0
        # neighbouring tensors of one type are one part, as the loader makes them
        for kind, counts in gb.runs([(codes[kind], n) for kind, n in zip(layout[name], rows[name])]):
            parts.append(random_block_part(kind, first, sum(counts), cols, model.device, fill))
            first += sum(counts)
        owner._parameters.pop(name, None)
        setattr(owner, name, gb.BlockWeight(parts, cols))
    torch.cuda.empty_cache() if model.device.type == "cuda" else None
    return model


def blocks_model(shape: dict, layout: dict, device, seed: int, max_positions: int = 2048):
    """A native Qwen2 model of `shape` whose matrices are random GGUF blocks of `layout`, made on the device with no
    dense copy (a 72B shape's bfloat16 matrices would not fit a GPU): built on the meta device, its vectors and
    embedding made real, its matrices replaced by blocks; then on the Triton path."""
    from specdecode import gpu
    from specdecode.models.hf_loader import config_from_hf
    from specdecode.models.transformer import Transformer

    with torch.device("meta"):
        model = Transformer(config_from_hf(qwen2_config(shape).to_dict()), torch.bfloat16, max_positions=max_positions)
    torch.manual_seed(seed)
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.dim() == 1:  # norms (ones) and biases
                value = torch.ones(param.shape) if "norm" in name else 0.2 * torch.randn(param.shape)
            elif name == "embed":  # float32 rows, looked up
                value = 0.05 * torch.randn(param.shape, device=device)
            else:
                continue  # a matrix: blocks below
            setattr(module, name, torch.nn.Parameter(value.to(device), requires_grad=False))
    with_random_blocks(model, layout)
    reason = gpu.attach(model)
    assert reason is None, reason
    return model


def check_block_products(report, runner, tiny):
    """Products over random raw blocks against the bfloat16 product of the same weights (ggml's dequantization),
    at the production tiles: bitwise."""
    import gguf
    from testlib import random_gguf_blocks

    from specdecode.gpu import gguf_blocks as gb

    n, k = (128, 512) if tiny else (1536, 8960 // 256 * 256)
    lines, data = [], {}
    for kind in sorted(gb.BLOCKS):
        raw = random_gguf_blocks(kind, n, k, seed=kind)
        dense = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(kind)).reshape(n, k))
        dense = dense.to(runner.model.device, torch.bfloat16)
        weight = gb.block_weight([(kind, raw)], runner.model.device)
        equal = []
        for rows in (1, 8, 64):
            x = torch.randn(rows, k, device=runner.model.device).to(torch.bfloat16)
            equal.append(torch.equal(runner.product(x, weight)[0], runner.product(x, dense)[0]))
        data[gb.NAMES[kind]] = all(equal)
        lines.append(f"- {gb.NAMES[kind]} [{n}, {k}], 1, 8 and 64 rows: {'bitwise equal' if all(equal) else 'DIFFERENT'}")
    report.section("GGUF blocks in the product kernel: products against the bfloat16 product of the same weights",
                   lines, data)


def block_speed(report, models, hfs, bandwidth, tiny):
    """Plain decoding and verify blocks of models whose matrices are GGUF blocks, beside the bfloat16 models."""
    tokens = 4 if tiny else 128
    lines = ["| shape | file's types | weights read per token | bandwidth bound | blocks: plain | % of bound |"
             " bfloat16: plain | blocks / bfloat16 | 8-row verify block, in steps | rows exact |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    data = {}
    files = (("1.5b", Q4_K_M, "Q4_K_M"), ("7b", Q4_K_M, "Q4_K_M"), ("7b", Q3_K_M, "Q3_K_M"), ("0.5b", Q5_0_FILE, "Q5_0"))
    for name, layout, label in files:
        if name not in hfs or (tiny and label == "Q3_K_M"):
            continue
        layout, label = (Q5_0_FILE, "Q5_0") if tiny else (layout, label)  # tiny widths are not multiples of 256
        model = attach_if_cpu(with_random_blocks(native(hfs[name], models[name].device), layout), tiny)
        bound = bandwidth / weight_bytes(model)
        ours, dense = plain_speed(model, tokens), plain_speed(models[name], tokens)
        costs = block_costs(model, [1, 8])
        tokens_in = torch.randint(0, model.config.vocab_size, (16,), device=model.device)
        cache = model.new_cache(64)
        steps = torch.cat([model(tokens_in[i:i + 1], cache) for i in range(16)])
        exact = torch.equal(model(tokens_in, model.new_cache(64)), steps)
        data[f"{name} {label}"] = dict(layout=label, bytes=weight_bytes(model), bound=bound, blocks=ours, bf16=dense,
                          verify8=costs[8] / costs[1], exact=exact)
        lines.append(f"| {name} | {label} | {weight_bytes(model) / 1e9:.2f} GB | {bound:.0f} tok/s | {ours:.1f} tok/s |"
                     f" {100 * ours / bound:.0f}% | {dense:.1f} tok/s | {ours / dense:.2f}x | {costs[8] / costs[1]:.2f} |"
                     f" {'16-row block = 16 steps, bitwise' if exact else 'DIFFERENT'} |")
        del model, cache
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    lines.append("\n(random quants and scales in each file's block types; bfloat16: the same shape's model of the"
                 " speed part)")
    report.section("GGUF blocks in the product kernel: plain decoding", lines, data)


# ---------------------------------------------------------------------- exactness
# The kernels not yet shown bitwise on a device (issue 63), each against the default tiles' pass: split sums and the
# attention merge fused (arrival counters), the gated activation in the gate|up tiles, and both with the programs
# taking splits and segments last to first, so that other programs arrive last and add the others.
UNMEASURED = (("split sums and attention merges fused", dict(fused_sums=True)),
              ("the gated activation in the gate|up tiles", dict(fused_sums=True, fused_act=True)),
              ("fused, splits and segments arriving in reverse", dict(fused_sums=True, fused_act=True, reversed=True)),
              ("programmatic dependent launch (compute capability 9.0+; elsewhere the same launches)", dict(pdl=True)))


def repeat_and_unfused(model, block, prompt: int, cache, repeats: int) -> list[str]:
    """The block again and again, and under each of UNMEASURED's tiles, again and again (which split of a product
    tile, or segment of a row's attention, arrives last varies from run to run; the order of the sum must not):
    each must give the first run's bits."""

    def run():
        cache.truncate(prompt)
        return model(block, cache)

    first, bad = run(), []
    if any(not torch.equal(run(), first) for _ in range(repeats)):
        bad.append(f"the {len(block)}-row block run again")
    saved = model.exact_pass
    for what, change in UNMEASURED:
        model.exact_pass = ExactPass(model, dataclasses.replace(saved.tiles, **change))
        try:
            plain = model.new_cache(cache.max_len)
            plain.keys.copy_(cache.keys), plain.values.copy_(cache.values)
            for _ in range(max(1, repeats // 5)):
                plain.length = prompt
                if not torch.equal(model(block, plain), first):
                    bad.append(what)
                    break
        finally:
            model.exact_pass = saved
    return bad


def check_rows(report, model, name, tiny):
    """Blocks of 1..64 rows and a 100-row prompt chunk against single steps; batches of 1..16 sequences."""
    from specdecode.models.transformer import Segment

    prompt, longest = (12, 6) if tiny else (100, 64)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.config.vocab_size, (prompt + longest,), generator=gen)
    cache = model.new_cache(1024)
    steps = torch.cat([model(tokens[i : i + 1].to(model.device), cache) for i in range(len(tokens))])
    ref_keys = cache.keys[:, :, : len(tokens)].clone()
    bad = []
    cache = model.new_cache(1024)
    if not torch.equal(model(tokens[:prompt].to(model.device), cache), steps[:prompt]):
        bad.append(f"prompt chunk of {prompt}")
    for rows in range(1, longest + 1):
        cache.truncate(prompt)
        got = model(tokens[prompt : prompt + rows].to(model.device), cache)
        if not torch.equal(got, steps[prompt : prompt + rows]):
            bad.append(f"block of {rows}")
    if not torch.equal(cache.keys[:, :, : len(tokens)], ref_keys):
        bad.append("cached keys")
    repeats = 5 if tiny else 50
    bad += repeat_and_unfused(model, tokens[prompt:].to(model.device), prompt, cache, repeats)
    # batches: b sequences (decode steps, verify blocks and a prompt chunk mixed) against each alone
    batch_bad = []
    for b in (1, 3) if tiny else (1, 2, 4, 8, 12, 16):
        segs, solos = [], []
        for i in range(b):
            length = 5 + 7 * i if tiny else 20 + 37 * i % 300
            rows = (1, 4, 9, 16, 3, 33)[i % 6]
            seq = torch.randint(0, model.config.vocab_size, (length + rows,), generator=gen).tolist()
            own, mine = model.new_cache(1024), model.new_cache(1024)
            model(torch.tensor(seq[:length], device=model.device), own, logits="none")
            mine.keys.copy_(own.keys), mine.values.copy_(own.values)
            mine.length = own.length
            solos.append(model(torch.tensor(seq[length:], device=model.device), own))
            segs.append(Segment(seq[length:], mine))
        for i, (got, want) in enumerate(zip(model.forward_batch(segs), solos)):
            if not torch.equal(got, want):
                batch_bad.append(f"batch of {b}: sequence {i}")
    ok = not bad and not batch_bad
    report.section(f"exact rows ({name})", [
        f"- blocks of 1..{longest} rows and a {prompt}-row prompt chunk vs single steps, the {longest}-row block again"
        f" {repeats} times, and under fused split sums and merges, the fused activation, and both with splits arriving"
        f" in reverse (each {max(1, repeats // 5)} times), bitwise: "
        + ("all equal" if not bad else "DIFFER: " + ", ".join(bad)),
        "- batches of 1, 2, 4, 8, 12, 16 sequences (steps, blocks of 4-33 rows) vs each alone: "
        + ("all equal" if not batch_bad else "DIFFER: " + ", ".join(batch_bad[:10]))],
        dict(ok=ok, blocks=bad, batches=batch_bad))


def check_identity(report, target, draft, strong, tiny):
    """Every drafter (greedy) and the chain drafters (seeded) against plain decoding; 8 staggered requests."""
    from specdecode.batch import BatchEngine
    from specdecode.engine import Engine
    from specdecode.sampling import SamplingParams
    from testlib import as_loaded, fake_tokenizer

    tok = fake_tokenizer(target.config.vocab_size)
    weak_engine = Engine(as_loaded(target, tok, "target"), as_loaded(draft, tok, "draft"), max_context=1024)
    strong_engine = Engine(as_loaded(target, tok, "target"), as_loaded(strong, tok, "strong"), max_context=1024)
    gen = torch.Generator().manual_seed(5)
    body = torch.randint(0, target.config.vocab_size, (40,), generator=gen).tolist()
    prompt = body + body[:20] + body  # repeats, so copying drafters find something
    new = 6 if tiny else 64
    rows, bad = [], []
    for sampled in (False, True):
        sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=3) if sampled else SamplingParams()
        plain = weak_engine.generate(prompt, drafter="none", max_new_tokens=new, sampling=sampling).token_ids
        drafters = ["draft", "lookup", "suffix", "auto"] + ([] if sampled else ["tree"])
        for engine, label in ((weak_engine, "0.5b draft"), (strong_engine, "strong draft")):
            for drafter in drafters:
                if engine is strong_engine and drafter in ("lookup", "suffix"):
                    continue
                result = engine.generate(prompt, drafter=drafter, k=4 if drafter != "auto" else "auto",
                                         max_new_tokens=new, sampling=sampling)
                same = result.token_ids == plain
                rows.append(f"| {'seeded' if sampled else 'greedy'} | {drafter} ({label}) | {result.stats.drafted} |"
                            f" {result.stats.accepted} | {'identical' if same else 'DIFFERS'} |")
                if not same:
                    bad.append(f"{drafter} {label} {'seeded' if sampled else 'greedy'}")
    prompts = [prompt[i * 7 :] + body[: i + 3] for i in range(8)]
    settings = [dict(drafter=d, k=3, sampling=SamplingParams(temperature=0.7, seed=i) if i % 2 else SamplingParams())
                for i, d in enumerate(["none", "draft", "lookup", "suffix", "draft", "lookup", "none", "draft"])]
    solo = [strong_engine.generate(p, max_new_tokens=new // 2, **{**s, "drafter": "none"}).token_ids
            for p, s in zip(prompts, settings)]
    batch = BatchEngine(strong_engine, max_batch=8, prefill_rows=64)
    tickets = [batch.submit(prompts[0], max_new_tokens=new // 2, **settings[0])]
    for p, s in zip(prompts[1:], settings[1:]):
        batch.step()
        tickets.append(batch.submit(p, max_new_tokens=new // 2, **s))
    batch.run()
    staggered = [t.result().token_ids for t in tickets]
    if staggered != solo:
        bad.append("staggered batch")
    report.section("exact outputs (1.5B shape target)", [
        "| decoding | drafter | drafted | accepted | vs plain |", "|---|---|---|---|---|", *rows, "",
        f"- 8 staggered batched requests (none/draft/lookup/suffix, half seeded) vs solo plain: "
        f"{'all identical' if staggered == solo else 'DIFFER'} ({batch.passes} shared passes)"],
        dict(ok=not bad, bad=bad))


# ---------------------------------------------------------------------- issue 64: rounds, sampling, verdicts
# The GPU-path work of issue 64 that no device has run: greedy and sampled draft chains as device rounds (item 2,
# gpu/draft_round.py), sampling's exponential race on the device (item 3, gpu/noise_kernel.py), a batched pass's
# greedy chains judged on the device (item 4, accept.py). Each part: its exactness here, its speed after every
# part's exactness (main()).
def met(value: float, goal: float, at_most: bool = True) -> str:
    if value != value:  # NaN
        return "not measured"
    return "met" if (value <= goal if at_most else value >= goal) else "NOT met"


class _Confidences:
    """A stop rule that keeps every token and records the confidences it is shown past a chain's first token (the
    tokens a round drafts), so that the chain's confidences are computed as they are where a rule reads them."""

    def __init__(self):
        from specdecode.drafters.base import StopRule

        class Recording(StopRule):
            def keep(rule, drafted, chain_prob, confidence):
                if drafted:
                    self.seen.append(confidence)
                return True

        self.seen: list[float] = []
        self.rule = Recording()


def _cut_rule(low: float, high: float):
    """A stop rule that lets every chain past its first token (so that a round runs), then drops a token below
    `low` and ends the chain after one below `high`: set from the draft's own confidences inside rounds, its
    decisions fall inside some rounds."""
    from specdecode.drafters.base import StopRule

    class Cut(StopRule):
        def keep(self, drafted, chain_prob, confidence):
            return drafted == 0 or confidence >= low

        def extend(self, drafted, chain_prob, confidence):
            return drafted == 1 or confidence >= high

    return Cut()


class counting:
    """Counts the calls of module.name (a function) while in the block: calls and the length of each call's
    `arg`-th argument (how many rounds ran together, how many chains were judged together)."""

    def __init__(self, module, name: str, arg: int):
        self.module, self.name, self.arg, self.sizes = module, name, arg, []

    def __enter__(self):
        real = self.real = getattr(self.module, self.name)

        def counted(*args, **kwargs):
            answer = real(*args, **kwargs)
            if answer is not None and len(args[self.arg]):
                self.sizes.append(len(args[self.arg]))
            return answer

        setattr(self.module, self.name, counted)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.real)


def _drafts(drafter, contexts, k, sampling, rule) -> list:
    """Each context's draft from one drafter proposing for every context in turn (later proposals reuse and roll
    back what the earlier ones left in its cache): tokens, confidences, passes, the cache's tokens and length."""
    from specdecode.sampling import PositionNoise

    drafter.reset()
    out = []
    for context in contexts:
        draft = drafter.propose(context, k, sampling, PositionNoise(7), rule)
        out.append((draft.tokens, draft.confidences, draft.forward_passes, list(drafter.cached), drafter.cache.length))
    return out


ROUND_GRAPH = "greedy, each round one CUDA graph (ExactPass.round_graphs)"


def check_rounds(report, draft, tiny):
    """Item 2: a DraftModelDrafter with device rounds proposes what it proposes pass by pass (tokens, the bits of
    the confidences a stop rule reads, where the rule cuts, what its cache holds), greedy and seeded, on the 0.5B
    shape."""
    from specdecode.drafters.draft_model import DraftModelDrafter
    from specdecode.gpu import draft_round
    from specdecode.sampling import SamplingParams

    gen = torch.Generator().manual_seed(64)
    vocab = draft.config.vocab_size
    length = 12 if tiny else 60
    contexts = [torch.randint(0, vocab, (length + 9 * i,), generator=gen).tolist() for i in range(2 if tiny else 4)]
    contexts += [contexts[0]] + ([] if tiny else [contexts[0] + contexts[1][:5]])  # a repeat, an extension
    rounds, loop = DraftModelDrafter(draft, 1024), DraftModelDrafter(draft, 1024)
    rounds.device_rounds, loop.device_rounds = True, False
    samplings = {"greedy": SamplingParams(), "seeded t=0.9 top_p=0.95": SamplingParams(temperature=0.9, top_p=0.95,
                                                                                       seed=11),
                 ROUND_GRAPH: SamplingParams()}
    recorder = _Confidences()
    _drafts(loop, contexts, 8, samplings["greedy"], recorder.rule)
    seen = sorted(recorder.seen)
    low, high = seen[len(seen) // 5], seen[2 * len(seen) // 5]
    rules = {"no stop rule": None, f"a rule cutting at {low:.5g} / {high:.5g}": _cut_rule(low, high)}
    lines = ["| sampling | stop rule | K | proposals | rounds run | chains cut inside a round | vs pass by pass |",
             "|---|---|---|---|---|---|---|"]
    bad, data = [], []
    for s_name, sampling in samplings.items():
        for r_name, rule in rules.items():
            for k in (4,) if tiny else (4, 8):
                draft.exact_pass.round_graphs = s_name == ROUND_GRAPH
                with counting(draft_round, "chain_rounds", 1) as ran:
                    got = _drafts(rounds, contexts, k, sampling, rule)
                draft.exact_pass.round_graphs = False
                want = _drafts(loop, contexts, k, sampling, rule)
                wrong = []
                cut = 0
                for i, ((tokens, probs, passes, cached, cache_len), (tokens2, probs2, passes2, cached2, _)) in \
                        enumerate(zip(got, want)):
                    if tokens != tokens2:
                        wrong.append(f"context {i}: tokens")
                    if str(probs) != str(probs2):  # the same bits (NaN where no rule reads them)
                        wrong.append(f"context {i}: confidences")
                    if cache_len != len(cached) or cached[: len(cached2)] != cached2 or passes < passes2:
                        wrong.append(f"context {i}: cache")
                    cut += 1 < len(tokens) < passes
                same = not wrong
                if not same:
                    bad.append(f"{s_name}, {r_name}, K={k}: " + ", ".join(wrong))
                data.append(dict(sampling=s_name, rule=r_name, k=k, rounds=len(ran.sizes), cut=cut, ok=same))
                lines.append(f"| {s_name} | {r_name} | {k} | {len(contexts)} | {len(ran.sizes)} | {cut} |"
                             f" {'identical' if same else 'DIFFER: ' + ', '.join(wrong[:4])} |")
    no_rounds = all(d["rounds"] == 0 for d in data)
    lines.append(f"\n- confidences of the greedy chains past their first token (the rule's thresholds: their 20th and"
                 f" 40th percentiles): {len(seen)} seen, "
                 f"min {seen[0]:.3g}, median {seen[len(seen) // 2]:.3g}, max {seen[-1]:.3g}")
    if no_rounds:
        lines.append("- NO ROUND RAN: the drafter drafted pass by pass both ways (no GPU path?)")
    if not any(d["cut"] for d in data):
        lines.append("- the rule cut no chain inside a round here (the draft's confidences too alike?): that case is"
                     " unchecked in this run")
    report.section("draft rounds on the device: proposals vs pass by pass (0.5B shape)", lines,
                   dict(ok=not bad and not no_rounds, bad=bad, rows=data))


def _draws_of(pairs, vocab, device, fusion: bool):
    """E of every token for each (seed, position) from the device (fused multiply-adds allowed or not), and the
    compiled kernel (its PTX)."""
    from specdecode.sampling import PositionNoise

    keys = torch.tensor([PositionNoise(seed).key_bits for seed, _ in pairs], device=device)
    positions = torch.tensor([position for _, position in pairs], device=device)
    out = torch.empty(len(pairs), vocab, dtype=torch.float64, device=device)
    kernel = _draws_kernel[(len(pairs), triton.cdiv(vocab, 1024))](keys, positions, out, vocab, BLOCK=1024,
                                                                   enable_fp_fusion=fusion)
    return out.cpu().numpy(), kernel


class capturing_launches:
    """The compiled kernels of a Triton kernel launched as `kernel[grid](...)` from module.name while in the block
    (None under the interpreter): the race kernel's own PTX, as choose_rows compiles it."""

    def __init__(self, module, name: str):
        self.module, self.name, self.compiled = module, name, []

    def __enter__(self):
        real = self.real = getattr(self.module, self.name)
        compiled = self.compiled

        class Launcher:
            def __getitem__(self, grid):
                launch = real[grid]
                return lambda *a, **kw: compiled.append(launch(*a, **kw))

        setattr(self.module, self.name, Launcher())
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.real)


def ptx_of(kernel) -> str:
    asm = getattr(kernel, "asm", None)
    return asm.get("ptx", "") if asm is not None else ""


def check_sampling(report, target, tiny):
    """Item 3 (scripts/device_noise_check.py folded in): the compiled race's noise is the host's bits over Qwen-sized
    rows, the same kernel compiled with fused multiply-adds is not (why every launch turns fusion off), its PTX
    divides with div.rn.f64 and holds no fma.rn.f64 (the race kernel's own too); choose_rows' tokens over 64 rows
    are the host race's of the same probabilities; verify_sampling's draws raced together give the verdict of the
    host's draws and of the row-by-row loop, on the 1.5B shape's logits."""
    import numpy as np

    from specdecode.sampling import PositionNoise, SamplingParams, choose_rows, probabilities
    from specdecode.verify import Verdict, verify_sampling

    device, vocab = target.device, target.config.vocab_size
    lines, data, bad = [], {}, []
    pairs = [(seed, position) for seed in (0, 1, 12345, 2**63 - 1) for position in (0, 7, 2**40)]
    host = np.stack([PositionNoise(seed).exponentials(position, np.arange(vocab)) for seed, position in pairs])
    draws, kernel = _draws_of(pairs, vocab, device, fusion=False)
    unfused = int(np.sum(draws != host))
    data["differing_unfused"] = unfused
    lines.append(f"- noise E(seed, position, token) of {len(pairs)} (seed, position) pairs x {vocab} tokens, device vs"
                 f" host, fusion off: {unfused} of {host.size} differ" + ("" if unfused == 0 else " (MUST be 0)"))
    bad += ["noise, fusion off"] if unfused else []
    if device.type == "cuda":
        fused_draws, fused_kernel = _draws_of(pairs, vocab, device, fusion=True)
        fused = int(np.sum(fused_draws != host))
        ptx, fused_ptx = ptx_of(kernel), ptx_of(fused_kernel)
        with capturing_launches(noise_kernel, "_race_kernel") as race:
            choose_rows(torch.softmax(torch.randn(2, vocab, device=device), -1), [0, 1], [PositionNoise(1)] * 2)
        race_ptx = ptx_of(race.compiled[0]) if race.compiled else ""
        counts = dict(div=ptx.count("div.rn.f64"), fma=ptx.count("fma.rn.f64"), fused_fma=fused_ptx.count("fma.rn.f64"),
                      race_div=race_ptx.count("div.rn.f64"), race_fma=race_ptx.count("fma.rn.f64"))
        data.update(differing_fused=fused, ptx=counts)
        lines.append(f"- the twin compiled with fused multiply-adds: {fused} of {host.size} differ"
                     + (" (the check sees fusion)" if fused else " (NOT caught: this check cannot see fusion here;"
                        " the PTX line is the guard)"))
        ptx_ok = counts["div"] > 0 and counts["fma"] == 0 and (not race_ptx or counts["race_div"] > 0
                                                               and counts["race_fma"] == 0)
        race_line = (f"div.rn.f64 {counts['race_div']}, fma.rn.f64 {counts['race_fma']}" if race_ptx else
                     "its PTX not available from this Triton's launch")
        lines.append(f"- PTX, fusion off: div.rn.f64 {counts['div']}, fma.rn.f64 {counts['fma']}; fusion on:"
                     f" fma.rn.f64 {counts['fused_fma']}; the race kernel as choose_rows compiles it: {race_line}:"
                     f" {'as required' if ptx_ok else 'WRONG'}")
        bad += [] if ptx_ok else ["PTX"]
    gen = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(64, vocab, generator=gen) * 3, -1).to(device)
    noises = [PositionNoise(seed) for seed in range(64)]
    positions = list(range(1000, 1064))
    on_device = choose_rows(probs, positions, noises, device_kernel=True).tolist()
    on_host = choose_rows(probs.cpu(), positions, noises, device_kernel=False).tolist()
    lines.append(f"- choose_rows, 64 rows of {vocab} (softmax of 3 x N(0, 1)), device vs host race:"
                 f" {'same tokens' if on_device == on_host else 'DIFFERENT tokens'}")
    bad += [] if on_device == on_host else ["choose_rows"]
    # verify_sampling on the target's logits: drafts the host's own draws for j rows, then a wrong token
    cache = target.new_cache(1024)
    prompt = torch.randint(0, vocab, (40,), generator=gen).to(device)
    target(prompt, cache, logits="none")
    block = torch.randint(0, vocab, (7,), generator=gen).to(device)
    logits = target(block, cache)
    verdicts_ok, cases = True, 0
    for params in (SamplingParams(temperature=1.0, seed=5), SamplingParams(temperature=0.7, top_p=0.9, seed=6)):
        noise = params.noise()
        rows = logits.shape[0]
        processed = torch.cat([probabilities(logits[i : i + 1], params) for i in range(rows)])
        host_draws = choose_rows(processed.cpu(), [40 + i for i in range(rows)], [noise] * rows,
                                 device_kernel=False).tolist()
        for accepted in (0, 2, rows - 1):
            drafts = host_draws[:accepted] + ([(host_draws[accepted] + 1) % vocab] if accepted < rows - 1 else [])
            want = Verdict(accepted, host_draws[accepted])
            together = verify_sampling(logits[: len(drafts) + 1], drafts, params, noise, 40, device_kernel=True)
            by_row = verify_sampling(logits[: len(drafts) + 1], drafts, params, noise, 40, device_kernel=False)
            cases += 1
            verdicts_ok &= together == want and by_row == want
    lines.append(f"- verify_sampling on the 1.5B shape's logits ({cases} blocks: t=1.0 and t=0.7 top_p=0.9, drafts"
                 f" the host's draws rejected first, third or accepted whole): the draws raced together and row by"
                 f" row give the host's verdict: {'all' if verdicts_ok else 'NOT ALL'}")
    bad += [] if verdicts_ok else ["verify_sampling"]
    data.update(ok=not bad, bad=bad)
    report.section("sampling's race on the device: the host's bits", lines, data)


def check_verdicts(report, target, draft, tiny):
    """Item 4: accept.py's kernel gives verify_greedy's verdicts (tests/test_accept.py's random passes, and one of
    Qwen's vocabulary); a BatchEngine of 16 requests (draft chains greedy and seeded, a tree, lookup, suffix,
    plain) gives each request its solo plain output with device verdicts on and off."""
    from specdecode import accept
    from specdecode.batch import BatchEngine
    from specdecode.engine import Engine
    from specdecode.gpu import draft_round
    from specdecode.sampling import SamplingParams
    from specdecode.verify import verify_greedy
    from testlib import as_loaded, fake_tokenizer

    device, vocab = target.device, target.config.vocab_size
    lines, bad = [], []
    # the kernel alone: small vocabularies (ties, chance agreements), then Qwen's with blocks of up to 40 rows
    kernel_bad = 0
    from testlib import random_pass

    cases = [random_pass(seed) for seed in range(40)]  # tests/test_accept.py's cases
    gen = torch.Generator().manual_seed(4)
    lengths = [0, 15, 16, 3, 39, 31, 4, 4, 0, 7, 2, 1, 5, 5, 8, 4]
    logits = torch.randn(sum(lengths) + len(lengths), vocab, generator=gen)
    choice, firsts, drafts, at = logits.argmax(dim=-1).tolist(), [], [], 0
    for index, length in enumerate(lengths):
        draft_tokens = choice[at : at + length]
        if index % 2 and length:
            draft_tokens[length // 2] = (draft_tokens[length // 2] + 1) % vocab
        firsts.append(at)
        drafts.append(draft_tokens)
        at += length + 1
    cases.append((logits, firsts, drafts))
    for logits, firsts, drafts in cases:
        want = [verify_greedy(logits[f : f + len(d) + 1], d) for f, d in zip(firsts, drafts)]
        on = logits.to(device)
        for method in ("triton", "torch"):
            verdicts, argmaxes = accept.greedy_verdicts(on, firsts, drafts, argmaxes=True, method=method)
            kernel_bad += verdicts != want or argmaxes != logits.argmax(dim=-1).tolist()
    lines.append(f"- accept.py's verdicts ({len(cases)} passes: tests/test_accept.py's 40 random ones, one of {vocab}"
                 f" tokens with 16 requests' blocks of 1..40 rows), the Triton kernel and the torch path vs"
                 f" verify_greedy per request: {'all equal' if not kernel_bad else f'{kernel_bad} DIFFER'}")
    bad += ["kernel"] if kernel_bad else []
    # the batched engine
    tok = fake_tokenizer(vocab)
    engine = Engine(as_loaded(target, tok, "target"), as_loaded(draft, tok, "draft"), max_context=1024)
    requests, new = (6, 4) if tiny else (16, 32)
    body = torch.randint(0, vocab, (30,), generator=gen).tolist()
    prompts = [body[i:] + body[: 10 + i] + body[i:] for i in range(requests)]  # repeats: copying drafters find some
    kinds = ["draft", "draft", "tree", "lookup", "suffix", "none", "lookup", "suffix"]  # the odd ones seeded
    settings = [dict(drafter=kinds[i % 8], k=4, sampling=SamplingParams(temperature=0.8, top_p=0.95, seed=i)
                     if i % 2 and kinds[i % 8] != "tree" else SamplingParams()) for i in range(requests)]
    solo = [engine.generate(p, max_new_tokens=new, **{**s, "drafter": "none"}).token_ids
            for p, s in zip(prompts, settings)]
    rows = []
    for on_device in (False, True):
        batch = BatchEngine(engine, max_batch=requests, prefill_rows=256, device_verdicts=on_device)
        with counting(accept, "greedy_verdicts", 2) as judged, counting(draft_round, "chain_rounds", 1) as ran:
            tickets = [batch.submit(p, max_new_tokens=new, **s) for p, s in zip(prompts, settings)]
            batch.run()
        outputs = [t.result().token_ids for t in tickets]
        stats = [t.result().stats for t in tickets]
        wrong = [i for i, (a, b) in enumerate(zip(outputs, solo)) if a != b]
        bad += [f"device verdicts {'on' if on_device else 'off'}: requests {wrong}"] if wrong else []
        rows.append(f"| {'on' if on_device else 'off'} | {batch.passes} | {sum(s.drafted for s in stats)} |"
                    f" {sum(s.accepted for s in stats)} | {len(judged.sizes)} passes, {sum(judged.sizes)} chains |"
                    f" {len(ran.sizes)}, up to {max(ran.sizes, default=0)} sequences |"
                    f" {'all identical' if not wrong else f'DIFFER: {wrong}'} |")
    lines += ["", f"{requests} batched requests ({new} tokens; drafters draft/lookup/tree/suffix/none with the 0.5B"
              " draft, half of them seeded t=0.8 top_p=0.95) vs each alone, plain:", "",
              "| device verdicts | passes | drafted | accepted | judged on the device | draft rounds run |"
              " vs solo plain |", "|---|---|---|---|---|---|---|", *rows, "",
              "(the suffix drafter also copies from earlier requests, the first run's among them: the second run may"
              " draft and accept more with the same output)"]
    # plain requests, the odd ones seeded, with each pass launched before the last is read (launch_ahead)
    picks = [SamplingParams(temperature=0.8, top_p=0.95, seed=i) if i % 2 else SamplingParams() for i in range(requests)]
    plain = [engine.generate(p, max_new_tokens=new, drafter="none", sampling=s).token_ids for p, s in zip(prompts, picks)]
    batch = BatchEngine(engine, max_batch=requests, prefill_rows=256, launch_ahead=True)
    tickets = [batch.submit(p, drafter="none", max_new_tokens=new, sampling=s) for p, s in zip(prompts, picks)]
    batch.run()
    wrong = [i for i, (t, b) in enumerate(zip(tickets, plain)) if t.result().token_ids != b]
    bad += [f"launch_ahead: requests {wrong}"] if wrong else []
    lines.append(f"- {requests} plain requests (the odd ones seeded) with launch_ahead ({batch.passes_ahead} of"
                 f" {batch.passes} passes launched before the pass before was read) vs each alone: "
                 f"{'all identical' if not wrong else f'DIFFER: {wrong}'}")
    alone = Engine(as_loaded(target, tok, "target"), max_context=1024, launch_ahead=True, check_invariants=True)
    outputs = [alone.generate(p, max_new_tokens=new, drafter="none", sampling=s).token_ids
               for p, s in zip(prompts[:4], picks)]
    wrong = [i for i, (a, b) in enumerate(zip(outputs, plain)) if a != b]
    bad += [f"Engine launch_ahead: requests {wrong}"] if wrong else []
    lines.append(f"- one request at a time, Engine(launch_ahead=True), {len(outputs)} prompts (two seeded) vs plain"
                 f" decoding: {'all identical' if not wrong else f'DIFFER: {wrong}'}")
    report.section("greedy verdicts on the device: the host's verdicts", lines, dict(ok=not bad, bad=bad))


def rounds_speed(report, models, tiny):
    """Item 2's speed: a draft step in target steps; K=4 and K=8 draft proposals as a device round and pass by
    pass; an engine's speculative run (0.5B draft, k=4) against plain decoding on the 1.5B shape."""
    from specdecode.drafters.base import ChainRound
    from specdecode.drafters.draft_model import DraftModelDrafter
    from specdecode.engine import Engine
    from specdecode.gpu.draft_round import chain_rounds
    from specdecode.sampling import PositionNoise, SamplingParams
    from testlib import as_loaded, fake_tokenizer

    draft, target = models["0.5b"], models["1.5b"]
    steps = {name: block_costs(models[name], [1])[1] for name in ("0.5b", "1.5b", "7b") if name in models}
    unit, unit7 = steps["1.5b"], steps.get("7b")

    def in_steps(seconds: float) -> str:
        return f"{seconds / unit:.2f}" + (f" / {seconds / unit7:.3f}" if unit7 else " / -")

    before = 8 if QUICK else 256
    context = torch.randint(0, draft.config.vocab_size, (before,)).tolist()
    cache = draft.new_cache(1024)
    draft(torch.tensor(context[:-1], device=draft.device), cache, logits="none")
    drafter = DraftModelDrafter(draft, 1024)
    noise = PositionNoise(3)
    greedy, sampled = SamplingParams(), SamplingParams(temperature=1.0, seed=3)
    lines = ["| K | what | device round | pass by pass | round / pass by pass | round in 1.5B / 7B steps |",
             "|---|---|---|---|---|---|"]
    data = dict(steps=steps, rows=[])
    for k in (4,) if tiny else (4, 8):
        def bare(sampling=greedy):
            chain_rounds(draft, [ChainRound(cache, context[-1], k, sampling, noise, before)])
            cache.truncate(before - 1)

        rows = {f"a round of {k} passes alone, greedy (pass by pass: {k} draft steps)":
                (timed(bare, repeats=20), k * steps["0.5b"]),
                f"a round of {k} passes alone, sampled t=1.0": (timed(lambda: bare(sampled), repeats=20), float("nan"))}
        loops = {}
        for label, sampling in (("greedy", greedy), ("sampled t=1.0", sampled)):
            per = {}
            for on in (True, False):
                drafter.device_rounds = on
                per[on] = timed(lambda: drafter.propose(context, k, sampling, noise), repeats=20)
            rows[f"a proposal of {k} tokens, {label} (its first pass, then a round of {k - 1})"] = (per[True],
                                                                                                  per[False])
            loops[label] = per[False]
        draft.exact_pass.round_graphs = True
        try:
            graph = timed(lambda: drafter.propose(context, k, greedy, noise), repeats=20)
        finally:
            draft.exact_pass.round_graphs = False
        rows[f"a proposal of {k} tokens, greedy, its round one CUDA graph"] = (graph, loops["greedy"])
        for what, (round_s, loop_s) in rows.items():
            data["rows"].append(dict(k=k, what=what, round=round_s, loop=loop_s))
            lines.append(f"| {k} | {what} | {round_s * 1e3:.3f} ms | "
                         + ("-" if loop_s != loop_s else f"{loop_s * 1e3:.3f} ms") + " | "
                         + ("-" if loop_s != loop_s else f"{round_s / loop_s:.2f}") + f" | {in_steps(round_s)} |")
    drafter.device_rounds = True
    proposal4 = next(r["round"] for r in data["rows"] if r["k"] == 4 and "proposal" in r["what"])
    ratio, ratio7 = steps["0.5b"] / unit, steps["0.5b"] / unit7 if unit7 else float("nan")
    lines += ["", f"- steps after {before} positions (graph replay, argmax, sync): 0.5B {steps['0.5b'] * 1e3:.3f} ms,"
              f" 1.5B {unit * 1e3:.3f} ms" + (f", 7B {unit7 * 1e3:.3f} ms" if unit7 else ", 7B not built"),
              f"- goal: a draft step <= 0.3 of the 1.5B step: {ratio:.2f}, {met(ratio, 0.3)}; <= 0.1 of the 7B step:"
              f" {ratio7:.3f}, {met(ratio7, 0.1)}",
              f"- goal: a K=4 draft round <= 1.2 1.5B steps: the greedy proposal of 4 tokens {proposal4 / unit:.2f},"
              f" {met(proposal4 / unit, 1.2)}"]
    data.update(draft_over_15b=ratio, draft_over_7b=ratio7, proposal4_steps=proposal4 / unit)

    tok = fake_tokenizer(target.config.vocab_size)
    engine = Engine(as_loaded(target, tok, "target"), as_loaded(draft, tok, "draft"), max_context=1024)
    prompt = torch.randint(0, target.config.vocab_size, (8 if QUICK else 64,)).tolist()
    tokens = 4 if tiny else 128

    def run(**settings):
        for new in (min(tokens, 8), tokens):  # the first one warms up
            engine.reset()
            result = engine.generate(prompt, max_new_tokens=new, **settings)
        s = result.stats
        return s.generated_tokens / max(1e-9, s.time_total - s.time_prefill), s

    runs = {"plain": run(drafter="none"), "draft k=4, device rounds": run(drafter="draft", k=4)}
    engine.drafter("draft").device_rounds = False
    runs["draft k=4, pass by pass"] = run(drafter="draft", k=4)
    engine.drafter("draft").device_rounds = True
    lines += ["", "| 1.5B target, greedy | tok/s | drafted | accepted | target passes | draft passes |"
              " tokens a target pass |", "|---|---|---|---|---|---|---|"]
    for label, (speed_, s) in runs.items():
        lines.append(f"| {label} | {speed_:.1f} | {s.drafted} | {s.accepted} | {s.target_passes} | {s.draft_passes} |"
                     f" {s.generated_tokens / max(1, s.target_passes):.2f} |")
        data[label] = dict(tok_s=speed_, drafted=s.drafted, accepted=s.accepted, target_passes=s.target_passes,
                           draft_passes=s.draft_passes)
    lines.append(f"\n(random weights: the 0.5B draft and the 1.5B target are unrelated models, so drafts are rarely"
                 f" accepted and speculation here costs what drafting costs; {tokens} tokens after a"
                 f" {len(prompt)}-token prompt, Engine.generate's own statistics, prefill excluded)")
    report.section("draft rounds: speed (0.5B draft, 1.5B target)", lines, data)


def device_ms(fn, repeats: int = 50) -> float:
    """Milliseconds a call, CUDA events around `repeats` calls after one (host work included)."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def sampling_speed(report, models, tiny):
    """Item 3's speed: the race over 1..64 rows of Qwen's vocabulary next to the host's race of one row; plain
    decoding sampled (t=1.0, and with top_p) against greedy on the 1.5B shape."""
    from specdecode.engine import Engine
    from specdecode.sampling import PositionNoise, SamplingParams, choose_rows
    from testlib import as_loaded, fake_tokenizer

    target = models["1.5b"]
    vocab = target.config.vocab_size
    lines, data = [], {}
    if target.device.type == "cuda":
        probs = torch.softmax(torch.randn(64, vocab, device=target.device) * 3, -1)
        noises = [PositionNoise(seed) for seed in range(64)]
        positions = list(range(1000, 1064))
        race = {rows: device_ms(lambda: choose_rows(probs[:rows], positions[:rows], noises[:rows]))
                for rows in (1, 5, 16, 64)}
        row = probs[0].cpu()
        t0 = time.perf_counter()
        for _ in range(10):
            noises[0].choose(row, 5)
        host = (time.perf_counter() - t0) * 100
        data.update(race_ms=race, host_ms=host)
        lines += [f"- choose_rows over rows of {vocab} tokens (CUDA events, host work included): "
                  + ", ".join(f"{rows} rows {ms * 1e3:.0f} us" for rows, ms in race.items())
                  + f"; the host's race of one row (copy excluded): {host:.2f} ms", ""]
    engine = Engine(as_loaded(target, fake_tokenizer(vocab)), max_context=1024)
    prompt = torch.randint(0, vocab, (8 if QUICK else 64,)).tolist()
    tokens = 4 if tiny else 128
    settings = {"greedy": SamplingParams(), "t=1.0": SamplingParams(temperature=1.0, seed=1),
                "t=1.0 top_p=0.95": SamplingParams(temperature=1.0, top_p=0.95, seed=1)}
    speeds: dict = {name: [] for name in settings}
    for name, sampling in settings.items():  # warm up
        engine.reset()
        engine.generate(prompt, drafter="none", max_new_tokens=4, sampling=sampling)
    for _ in range(1 if tiny else 3):  # alternated, medians
        for name, sampling in settings.items():
            engine.reset()
            s = engine.generate(prompt, drafter="none", max_new_tokens=tokens, sampling=sampling).stats
            speeds[name].append(s.generated_tokens / max(1e-9, s.time_total - s.time_prefill))
    medians = {name: statistics.median(v) for name, v in speeds.items()}
    ratio = medians["t=1.0"] / medians["greedy"]
    lines += ["| plain decoding, 1.5B shape | tok/s (median of the runs) | x greedy |", "|---|---|---|",
              *[f"| {name} | {v:.1f} | {v / medians['greedy']:.3f} |" for name, v in medians.items()],
              "", f"- goal: sampled (t=1.0) >= 0.95x greedy: {ratio:.3f}, {met(ratio, 0.95, at_most=False)}",
              f"({tokens} tokens after a {len(prompt)}-token prompt, Engine.generate's statistics, prefill excluded;"
              f" {len(speeds['greedy'])} runs each, alternated)"]
    data.update(tok_s=speeds, sampled_over_greedy=ratio)
    report.section("sampling on the device: speed (1.5B shape)", lines, data)


def batch_run(engine, prompts, tokens: int, device_verdicts: bool, launch_ahead: bool = False, **settings
              ) -> tuple[float, list, int]:
    """tok/s of the prompts' requests together (prefill included), their outputs, the batch's passes."""
    from specdecode.batch import BatchEngine

    batch = BatchEngine(engine, max_batch=len(prompts), prefill_rows=256, device_verdicts=device_verdicts,
                        launch_ahead=launch_ahead)
    tickets = [batch.submit(prompt, max_new_tokens=tokens, **settings) for prompt in prompts]
    t0 = time.perf_counter()
    batch.run()
    seconds = time.perf_counter() - t0
    outputs = [t.result().token_ids for t in tickets]
    return sum(len(o) for o in outputs) / seconds, outputs, batch.passes


def verdicts_speed(report, models, tiny):
    """Item 4's speed: 16 batched requests with device verdicts on and off (plain, and drafting with the 0.5B
    draft, k=4), each against one request alone."""
    from specdecode.engine import Engine
    from testlib import as_loaded, fake_tokenizer

    target, draft = models["1.5b"], models["0.5b"]
    tok = fake_tokenizer(target.config.vocab_size)
    engine = Engine(as_loaded(target, tok, "target"), as_loaded(draft, tok, "draft"), max_context=1024)
    requests, tokens = (4, 4) if tiny else (16, 64)
    gen = torch.Generator().manual_seed(16)
    prompts = [torch.randint(0, target.config.vocab_size, (32,), generator=gen).tolist() for _ in range(requests)]
    lines = [f"| drafter | 1 request tok/s | {requests}, host verdicts: tok/s (x one) |"
             f" {requests}, device verdicts: tok/s (x one) | device / host | passes | outputs, device = host |",
             "|---|---|---|---|---|---|---|"]
    data = {}
    freeze_loaded_objects()
    try:
        for drafter, extra in (("none", {}), ("draft", dict(k=4))):
            settings = dict(drafter=drafter, **extra)
            batch_run(engine, prompts[:1], 4, True, **settings)  # warm up: graphs of each size
            batch_run(engine, prompts, 4, True, **settings)
            one = max(batch_run(engine, prompts[:1], tokens, True, **settings)[0] for _ in range(1 if tiny else 2))
            best, outputs, passes = {False: 0.0, True: 0.0}, {}, {}
            for _ in range(1 if tiny else 2):  # alternated, the best of each
                for on in (False, True):
                    speed_, outputs[on], passes[on] = batch_run(engine, prompts, tokens, on, **settings)
                    best[on] = max(best[on], speed_)
            same = outputs[False] == outputs[True]
            data[drafter] = dict(one=one, host=best[False], device=best[True], passes=passes, same=same)
            lines.append(f"| {drafter}{' k=4' if extra else ''} | {one:.1f} | {best[False]:.0f}"
                         f" ({best[False] / one:.1f}) | {best[True]:.0f} ({best[True] / one:.1f}) |"
                         f" {best[True] / best[False]:.2f} |"
                         f" {passes[False]} / {passes[True]} | {'same' if same else 'DIFFERENT'} |")
    finally:
        gc.unfreeze()
    # plain requests with each pass launched before the last is read (launch_ahead), alternated with it off
    ahead = {False: 0.0, True: 0.0}
    for _ in range(1 if tiny else 2):
        for on in (False, True):
            ahead[on] = max(ahead[on], batch_run(engine, prompts, tokens, False, launch_ahead=on, drafter="none")[0])
    data["ahead"] = ahead
    lines += ["", f"- plain, host verdicts, launch_ahead off / on: {ahead[False]:.0f} / {ahead[True]:.0f} tok/s"
              f" ({ahead[True] / max(1e-9, ahead[False]):.2f}x; {ahead[True] / data['none']['one']:.1f}x one request)"]
    ratio = max(data["none"]["device"], ahead[True]) / data["none"]["one"]
    lines += ["", f"- goal: {requests} requests >= 12x one request's tok/s (plain, device verdicts or launch_ahead,"
              f" the better): {ratio:.1f}x, {met(ratio, 12.0, at_most=False)}",
              f"({tokens} tokens each after 32-token prompts, prefill included, as the batched table of `speed`; the"
              " best of the runs, host and device alternated; random weights: the draft's chains are rarely"
              " accepted)"]
    data["x_one"] = ratio
    report.section(f"greedy verdicts on the device: speed ({requests} requests, 1.5B shape)", lines, data)

@triton.jit
def _draws_kernel(keys_ptr, positions_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    """E of every token for each row's (key, position): noise_kernel.exponentials as the race draws them."""
    row = tl.program_id(0)
    ids = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key = tl.load(keys_ptr + row).to(tl.uint64, bitcast=True)
    position = tl.load(positions_ptr + row).to(tl.uint64, bitcast=True)
    tl.store(out_ptr + row * vocab + ids, noise_kernel.exponentials(key, position, ids.to(tl.uint64)),
             mask=ids < vocab)


# ---------------------------------------------------------------------- speed
def copy_bandwidth(report, device) -> float:
    if device.type != "cuda":
        report.section("device", ["- no CUDA device: speed figures are the interpreter's, meaningless"], {})
        return 1e9
    size = 2 << 30
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), repeats=10)
    bandwidth = 2 * size / seconds
    props = torch.cuda.get_device_properties(device)
    import triton
    import transformers

    report.section("device", [f"- {props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB;"
                              f" torch {torch.__version__}, triton {triton.__version__}, transformers"
                              f" {transformers.__version__}",
                              f"- device-to-device copy: {bandwidth / 1e12:.2f} TB/s (bytes read + written)"],
                   dict(bandwidth=bandwidth, name=props.name))
    return bandwidth


def plain_speed(model, tokens: int, prompt_len: int = 64, ahead: bool = False) -> float:
    """Decode tokens/s of plain decoding (graph replays, argmax each step), after a prompt. ahead: each step
    launched from the last one's argmax on the device, never read (steps_from_device): the device's pace alone."""
    prompt_len = 8 if QUICK else prompt_len
    cache = model.new_cache(1024)
    prompt = torch.randint(0, model.config.vocab_size, (prompt_len,), device=model.device)
    model(prompt, cache, logits="none")
    token = torch.zeros(1, dtype=torch.long, device=model.device)
    for _ in range(3):
        next_token = model(token, cache).argmax(-1)
    cache.truncate(prompt_len)
    sync()
    t0 = time.perf_counter()
    for _ in range(tokens):
        if ahead:
            token = model.steps_from_device([cache], token).argmax(-1)
        else:
            token = torch.tensor([int(model(token, cache).argmax(-1))], device=model.device)
    sync()
    del next_token
    return tokens / (time.perf_counter() - t0)


def engine_plain_speed(model, tokens: int, launch_ahead: bool = False) -> float:
    from specdecode.engine import Engine
    from testlib import as_loaded, fake_tokenizer

    engine = Engine(as_loaded(model, fake_tokenizer(model.config.vocab_size)), max_context=1024,
                    launch_ahead=launch_ahead)
    prompt = torch.randint(0, model.config.vocab_size, (8 if QUICK else 64,)).tolist()
    engine.generate(prompt, drafter="none", max_new_tokens=4)
    engine.reset()
    result = engine.generate(prompt, drafter="none", max_new_tokens=tokens)
    stats = result.stats
    return stats.generated_tokens / max(1e-9, stats.time_total - stats.time_prefill)


def block_costs(model, sizes) -> dict[int, float]:
    """Median seconds of a pass of each row count after 256 positions."""
    before = 8 if QUICK else 256
    cache = model.new_cache(1024)
    model(torch.randint(0, model.config.vocab_size, (before,), device=model.device), cache, logits="none")
    out = {}
    for rows in sizes:
        block = torch.randint(0, model.config.vocab_size, (rows,), device=model.device)

        def one_pass():
            cache.truncate(before)
            model(block, cache).argmax(-1)

        out[rows] = timed(one_pass, repeats=15)
    return out


def batched_aggregate(engine, requests: int, tokens: int, overlap: bool | None = None) -> tuple[float, float]:
    """tok/s of all requests together, and the median seconds of a pass once every request decodes. overlap: as
    BatchEngine's (by default on, on CUDA: each step's events handed out during the next pass)."""
    from specdecode.batch import BatchEngine

    gen = torch.Generator().manual_seed(requests)
    prompts = [torch.randint(0, engine.target.vocab_size, (32,), generator=gen).tolist() for _ in range(requests)]
    batch = BatchEngine(engine, max_batch=requests, prefill_rows=256, overlap=overlap)
    tickets = [batch.submit(prompt, drafter="none", max_new_tokens=tokens) for prompt in prompts]
    t0, passes = time.perf_counter(), []
    while batch.busy:
        started = time.perf_counter()
        rows = batch.step()
        if rows == requests and batch.last_batch == requests:  # a pass of every request's next token
            passes.append(time.perf_counter() - started)
    aggregate = sum(len(t.result().token_ids) for t in tickets) / (time.perf_counter() - t0)
    return aggregate, statistics.median(passes) if passes else float("nan")


def hf_speed(hf, tokens: int, prompt_len: int = 64, **kwargs) -> float:
    """Decode tokens/s of transformers' generate (its prefill timed apart and subtracted)."""
    ids = torch.randint(0, hf.config.vocab_size, (1, prompt_len), device=hf.device)
    common = dict(do_sample=False, pad_token_id=0, eos_token_id=None, **kwargs)
    hf.generate(ids, max_new_tokens=4, min_new_tokens=4, **common)  # warm up
    sync()
    t0 = time.perf_counter()
    hf.generate(ids, max_new_tokens=1, min_new_tokens=1, **common)
    sync()
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = hf.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, **common)
    sync()
    return (out.shape[1] - prompt_len - 1) / max(1e-9, time.perf_counter() - t0 - prefill)


def exactness_cost(report, model, name, device):
    """Our products (with their split sums added back) and attention against cuBLAS (F.linear) and SDPA on the same
    shapes, each timed as CUDA graph replays."""
    import torch.nn.functional as F

    from specdecode.gpu.exact_pass import pass_metadata
    from specdecode.models.transformer import Segment

    c = model.config
    runner = model.exact_pass
    layer = model.layers[0]
    lines = ["| rows | ours: 4 products of a layer | cuBLAS | ratio | ours: attention (1024 keys) | SDPA | ratio |",
             "|---|---|---|---|---|---|---|"]
    data = {}
    cache = model.new_cache(2048)
    context = 32 if QUICK else 1024
    model(torch.randint(0, c.vocab_size, (context,), device=device), cache, logits="none")
    for rows in (1, 8) if QUICK else (1, 8, 16, 64):
        x = torch.randn(rows, c.hidden_size, device=device, dtype=torch.bfloat16)
        a = torch.randn(rows, c.intermediate_size, device=device, dtype=torch.bfloat16)
        o = torch.randn(rows, c.q_size, device=device, dtype=torch.bfloat16)
        mats = [(x, layer.qkv), (o, layer.out_proj), (x, layer.gate_up), (a, layer.down)]
        ours = graph_timed(lambda: [product_and_sum(runner, inp, w) for inp, w in mats])
        theirs = graph_timed(lambda: [F.linear(inp, w) for inp, w in mats])
        q4 = torch.randn(1, c.n_heads, rows, c.head_dim, device=device, dtype=torch.bfloat16)
        keys = cache.keys[0, :, :context][None]
        values = cache.values[0, :, :context][None]
        sdpa = graph_timed(lambda: F.scaled_dot_product_attention(q4, keys, values, enable_gqa=True))
        cache.truncate(context - rows)
        meta = pass_metadata([Segment([0] * rows, cache)], rows, 1).to(device)
        q = torch.randn(rows, c.n_heads, c.head_dim, device=device, dtype=runner.act_dtype)
        attn = graph_timed(lambda: runner.attend(layer, 0, q, meta, cache.pool, context))
        cache.length = context
        data[rows] = dict(ours=ours, cublas=theirs, attention=attn, sdpa=sdpa)
        lines.append(f"| {rows} | {ours * 1e6:.1f} us | {theirs * 1e6:.1f} us | {ours / theirs:.2f} |"
                     f" {attn * 1e6:.1f} us | {sdpa * 1e6:.1f} us | {attn / sdpa:.2f} |")
    lines.append("\n(CUDA graph replays of 10 calls each; ours adds each product's splits back in order, in the"
                 " product's last split of each tile; SDPA without the causal mask of a block)")
    report.section(f"cost of exactness ({name})", lines, data)


def product_and_sum(runner, x, weight):
    part, splits = runner.product(x, weight)
    if splits == 1:  # the product's last splits summed it (Tiles.fused_sums)
        return part[0]
    rows, n = x.shape[0], weight.shape[0]
    out = torch.empty(rows, n, dtype=torch.float32, device=x.device)
    runner.k.reduce_kernel[(rows, -(-n // 1024))](part, part, out, rows, n, splits, HAS_BIAS=False, BLOCK=1024)
    return out


def profile_pass(report, models):
    """Where a single-row pass spends its device time: one eager pass's kernels under torch.profiler (the captured
    pass replays the same kernels without the launch gaps), against the graph replay's wall time."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():  # the profiler's CUDA activity needs a device (--tiny tries the rest)
        report.section("profile of a step", ["- skipped: no CUDA device to profile"], {})
        return
    for name, model in models.items():
        runner = model.exact_pass
        cache = model.new_cache(1024)
        model(torch.randint(0, model.config.vocab_size, (256,), device=model.device), cache, logits="none")
        token = torch.zeros(1, dtype=torch.long, device=model.device)

        def one_pass():
            cache.truncate(256)
            model(token, cache)

        replay = timed(one_pass, repeats=20)
        saved, runner.graphs = runner.graphs, False
        try:
            for _ in range(3):
                one_pass()
            sync()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    one_pass()
                sync()
        finally:
            runner.graphs = saved
        rows = []
        for event in prof.key_averages():
            device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
            if device_us:
                rows.append((device_us / 5, event.count / 5, event.key))
        rows.sort(reverse=True)
        total = sum(r[0] for r in rows)
        lines = [f"- graph replay of a 1-row pass after 256 positions: {replay * 1e3:.3f} ms; the same pass's kernels"
                 f" sum to {total / 1e3:.3f} ms of device time", "", "| kernel | us per pass | launches per pass |",
                 "|---|---|---|"]
        lines += [f"| {key[:60]} | {us:.1f} | {count:.0f} |" for us, count, key in rows[:14]]
        report.section(f"profile of a step ({name})", lines, dict(replay=replay, total_us=total, rows=rows[:30]))


def check_agreement_float32(report, shape, device):
    """Whether a gap to transformers is the model's chaos or a bug: the same check in float32 (IEEE products in
    ours), and in bfloat16 with transformers' own initial scale (0.02)."""
    lines, data = [], {}
    for label, std, dtype in (("float32, std 0.05", 0.05, torch.float32), ("bfloat16, std 0.02", 0.02, torch.bfloat16)):
        hf = hf_model(shape, 1, device, std=std, dtype=dtype)
        model = native(hf, device, dtype=dtype)
        ids = torch.randint(0, hf.config.vocab_size, (1, 200), device=hf.device)
        with torch.no_grad():
            theirs = hf(ids).logits[0].float()
        ours = model(ids[0], model.new_cache(1024))
        gap = float((ours - theirs).abs().max() / theirs.abs().max())
        top1 = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
        data[label] = dict(gap=gap, top1=top1)
        lines.append(f"- {label}: max |ours - transformers| / max |transformers| = {gap:.2e}; top-1 agreement {top1:.1%}")
        del hf, model
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    report.section("agreement with transformers, float32 and transformers' initial scale (1.5B shape)", lines, data)


def check_loader(report, hf, model, out: Path):
    """A user's way in: a Hugging Face folder through load_model on the device gets the Triton path, and the same
    logits as the model converted in memory."""
    import shutil

    from specdecode.models.loader import load_model

    folder = out / "hf-folder"
    hf.save_pretrained(folder)
    try:
        loaded = load_model(str(folder), device=model.device, dtype="bfloat16", max_context=1024)
        attach_if_cpu(loaded.model, model.device.type == "cpu")
        ids = torch.randint(0, hf.config.vocab_size, (50,), device=model.device)
        same = torch.equal(loaded.model(ids, loaded.model.new_cache()), model(ids, model.new_cache(1024)))
        report.section("load_model on the device", [
            f"- a saved Hugging Face folder, load_model(device={model.device.type}, dtype=bfloat16): precision"
            f" '{loaded.precision}', {loaded.load_seconds:.1f} s; logits of 50 positions"
            f" {'equal' if same else 'DIFFER from'} the in-memory conversion's"], dict(ok=same))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_against_transformers(report, model, hf, name):
    """The Triton pass computes the model: logits against transformers' on the same bf16 weights."""
    ids = torch.randint(0, hf.config.vocab_size, (1, 200), device=hf.device)
    with torch.no_grad():
        theirs = hf(ids).logits[0].float()
    ours = model(ids[0], model.new_cache(1024))
    gap = float((ours - theirs).abs().max() / theirs.abs().max())
    top1 = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
    report.section(f"agreement with transformers ({name})", [
        f"- 200 positions: max |ours - transformers| / max |transformers| = {gap:.4f}; top-1 agreement {top1:.1%}"
        " (bf16 weights and activations in both, summed in different orders)"], dict(gap=gap, top1=top1))


# Fixed tile choices to compare (block_n, block_k, max_split, warps, stages, attn_split): any one of them, fixed for
# the process, is row-exact; the defaults are the first.
# (The H200 sweep of docs/bench/gpu-h200 found the 7B shape fastest with longer splits and 4 stages together, the
# 1.5B shape slower so: each of the two apart tells which one moves which shape. Variants that lost on both shapes
# there, 128-deep steps with 512-long splits and 8 warps, are left out.)
# The last field, what the products fuse: "sums": each product's last split adds the splits (Tiles.fused_sums), else
# the consumers do, one program a row (the former default, whose per-row sums of long reductions cost the 7B shape
# ~10% of its step); "act": the gate|up product applies the gated activation too (Tiles.fused_act), else a kernel
# of its own does.
PASS_VARIANTS = [(64, 64, 512, 4, 3, 64, "sums act"), (64, 64, 512, 4, 3, 64, "sums"), (64, 64, 512, 4, 3, 64, "-"),
                 (64, 64, 512, 4, 3, 256, "sums act"), (128, 64, 512, 4, 3, 64, "sums act"),
                 (64, 64, 1024, 4, 3, 64, "sums act"), (64, 64, 512, 4, 4, 64, "sums act"),
                 (64, 64, 1024, 4, 4, 64, "sums act"), (128, 64, 1024, 4, 3, 64, "sums act"),
                 (64, 128, 1024, 4, 3, 64, "sums act"), (128, 128, 1024, 4, 4, 64, "sums act")]


# The seed's setting (issue 64 item 6): targets of Qwen2.5 7B, 32B and 72B shapes as Q4_K_M blocks, with the
# 0.5B-shape draft as its Q5_0 file. 72B's MLP width (29,568) is no multiple of 256, so its down matrix, Q6_K in a
# Q4_K_M file where it fits, is Q8_0 there (llama-quantize's fallback for Q6_K).
SEED_SHAPES = {name: SHAPES[name] for name in ("7b", "32b", "72b")}
TINY_SEED = {name: TINY[name] for name in ("7b", "32b")}
SEED_VERIFY_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9)
# CPU benchmarks of the real 0.5B -> 1.5B pair whose draft chains' acceptance the projection takes (committed runs)
SEED_ACCEPTANCE = ("docs/bench/draft-chains-humaneval/results.json", "docs/bench/draft-chains-specbench/results.json")
SEED_PROPOSALS = (1, 2, 3, 4, 5, 6, 7, 8)


def seed_layout(shape: dict, tiny: bool) -> dict:
    if tiny:  # tiny widths are not multiples of 256
        return Q5_0_FILE
    return Q4_K_M if shape["intermediate_size"] % 256 == 0 else dict(Q4_K_M, down=("Q8_0",))


def seed_setting(report, bandwidth, device, tiny, acceptance_files):
    """Item 6: each target shape's step next to its bound and its verify blocks of 1..9 rows; the 0.5B-shape draft's
    proposals of 1..8 tokens (its first pass, then a device round); and, projected, the speedup of draft chains
    whose acceptance by depth a CPU benchmark of the real pair measured (scripts/project_gpu_speedup.py)."""
    from specdecode.drafters.draft_model import DraftModelDrafter
    from specdecode.sampling import PositionNoise, SamplingParams

    draft = blocks_model(TINY["0.5b"] if tiny else SHAPES["0.5b"], Q5_0_FILE, device, seed=2)
    before = 8 if QUICK else 256
    context = torch.randint(0, draft.config.vocab_size, (before,)).tolist()
    drafter = DraftModelDrafter(draft, 1024)
    drafter.device_rounds = True
    proposals = {k: timed(lambda: drafter.propose(context, k, SamplingParams(), PositionNoise(3)), repeats=15)
                 for k in SEED_PROPOSALS}
    draft_step = block_costs(draft, [1])[1]
    del drafter, draft
    gc.collect(), torch.cuda.empty_cache() if torch.cuda.is_available() else None
    lines = ["| target | weights read a step | bound | step | % of bound | verify rows 2 / 5 / 9 in steps |"
             " draft step in steps | K=4 proposal in steps |", "|---|---|---|---|---|---|---|---|"]
    data = dict(draft=dict(step=draft_step, proposals=proposals), targets={})
    for name, shape in (TINY_SEED if tiny else SEED_SHAPES).items():
        model = blocks_model(shape, seed_layout(shape, tiny), device, seed=3)
        costs = block_costs(model, SEED_VERIFY_ROWS)
        step, bound = costs[1], weight_bytes(model) / bandwidth
        data["targets"][name] = dict(step=step, verify=costs, bound=bound, bytes=weight_bytes(model))
        lines.append(f"| {name} | {weight_bytes(model) / 1e9:.2f} GB | {bound * 1e3:.2f} ms | {step * 1e3:.2f} ms |"
                     f" {bound / step:.0%} | {costs[2] / step:.2f} / {costs[5] / step:.2f} / {costs[9] / step:.2f} |"
                     f" {draft_step / step:.3f} | {proposals[4] / step:.3f} |")
        del model
        gc.collect(), torch.cuda.empty_cache() if torch.cuda.is_available() else None
    lines += ["", f"- draft (0.5B shape, Q5_0 file's types): step {draft_step * 1e3:.3f} ms; proposals of 1..8 tokens: "
              + ", ".join(f"{proposals[k] * 1e3:.2f}" for k in SEED_PROPOSALS) + " ms"]
    lines += projected_lines(data, acceptance_files)
    report.section("the seed's setting: 7B, 32B and 72B targets as Q4_K_M blocks, the 0.5B draft (item 6)", lines, data)


def projected_lines(data: dict, acceptance_files: list[str]) -> list[str]:
    """The projection's table for each CPU benchmark given (its draft chains' acceptance by depth)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("projection", Path(__file__).with_name("project_gpu_speedup.py"))
    projection = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(projection)
    lines = []
    for path in acceptance_files:
        if not Path(path).exists():
            lines.append(f"- no projection from {path}: not found")
            continue
        bench = json.loads(Path(path).read_text())
        lines += ["", *projection.chain_table(data, bench, label=path)]
        rates = projection.depth_rates(bench)
        if bench.get("config", {}).get("suite") == "humaneval" and rates and "7b" in data["targets"]:
            best = max(projection.chain_speedups(data["targets"]["7b"], data["draft"]["proposals"], rates).values())
            lines.append(f"- goal: the 7B shape's projected speedup on HumanEval >= 2x: {best:.2f}x,"
                         f" {met(best, 2.0, at_most=False)}")
    return lines


def long_prompts(report, hf, device, tiny):
    """Item 5: time to first token of 1k, 4k and 16k-token prompts on the 1.5B shape next to transformers' forward
    of the same prompt (cuBLAS products, SDPA's attention: flash where it applies), then decoding at 32k positions
    (after a 32k-token prompt): time per step and the device's peak memory."""
    sizes, longest = ((48, 96), 160) if tiny else ((1024, 4096, 16384), 32768)
    model = attach_if_cpu(native(hf, device, max_positions=longest + 64), tiny)
    lines = ["| prompt | specdecode: first token | transformers (cuBLAS, SDPA) forward | ratio | goal (4k: <= 1.5x) |",
             "|---|---|---|---|---|"]
    data = {"ttft": {}}
    for n in sizes:
        tokens = torch.randint(0, model.config.vocab_size, (n,), device=device)
        ours = timed(lambda: model(tokens, model.new_cache(n + 64), logits="last").argmax(-1), repeats=3, warmup=1)
        with torch.no_grad():
            ref = timed(lambda: hf_last_logits(hf, tokens).argmax(-1), repeats=3, warmup=1)
        data["ttft"][n] = dict(ours=ours, reference=ref)
        lines.append(f"| {n} | {ours * 1e3:.1f} ms | {ref * 1e3:.1f} ms | {ours / ref:.2f} |"
                     + (f" {met(ours / ref, 1.5)} |" if n == sizes[1] else " |"))
        gc.collect(), torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)
    tokens = torch.randint(0, model.config.vocab_size, (longest,), device=device)
    cache = model.new_cache(longest + 64)
    next_token = model(tokens, cache, logits="last").argmax(-1)
    before = cache.length

    def step():
        cache.truncate(before)
        model(next_token.view(1), cache).argmax(-1)

    per_step = timed(step, repeats=10)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if torch.cuda.is_available() else float("nan")
    data["decode"] = dict(positions=longest, step=per_step, peak_gib=peak)
    lines += ["", f"- decoding at {longest} positions (after a {longest}-token prompt): {per_step * 1e3:.2f} ms a step,"
              f" peak device memory {peak:.1f} GiB (the 1.5B shape's weights, its cache pools, the pass's scratch)"]
    report.section("long prompts: time to first token against cuBLAS + SDPA, decoding at 32k positions (item 5)",
                   lines, data)


def hf_last_logits(hf, tokens):
    """transformers' forward of one prompt without a cache, the last position's logits only (a 16k prompt's full
    logits would take 10 GB)."""
    try:
        return hf(tokens[None], use_cache=False, logits_to_keep=1).logits[0, -1]
    except TypeError:  # transformers before 4.50
        return hf(tokens[None], use_cache=False, num_logits_to_keep=1).logits[0, -1]


def alternated_costs(model, tiles_by_label: dict, sizes, chunk: int = 0) -> dict:
    """{label: {rows: seconds}} of whole passes (block_costs: graph replays after 256 positions) under each tiles,
    alternated twice (a clock or thermal drift falls on all), the faster of the two; with chunk, also an eager
    prompt chunk of that many rows (key "chunk")."""
    saved, runs = model.exact_pass, {label: [] for label in tiles_by_label}
    try:
        for _ in range(2):
            for label, tiles in tiles_by_label.items():
                model.exact_pass = ExactPass(model, tiles)
                costs = block_costs(model, sizes)
                if chunk:
                    tokens = torch.randint(0, model.config.vocab_size, (chunk,), device=model.device)
                    costs["chunk"] = timed(lambda: model(tokens, model.new_cache(1024), logits="none"), repeats=5)
                runs[label].append(costs)
    finally:
        model.exact_pass = saved
    return {label: {key: min(run[key] for run in done) for key in done[0]} for label, done in runs.items()}


class SwappedUpToSixteenRows(ExactPass):
    """A twin for part swap: transposed 16-row tiles for passes of up to 16 rows, the default tiles beyond (the tile
    chosen by rows). Whether it changes bits is the device's question (under the interpreter it cannot)."""

    def product(self, x, weight, **options):
        if x.shape[0] > 16:
            return super().product(x, weight, **options)
        self.tiles, kept = self.tiles.swapped(), self.tiles
        try:
            return super().product(x, weight, **options)
        finally:
            self.tiles = kept


# Tiles that may change a product's bits against the defaults' (another MMA shape, reductions in another kernel's
# layout): each is checked for exact rows on its own, compared with the defaults' bits (for the record), and timed.
VARIANTS = {
    "swap": ("16-row tiles, weights on the MMA's M side (Tiles.swapped)", lambda t: t.swapped()),
    "epilogue": ("sublayers and the QKV epilogue ended in their products' last tiles (Tiles.fused_residual,"
                 " fused_qkv, with fused sums and activation: five launches a layer)",
                 lambda t: dataclasses.replace(t, fused_sums=True, fused_act=True, fused_residual=True, fused_qkv=True)),
    "swap+epilogue": ("both", lambda t: dataclasses.replace(t, fused_sums=True, fused_act=True, fused_residual=True,
                                                           fused_qkv=True).swapped()),
}


def tiles_variants(report, models, bandwidth, tiny):
    """Issue 64 item 1, parts swap and epilogue: the 1.5B shape's rows exact under each variant (check_rows), its
    bits against the defaults' and (swap) a twin's, then passes of 1, 8 and 16 rows and a 128-row prompt chunk per
    shape, each variant against the defaults, alternated."""
    model = models["1.5b"]
    saved = model.exact_pass
    tokens = torch.randint(0, model.config.vocab_size, (40,), device=model.device)
    reference = model(tokens, model.new_cache(1024))
    lines = []
    for label, change in VARIANTS.values():
        model.exact_pass = ExactPass(model, change(saved.tiles))
        try:
            check_rows(report, model, f"1.5B shape, {label}", tiny)
            same = torch.equal(model(tokens, model.new_cache(1024)), reference)
        finally:
            model.exact_pass = saved
        lines.append(f"- {label}: a 40-row prompt's logits {'bitwise equal to' if same else 'differ from'} the"
                     " defaults' (either is exact; this says whether the MMA's operand sides or the reduction's"
                     " kernel change bits)")
    model.exact_pass = SwappedUpToSixteenRows(model, saved.tiles)
    try:
        cache = model.new_cache(1024)
        steps = torch.cat([model(tokens[i : i + 1], cache) for i in range(20)])
        twin = torch.equal(model(tokens[:20], model.new_cache(1024)), steps)
    finally:
        model.exact_pass = saved
    lines.append(f"- twin (transposed 16-row tiles up to 16 rows, the defaults beyond): its 20-row prompt's rows"
                 f" {'equal' if twin else 'differ from'} its single steps ('differ': the rows check catches a tile"
                 " chosen by rows on this device; 'equal': the operand sides do not change bits here)")
    lines += ["", "| shape | variant | 1 row | 8 rows | 16 rows | 128-row chunk | 1 row: variant / defaults |"
                  " bound share |", "|---|---|---|---|---|---|---|---|"]
    data = {}
    for name, each in models.items():
        tiles = {"defaults": each.exact_pass.tiles, **{key: change(each.exact_pass.tiles)
                                                      for key, (_, change) in VARIANTS.items()}}
        costs = alternated_costs(each, tiles, [1, 8, 16], chunk=128)
        bound = weight_bytes(each) / bandwidth
        for key, c in costs.items():
            lines.append(f"| {name} | {key} | {c[1] * 1e3:.3f} ms | {c[8] * 1e3:.3f} ms | {c[16] * 1e3:.3f} ms |"
                         f" {c['chunk'] * 1e3:.2f} ms | {c[1] / costs['defaults'][1]:.3f} | {bound / c[1]:.0%} |")
        data[name] = costs
    report.section("tiles that may change bits: transposed 16-row tiles, sublayers ended in the products", lines, data)


def pdl_speed(report, models, bandwidth):
    """Whole passes (1 and 8 rows, graph replays) with programmatic dependent launch (Tiles.pdl) against without,
    alternated, in each model's production tiles; its bits are checked with the other unmeasured tiles (part
    exact). Issue 64 item 1: the gaps between a pass's ~230 kernels are what PDL hides."""
    lines = ["| shape | off: 1 row | on: 1 row | off: 8 rows | on: 8 rows | 1 row: on / off | bound share on |",
             "|---|---|---|---|---|---|---|"]
    data = []
    for name, model in models.items():
        costs = alternated_costs(model, {pdl: dataclasses.replace(model.exact_pass.tiles, pdl=pdl)
                                         for pdl in (False, True)}, [1, 8])
        off, on = costs[False], costs[True]
        bound = weight_bytes(model) / bandwidth
        lines.append(f"| {name} | {off[1] * 1e3:.3f} ms | {on[1] * 1e3:.3f} ms | {off[8] * 1e3:.3f} ms | "
                     f"{on[8] * 1e3:.3f} ms | {on[1] / off[1]:.3f} | {bound / on[1]:.0%} |")
        data.append(dict(shape=name, off=off, on=on, bound=bound))
    report.section("programmatic dependent launch (Tiles.pdl)", lines, data)


def tile_sweep(report, models, bandwidth, tiny):
    """Whole passes (1 and 8 rows after 256 positions, graph replays) under other fixed tiles: the data for choosing
    the defaults by measurement."""
    from specdecode.gpu.exact_pass import ExactPass, Tiles

    lines = ["| block_n | block_k | max split | warps | stages | attention split | fused | " + " | ".join(
        f"{name} 1 row | {name} 8 rows" for name in models) + " |", "|---" * (7 + 2 * len(models)) + "|"]
    data = []
    for variant in PASS_VARIANTS[:3] if tiny else PASS_VARIANTS:
        block_n, block_k, max_split, warps, stages, attn_split, fused = variant
        tiles = Tiles(block_n=block_n, block_k=block_k, max_split=max_split, warps=warps, stages=stages,
                      attn_split=attn_split, fused_sums="sums" in fused, fused_act="act" in fused)
        cells = []
        for model in models.values():
            saved, model.exact_pass = model.exact_pass, ExactPass(model, tiles)
            try:
                costs = block_costs(model, [1, 8])
                bound = weight_bytes(model) / bandwidth
                cells += [f"{costs[1] * 1e3:.3f} ms ({bound / costs[1]:.0%})", f"{costs[8] * 1e3:.3f} ms"]
                data.append(dict(variant=variant, shape=model.config.hidden_size, step=costs[1], rows8=costs[8]))
            except Exception as exc:  # noqa: BLE001  a tile the compiler refuses is reported, not fatal
                cells += ["failed", "failed"]
                print(f"tiles {variant}: {exc}", flush=True)
            finally:
                model.exact_pass = saved
        lines.append("| " + " | ".join(str(v) for v in variant) + " | " + " | ".join(cells) + " |")
    lines.append("\n(percent: the bandwidth bound's share of the step, i.e. the fraction of the bound reached)")
    report.section("whole passes under other fixed tiles", lines, data)


# Per-shape candidates: (block_n, split, warps, stages), split 0 meaning the default rule's; the defaults first
SHAPE_CANDIDATES = [(64, 0, 4, 3), (32, 0, 4, 3), (128, 0, 4, 3), (64, 256, 4, 3), (64, 1024, 4, 3),
                    (64, 0, 8, 4), (32, 256, 4, 4), (128, 1024, 8, 3)]


def shape_tiles(report, models, tiny):
    """Issue 64: each product shape of each model (QKV, output, gate|up, down) under other tiles of its own
    (Tiles.shapes: chosen by N and K, never by rows), graph-timed at 1 and 8 rows with its splits summed. A shape
    keeps the fastest candidate at 1 row whose 8-row time is within 5% of the defaults'; the table is printed as
    the Python to paste into Tiles.shapes."""
    from specdecode.gpu.exact_pass import ExactPass, ShapeTiles

    lines = ["| model | shape N x K | default: 1 row / 8 rows | chosen | chosen: 1 row / 8 rows | 1 row: chosen / default |",
             "|---|---|---|---|---|---|"]
    table, data = {}, []
    candidates = SHAPE_CANDIDATES[:2] if tiny else SHAPE_CANDIDATES
    for name, model in models.items():
        layer = model.layers[0]
        saved = model.exact_pass
        device = model.embed.device
        for weight in (layer.qkv, layer.out_proj, layer.gate_up, layer.down):
            n, k = weight.shape
            times = {}
            for cand in candidates:
                tiles = dataclasses.replace(saved.tiles, shapes=(((n, k), ShapeTiles(*cand)),))
                runner = ExactPass(model, tiles)
                try:
                    times[cand] = {rows: graph_timed(lambda x=torch.randn(rows, k, device=device, dtype=runner.act_dtype):
                                                     product_and_sum(runner, x, weight)) for rows in (1, 8)}
                except Exception as exc:  # noqa: BLE001  a tile the compiler refuses is reported, not fatal
                    print(f"shape tiles {name} {n}x{k} {cand}: {exc}", flush=True)
            base = times.get(candidates[0])
            if base is None:
                continue
            fine = [cand for cand, t in times.items() if t[8] <= 1.05 * base[8]]
            best = min(fine, key=lambda cand: times[cand][1])
            if best != candidates[0]:
                table[(n, k)] = best
            data.append(dict(model=name, n=n, k=k, times={str(cand): t for cand, t in times.items()}, chosen=best))
            lines.append(f"| {name} | {n} x {k} | {base[1] * 1e6:.1f} / {base[8] * 1e6:.1f} us | {best} |"
                         f" {times[best][1] * 1e6:.1f} / {times[best][8] * 1e6:.1f} us |"
                         f" {times[best][1] / base[1]:.3f} |")
        model.exact_pass = saved
    pasted = ", ".join(f"(({n}, {k}), ShapeTiles{cand})" for (n, k), cand in sorted(table.items()))
    lines.append(f"\nTiles.shapes for this device: `({pasted},)`" if table else "\nNo shape beat the defaults.")
    lines.append("(graph replays of 10 products with their splits summed; candidates (block_n, split, warps,"
                 " stages); the exact rows under a table: tests/gpu/test_triton_rows.py)")
    report.section("tiles per weight shape", lines, data)


def speed(report, models, hfs, bandwidth, tiny):
    tokens = 4 if tiny else 128
    lines = ["| shape | weights read per token | bandwidth bound | specdecode plain | % of bound |"
             " transformers generate (static cache) | ratio |", "|---|---|---|---|---|---|---|"]
    data = {}
    for name, model in models.items():
        bound = bandwidth / weight_bytes(model)
        ours = plain_speed(model, tokens)
        engine_speed = engine_plain_speed(model, tokens)
        ahead = engine_plain_speed(model, tokens, launch_ahead=True)
        unread = plain_speed(model, tokens, ahead=True)
        try:
            theirs = hf_speed(hfs[name], tokens, cache_implementation="static", disable_compile=True)
        except Exception as exc:  # noqa: BLE001  a peer's failure is reported, not fatal
            theirs = float("nan")
            print(f"transformers static cache failed on {name}: {exc}", flush=True)
        data[name] = dict(bound=bound, ours=ours, engine=engine_speed, engine_ahead=ahead, unread=unread,
                          hf_static=theirs)
        lines.append(f"| {name} | {weight_bytes(model) / 1e9:.2f} GB | {bound:.0f} tok/s | {ours:.1f} tok/s"
                     f" (engine {engine_speed:.1f}, launch_ahead {ahead:.1f}: {100 * ahead / bound:.0f}%;"
                     f" steps never read {unread:.1f}: {100 * unread / bound:.0f}%) |"
                     f" {100 * ours / bound:.0f}% | {theirs:.1f} tok/s | {ours / theirs:.2f}x |")
    lines.append("\n(specdecode: a loop of single steps and argmax; engine: Engine.generate with drafter none, its"
                 " stop checks, statistics and detokenizing included; launch_ahead: the engine launching each step"
                 " from the device's argmax before reading the step before; never read: the loop launching each step"
                 " from the last one's argmax with no read at all, the device's own pace)")
    report.section("plain decoding", lines, data)

    target, draft = models["1.5b"], models["0.5b"]
    costs = block_costs(target, (1, 2, 4) if tiny else range(1, 17))
    draft_step = block_costs(draft, [1])[1]
    lines = ["| rows | " + " | ".join(str(r) for r in costs) + " |", "|---" * (len(costs) + 1) + "|",
             "| single steps | " + " | ".join(f"{costs[r] / costs[1]:.2f}" for r in costs) + " |", "",
             f"- one step of the 1.5B shape: {costs[1] * 1e3:.2f} ms; the 0.5B draft's step: {draft_step * 1e3:.2f} ms"
             f" = {draft_step / costs[1]:.2f} target steps"]
    report.section("verify blocks (1.5B shape, after 256 positions)", lines,
                   dict(costs=costs, draft_step=draft_step))

    from specdecode.engine import Engine
    from testlib import as_loaded, fake_tokenizer

    engine = Engine(as_loaded(target, fake_tokenizer(target.config.vocab_size)), max_context=1024)
    per, pass_seconds = {}, {}
    freeze_loaded_objects()  # as the server does once loaded: no full garbage collection walks the models mid-run
    for requests in (1, 4) if tiny else (1, 4, 8, 16, 32):
        per[requests], pass_seconds[requests] = batched_aggregate(engine, requests, 4 if tiny else 64)
    most = 4 if tiny else 16
    at_once = batched_aggregate(engine, most, 4 if tiny else 64, overlap=False)[0]
    gc.unfreeze()
    bare = {**costs, **block_costs(target, [r for r in per if r not in costs])}
    # the engine's pass against the bare pass of as many rows: what the host adds (verdicts, plans, metadata)
    host = {r: pass_seconds[r] - bare[r] for r in per}
    lines = ["| requests | " + " | ".join(str(r) for r in per) + " |", "|---" * (len(per) + 1) + "|",
             "| tok/s, all requests | " + " | ".join(f"{v:.0f}" for v in per.values()) + " |",
             "| x one request | " + " | ".join(f"{v / per[1]:.1f}" for v in per.values()) + " |",
             "| ms per decoding pass | " + " | ".join(f"{pass_seconds[r] * 1e3:.2f}" for r in per) + " |",
             "| ms of one sequence's block of as many rows | " + " | ".join(f"{bare[r] * 1e3:.2f}" for r in per) + " |",
             "| host us per request and pass | " + " | ".join(f"{host[r] / r * 1e6:.0f}" for r in per) + " |",
             "", f"- {most} requests with each step's events handed out at once, not during the next pass "
             f"(BatchEngine overlap off): {at_once:.0f} tok/s, {at_once / per[most]:.2f} of the table's"]
    report.section("batched plain decoding (1.5B shape, 64 tokens each, prompts of 32)", lines,
                   dict(aggregate=per, pass_seconds=pass_seconds, bare=bare, overlap_off=at_once))

    hf_t, hf_d = hfs["1.5b"], hfs["0.5b"]
    rows = {}
    for label, kwargs in (("plain (dynamic cache)", {}), ("static cache", dict(cache_implementation="static",
                                                                              disable_compile=True)),
                          ("assisted, 0.5B draft", dict(assistant_model=hf_d)),
                          ("prompt lookup", dict(prompt_lookup_num_tokens=10))):
        try:
            rows[label] = hf_speed(hf_t, tokens, **kwargs)
        except Exception as exc:  # noqa: BLE001
            rows[label] = float("nan")
            print(f"transformers {label} failed: {exc}", flush=True)
    lines = ["| transformers on the 1.5B shape | decode tok/s |", "|---|---|",
             *[f"| {k} | {v:.1f} |" for k, v in rows.items()],
             f"| specdecode plain (for reference) | {data['1.5b']['ours']:.1f} |"]
    report.section("transformers' generate modes (random weights: their drafts are rarely accepted)", lines, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-check-out")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU runs them through Triton's interpreter)")
    parser.add_argument("--parts", default="exact,exact7b,rounds,sampling,verdicts,pdl,swap,long,agree,7b,speed,cost,blocks,"
                                               "profile,tiles,shape_tiles,seed")
    parser.add_argument("--acceptance", default=",".join(SEED_ACCEPTANCE),
                        help="CPU benchmark results (results.json) whose draft chains' acceptance by depth the part"
                             " seed projects speedups from")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds after which no further part starts (the parts run in order of importance;"
                             " default 330, none with --tiny: the interpreter's run is a try of the script)")
    args = parser.parse_args()
    if args.budget is None:
        args.budget = float("inf") if args.tiny else 330.0
    global QUICK
    QUICK = args.tiny
    if os.environ.get("TRITON_INTERPRET") == "1":
        from testlib import fast_triton_interpreter

        fast_triton_interpreter()
    report = Report(Path(args.out))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = TINY if args.tiny else SHAPES
    parts = set(args.parts.split(","))
    started = time.perf_counter()
    bandwidth = copy_bandwidth(report, device)

    def run(part, fn, *a):
        if part not in parts:
            return
        if time.perf_counter() - started > args.budget:
            report.section(f"{part}: skipped", [f"- over the {args.budget:.0f} s budget"], "skipped")
            return
        t0 = time.perf_counter()
        try:
            fn(*a)
        except Exception:  # noqa: BLE001  one part's failure must not hide the others' results
            report.section(f"{part}: FAILED", ["```", traceback.format_exc()[-3000:], "```"], "failed")
        print(f"[{part}: {time.perf_counter() - t0:.0f}s, {time.perf_counter() - started:.0f}s in all]", flush=True)

    if parts - {"seed"}:
        shared_parts(run, report, parts, shapes, device, bandwidth, args, started)
        gc.collect(), torch.cuda.empty_cache() if torch.cuda.is_available() else None  # the part seed's memory
    run("seed", seed_setting, report, bandwidth, device, args.tiny, args.acceptance.split(","))
    print(f"done in {time.perf_counter() - started:.0f}s", flush=True)


def shared_parts(run, report, parts, shapes, device, bandwidth, args, started):
    """Every part but seed, over the 1.5B and 0.5B shapes built once for all of them (and the 7B where asked)."""
    hfs = {name: hf_model(shapes[name], seed, device) for name, seed in (("1.5b", 1), ("0.5b", 2))}
    models = {name: attach_if_cpu(native(hf, device), args.tiny) for name, hf in hfs.items()}
    print(f"models built in {time.perf_counter() - started:.0f}s", flush=True)
    # Exactness first (issue 63: the kernels since the last device run have never run on one), then speed
    run("exact", check_rows, report, models["1.5b"], "1.5B shape", args.tiny)
    run("blocks", check_block_products, report, models["1.5b"].exact_pass, args.tiny)
    run("exact", check_against_transformers, report, models["1.5b"], hfs["1.5b"], "1.5B shape")
    run("exact", check_loader, report, hfs["0.5b"], models["0.5b"], Path(args.out))
    strong = None
    if "exact" in parts:
        strong = attach_if_cpu(native(hf_perturbed(hfs["1.5b"]), device), args.tiny)
    run("exact", check_identity, report, models["1.5b"], models["0.5b"], strong, args.tiny)
    del strong
    if parts & {"7b", "exact7b"}:
        hfs["7b"] = hf_model(shapes["7b"], 3, device)
        models["7b"] = attach_if_cpu(native(hfs["7b"], device), args.tiny)
    if "7b" in models:
        run("exact7b", check_rows, report, models["7b"], "7B shape", args.tiny)
    # Issue 64's device work (draft rounds, sampling's race, verdicts): each part's exactness, then their speed
    run("rounds", check_rounds, report, models["0.5b"], args.tiny)
    run("sampling", check_sampling, report, models["1.5b"], args.tiny)
    run("verdicts", check_verdicts, report, models["1.5b"], models["0.5b"], args.tiny)
    run("rounds", rounds_speed, report, models, args.tiny)
    run("sampling", sampling_speed, report, models, args.tiny)
    run("verdicts", verdicts_speed, report, models, args.tiny)
    run("pdl", pdl_speed, report, models, bandwidth)
    run("swap", tiles_variants, report, models, bandwidth, args.tiny)
    run("long", long_prompts, report, hfs["1.5b"], device, args.tiny)
    run("agree", check_agreement_float32, report, shapes["1.5b"], device)
    run("speed", speed, report, models, hfs, bandwidth, args.tiny)
    run("cost", exactness_cost, report, models["1.5b"], "1.5B shape", device)
    if "7b" in models:
        run("cost", exactness_cost, report, models["7b"], "7B shape", device)
    run("blocks", block_speed, report, models, hfs, bandwidth, args.tiny)
    run("profile", profile_pass, report, {k: v for k, v in models.items() if k != "0.5b"})
    run("tiles", tile_sweep, report, {k: v for k, v in models.items() if k != "0.5b"}, bandwidth, args.tiny)
    run("shape_tiles", shape_tiles, report, models, args.tiny)


def hf_perturbed(hf):
    """A copy of `hf` with a little noise on every weight: a draft that agrees with it most of the time."""
    import copy

    twin = copy.deepcopy(hf)
    with torch.no_grad():
        for param in twin.parameters():
            param.add_((0.02 * param.float().abs().mean() * torch.randn_like(param.float())).to(param.dtype))
    return twin


if __name__ == "__main__":
    main()
