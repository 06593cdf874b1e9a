"""The GPU device check: exactness and speed of the Triton path, peers in the same run (scripts/gpu_check.sh).

Models with random weights in the real shapes of Qwen2.5 0.5B / 1.5B / 7B are built on the device (no weights
travel), as transformers models first and then converted, so that both engines run the same weights. Parts:
- exact: rows of blocks of 1..64 rows and of a prompt chunk against single steps, bitwise; batches of 1..16
  sequences against each sequence alone; every drafter's greedy output and seeded chain drafters' output against
  plain decoding; 8 staggered batched requests against their solo outputs;
- speed: plain decoding per shape next to its bandwidth bound; verify blocks of 1..16 rows in single steps; the
  batched aggregate at 1..32 requests; the draft step in target steps; transformers' generate (static cache),
  assisted generation and prompt lookup on the same models; our products and attention against cuBLAS and SDPA.
Each part writes its table to OUT/report.md as it finishes (and its numbers to OUT/results.json), and a part that
fails is reported without stopping the others. `--tiny` runs everything on tiny shapes (on a CPU: Triton's
interpreter), to try the script itself without a GPU.
"""
from __future__ import annotations

import argparse
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

import torch

from specdecode.build import freeze_loaded_objects
from specdecode.gpu.gguf_blocks import BlockWeight

SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
TINY = {
    "0.5b": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
    "7b": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=1, vocab_size=512, tie_word_embeddings=False),
}


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
def hf_model(shape: dict, seed: int, device, std: float = 0.05, dtype=torch.bfloat16):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**shape, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                         head_dim=shape["hidden_size"] // shape["num_attention_heads"])
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # larger than the 0.02 init, so that random models' logits are not all near-ties
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, std if "bias" not in name else 0.2)
    return model.to(dtype).eval()


def native(hf, device, dtype=torch.bfloat16):
    from specdecode.models.hf_loader import native_from_hf
    from specdecode.models.loader import _finish_native

    model = native_from_hf(hf.config.to_dict(), dict(hf.state_dict()), device, dtype, max_positions=4096)
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


def random_block_part(kind: int, first: int, rows: int, cols: int, device):
    """A BlockPart of random quants and small scales made on the device (no raw blocks: only speed is measured)."""
    from specdecode.gpu import gguf_blocks as gb

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


def with_random_blocks(model, layout: dict):
    """`model` with every matrix replaced by random blocks of the layout's types (part rows as the model's)."""
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
            parts.append(random_block_part(kind, first, sum(counts), cols, model.device))
            first += sum(counts)
        owner._parameters.pop(name, None)
        setattr(owner, name, gb.BlockWeight(parts, cols))
    torch.cuda.empty_cache() if model.device.type == "cuda" else None
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
              ("fused, splits and segments arriving in reverse", dict(fused_sums=True, fused_act=True, reversed=True)))


def repeat_and_unfused(model, block, prompt: int, cache, repeats: int) -> list[str]:
    """The block again and again, and under each of UNMEASURED's tiles, again and again (which split of a product
    tile, or segment of a row's attention, arrives last varies from run to run; the order of the sum must not):
    each must give the first run's bits."""
    import dataclasses

    from specdecode.gpu.exact_pass import ExactPass

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


def plain_speed(model, tokens: int, prompt_len: int = 64) -> float:
    """Decode tokens/s of plain decoding (graph replays, argmax each step), after a prompt."""
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
        token = torch.tensor([int(model(token, cache).argmax(-1))], device=model.device)
    sync()
    del next_token
    return tokens / (time.perf_counter() - t0)


def engine_plain_speed(model, tokens: int) -> float:
    from specdecode.engine import Engine
    from testlib import as_loaded, fake_tokenizer

    engine = Engine(as_loaded(model, fake_tokenizer(model.config.vocab_size)), max_context=1024)
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
        attn = graph_timed(lambda: runner.attend(layer, 0, q, meta, cache.pool))
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


def attention_only(model, cache, rows, context):
    from specdecode.gpu.exact_pass import pass_metadata
    from specdecode.models.transformer import Segment

    runner, c = model.exact_pass, model.config
    cache.truncate(context - rows)
    meta = pass_metadata([Segment([0] * rows, cache)], rows, 1).to(model.device)
    q = torch.randn(rows, c.n_heads, c.head_dim, device=model.device, dtype=runner.act_dtype)
    return runner.attend(model.layers[0], 0, q, meta, cache.pool)


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


def speed(report, models, hfs, bandwidth, tiny):
    tokens = 4 if tiny else 128
    lines = ["| shape | weights read per token | bandwidth bound | specdecode plain | % of bound |"
             " transformers generate (static cache) | ratio |", "|---|---|---|---|---|---|---|"]
    data = {}
    for name, model in models.items():
        bound = bandwidth / weight_bytes(model)
        ours = plain_speed(model, tokens)
        engine_speed = engine_plain_speed(model, tokens)
        try:
            theirs = hf_speed(hfs[name], tokens, cache_implementation="static", disable_compile=True)
        except Exception as exc:  # noqa: BLE001  a peer's failure is reported, not fatal
            theirs = float("nan")
            print(f"transformers static cache failed on {name}: {exc}", flush=True)
        data[name] = dict(bound=bound, ours=ours, engine=engine_speed, hf_static=theirs)
        lines.append(f"| {name} | {weight_bytes(model) / 1e9:.2f} GB | {bound:.0f} tok/s | {ours:.1f} tok/s"
                     f" (engine {engine_speed:.1f}) | {100 * ours / bound:.0f}% | {theirs:.1f} tok/s |"
                     f" {ours / theirs:.2f}x |")
    lines.append("\n(specdecode: a loop of single steps and argmax; engine: Engine.generate with drafter none, its"
                 " stop checks, statistics and detokenizing included)")
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
    parser.add_argument("--parts", default="exact,agree,7b,exact7b,speed,cost,blocks,profile,tiles")
    parser.add_argument("--budget", type=float, default=330.0,
                        help="seconds after which no further part starts (the parts run in order of importance)")
    args = parser.parse_args()
    global QUICK
    QUICK = args.tiny
    if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter's overflow checks cost most of its time
        import dataclasses

        from triton.runtime import interpreter

        builder = interpreter.interpreter_builder
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    report = Report(Path(args.out))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = TINY if args.tiny else SHAPES
    parts = set(args.parts.split(","))
    started = time.perf_counter()
    bandwidth = copy_bandwidth(report, device)
    hfs = {name: hf_model(shapes[name], seed, device) for name, seed in (("1.5b", 1), ("0.5b", 2))}
    models = {name: attach_if_cpu(native(hf, device), args.tiny) for name, hf in hfs.items()}
    print(f"models built in {time.perf_counter() - started:.0f}s", flush=True)

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
    run("agree", check_agreement_float32, report, shapes["1.5b"], device)
    run("speed", speed, report, models, hfs, bandwidth, args.tiny)
    run("cost", exactness_cost, report, models["1.5b"], "1.5B shape", device)
    if "7b" in models:
        run("cost", exactness_cost, report, models["7b"], "7B shape", device)
    run("blocks", block_speed, report, models, hfs, bandwidth, args.tiny)
    run("profile", profile_pass, report, {k: v for k, v in models.items() if k != "0.5b"})
    run("tiles", tile_sweep, report, {k: v for k, v in models.items() if k != "0.5b"}, bandwidth, args.tiny)
    print(f"done in {time.perf_counter() - started:.0f}s", flush=True)


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
