"""Every Triton kernel the GPU path launches, compiled for a GPU architecture (sm_90, the H100's and H200's, by
default) on a machine with no GPU: Triton's compiler and the ptxas its wheel carries need no device.

The interpreter (the tests' way to run the kernels) accepts what a GPU's compiler refuses: a jit helper's default it
cannot type, a `tl.dot` narrower than 16 rows, a tile whose buffers exceed the device's shared memory, more registers
than a block may hold. Those would first show on a lent GPU, whose minutes should go to measuring. So:
1. a child process under TRITON_INTERPRET=1 drives the GPU path (passes of 1, 5, 16 and 100 rows, batches, a token
   tree, a step from the device, sampling's race, the device verdicts) over models of the real Qwen2.5 0.5B-72B
   shapes (bfloat16 and the GGUF layouts the device check builds), Gemma 3, Llama 3 and SmolLM2 shapes, and the 1.5B
   shape with every matrix of each GGUF block type the GPU reads; under every tile setting the device check tries
   (default, SWAP_AB, the fused epilogues and their reversed twin, each per-shape candidate, each whole-pass variant)
   with the switches a CUDA device sets (bfloat16 MMA, Triton's own conversion); and records each launch: the
   kernel, its constexprs, its arguments' types and what the JIT specializes on (an integer 1, multiples of 16, a
   tensor's 16-byte alignment), its launch options. Matrices stay unwritten and the products, norms and attention
   are not run (only the launches matter), so a 72B shape costs seconds;
2. this process compiles each distinct specialization as the JIT would for the target (Triton's own binder and
   argument packing), and a PDL twin of every kernel that takes the switch, then checks the shared memory each
   needs and the registers ptxas reports (`ptxas -v`) against the architecture's limits, and PTX_RULES (the race's
   noise: IEEE f64 division, no fused multiply-add).
It fails (exit 1) on a kernel that does not compile or breaks a limit or a rule; spills are listed (they cost speed,
not exactness).

    python scripts/triton_compile_check.py [--arch 90] [--shapes 0.5b,...] [--quick | --production] [--out DIR]

Writes DIR/report.md (one row per kernel specialization), DIR/results.json and DIR/launches.json (what was recorded).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# Shared memory a block may use (bytes, with the opt-in carve-out) per compute capability; registers per thread
SHARED_LIMIT = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 120: 101376}


def shared_limit(arch: int) -> int:
    """The block's shared memory limit on sm_`arch` (an architecture not in the table: the smallest listed)."""
    return SHARED_LIMIT.get(arch, min(SHARED_LIMIT.values()))

REGISTERS_PER_BLOCK, REGISTERS_PER_THREAD = 65536, 255
# What a kernel's PTX must and must not hold (regular expressions), where its constexprs are as `when` says:
# - the race's noise is the host's bits only without fused multiply-adds (noise_kernel.py; its launches turn fusion
#   off) and with IEEE division in the log series;
# - a fused sum's or merge's arrival counter is counted with release and acquire at GPU scope (the last program to
#   arrive reads the others' stores): an atomic add of any other order would let it read stale partial sums, which
#   the interpreter, running one program at a time, can never show.
ACQ_REL_ADDS = ((r"atom\.global\.gpu\.acq_rel\.add",), (r"atom\.global(?!\.(gpu|sys)\.acq_rel\.)[.\w]*\.add",))
PTX_RULES = {"_race_kernel": [({}, (r"div\.rn\.f64",), (r"fma\.rn\.f64",))],
             "_draws_kernel": [({}, (r"div\.rn\.f64",), (r"fma\.rn\.f64",))],  # the device check's, fusion off
             "_pick_kernel": [({}, (), (r"fma\.rn\.f64",))],
             "linear_partial_kernel": [({"FUSE_SUM": "True"}, *ACQ_REL_ADDS)],
             "attention_partial_kernel": [({"FUSE_MERGE": "True"}, *ACQ_REL_ADDS)]}


def ptx_problems(name: str, constexprs: dict, ptx: str) -> list[str]:
    """What the kernel's PTX breaks of PTX_RULES (constexprs by name, as strings)."""
    problems = []
    for when, required, forbidden in PTX_RULES.get(name, []):
        if all(constexprs.get(key) == value for key, value in when.items()):
            problems += [f"no {rule} in its PTX" for rule in required if not re.search(rule, ptx)]
            problems += [f"{rule} in its PTX" for rule in forbidden if re.search(rule, ptx)]
    return problems


# ---------------------------------------------------------------------- 1. recording (under the interpreter)
def _is_constexpr(parameter: inspect.Parameter) -> bool:
    annotation = parameter.annotation
    return getattr(annotation, "__name__", str(annotation)).endswith("constexpr")


def _describe(value, constexpr: bool):
    """A JSON-able stand-in for an argument carrying what the JIT's specialization reads of it (runtime integers by
    their class: 1, a multiple of 16, other; 32 or 64 bits), or a constexpr's value."""
    import torch

    value = getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."), "aligned": value.data_ptr() % 16 == 0}
    if value is None or isinstance(value, (bool, str)):
        return {"value": value}
    if type(value).__name__ in ("InterpretedFunction", "JITFunction"):  # a jit function passed as a constexpr
        return {"jit": [value.fn.__module__, value.fn.__name__]}
    if type(value).__name__ == "dtype":  # a triton.language dtype passed as a constexpr
        return {"tl_dtype": str(value)}
    if isinstance(value, int):
        if constexpr or value == 1:
            return {"value": value}
        wide = not -(2**31) <= value < 2**31
        return {"value": (2**40 if wide else 0) + (16 if value % 16 == 0 else 17)}
    if isinstance(value, float):
        return {"value": value if constexpr else 0.5}
    raise TypeError(f"an argument of type {type(value).__name__}")


def _recorder(seen: dict, run_anyway: set):
    from triton.runtime import interpreter

    original = interpreter.InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        parameters = list(inspect.signature(self.fn).parameters.values())
        names = [p.name for p in parameters]
        bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
        constexpr = {p.name for p in parameters if _is_constexpr(p)}
        entry = {"module": self.fn.__module__, "name": self.fn.__name__,
                 "args": {name: _describe(value, name in constexpr) for name, value in bound.items()},
                 "options": {k: v for k, v in kwargs.items() if k not in names}}  # num_warps, enable_fp_fusion, ...
        seen.setdefault(json.dumps(entry, sort_keys=True), entry)
        if self.fn.__name__ in run_anyway:  # cheap kernels whose outputs steer the host (tokens, verdicts)
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        return None

    interpreter.InterpretedFunction.run = run


# Other families' real shapes (Hugging Face config fields): Gemma 3 (head size 256, q/k norms, sandwich norms, GeGLU,
# windows with their own rope base), Llama 3 (llama3 rope scaling) and SmolLM2 (three query heads a key head)
FAMILIES = {
    "gemma3-270m": dict(model_type="gemma3_text", hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                        sliding_window=512, rope_theta=1e6, rope_local_base_freq=1e4, query_pre_attn_scalar=256,
                        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, max_position_embeddings=32768),
    "gemma3-1b": dict(model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                      sliding_window=512, rope_theta=1e6, rope_local_base_freq=1e4, query_pre_attn_scalar=256,
                      hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, max_position_embeddings=32768),
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=5e5,
                      rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=8192),
                      max_position_embeddings=131072, tie_word_embeddings=False),
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, rope_theta=1e5,
                         max_position_embeddings=8192, tie_word_embeddings=True),
}


def _hf_config(shape: str) -> dict:
    from gpu_check import qwen2_config
    from qwen_shapes import SHAPES

    return FAMILIES[shape] if shape in FAMILIES else qwen2_config(SHAPES[shape]).to_dict()


def _empty_model(shape: str, blocks: dict | None):
    """A native model of `shape` (a Qwen2.5 size or a FAMILIES name) on the CPU, on the Triton path, its matrices
    bfloat16 or GGUF blocks of the layout `blocks`, left unwritten (torch.empty commits no memory: a 72B shape
    costs nothing)."""
    import torch

    from gpu_check import with_random_blocks
    from specdecode import gpu
    from specdecode.models.hf_loader import config_from_hf
    from specdecode.models.transformer import Transformer

    model = Transformer(config_from_hf(_hf_config(shape)), torch.bfloat16, max_positions=4096)  # torch.empty's
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            dtype = torch.float32 if name == "embed" else param.dtype
            value = torch.ones(param.shape, dtype=dtype) if param.dim() == 1 else torch.empty(param.shape, dtype=dtype)
            setattr(module, name, torch.nn.Parameter(value, requires_grad=False))
    if blocks is not None:
        with_random_blocks(model, blocks, fill=False)
    reason = gpu.attach(model)
    assert reason is None, reason
    return model


def _passes(model) -> None:
    """The passes the engine runs: a prompt chunk, a step, verify blocks, a batch, a token tree, a step from the
    device."""
    import torch

    from specdecode.models.transformer import Segment

    cache = model.new_cache(1024)
    vocab = model.config.vocab_size
    model(torch.randint(0, vocab, (100,)), cache, logits="none")
    for rows in (1, 5, 16):
        model(torch.randint(0, vocab, (rows,)), cache)
    others = [model.new_cache(1024) for _ in range(2)]
    model.forward_batch([Segment(list(range(7)), others[0], "none"), Segment(list(range(3)), others[1], "none")])
    model.forward_batch([Segment([1], cache, "last"), Segment([2, 3, 4], others[0], "all"),
                         Segment([5], others[1], "last")])
    model.forward_batch([Segment([1, 2, 3, 4], cache, "all", parents=[0, 0, 1])])
    model.steps_from_device([cache, others[0]], torch.zeros(2, dtype=torch.long))


def _as_on_a_gpu(runner):
    """The launches' switches as a CUDA device sets them (ExactPass.__init__ sets them for the interpreter): MMA in
    the weights' own type, Triton's own bfloat16 conversion (PDL: the compile step's twins)."""
    import torch

    runner.dot_f32 = runner.act_dtype == torch.float32
    runner.round_by_bits = False
    return runner


def _tile_settings():
    from gpu_check import PASS_VARIANTS, SHAPE_CANDIDATES
    from specdecode.gpu.exact_pass import ShapeTiles, Tiles

    base = Tiles()
    fused = dataclasses.replace(base, fused_sums=True, fused_act=True, fused_residual=True, fused_qkv=True)
    settings = {"default": base, "swap": base.swapped(), "fused": fused, "swap+fused": fused.swapped(),
                "two-phase sums": dataclasses.replace(base, serial_sum_limit=0)}
    settings["fused, reversed (a check's twin)"] = dataclasses.replace(fused, reversed=True)
    for candidate in SHAPE_CANDIDATES[1:]:
        settings[f"shape tiles {candidate}"] = ("shapes", ShapeTiles(*candidate))
    for block_n, block_k, max_split, warps, stages, attn_split, fused_parts in PASS_VARIANTS:  # part tile_sweep's
        settings[f"pass tiles {block_n}, {block_k}, {max_split}, {warps}, {stages}, {attn_split}, {fused_parts}"] = \
            Tiles(block_n=block_n, block_k=block_k, max_split=max_split, warps=warps, stages=stages,
                  attn_split=attn_split, fused_sums="sums" in fused_parts, fused_act="act" in fused_parts)
    return settings


def _sampling_and_verdicts(vocab: int) -> None:
    import torch

    from gpu_check import _draws_of
    from specdecode import accept
    from specdecode.gpu import noise_kernel

    for rows in (1, 5):
        probs = torch.full((rows, vocab), 1.0 / vocab)
        noise_kernel.choose_rows(probs, torch.arange(rows), torch.arange(rows) + 7)
    _draws_of([(0, 0), (1, 7)], vocab, "cpu", fusion=False)  # the device check's noise kernel (part sampling)
    for drafts in ([[3, 4], [5]], [list(range(15))]):  # blocks of 16 rows and more
        rows = sum(len(d) + 1 for d in drafts)
        firsts = [sum(len(d) + 1 for d in drafts[:i]) for i in range(len(drafts))]
        accept.greedy_verdicts(torch.zeros(rows, 8), firsts, drafts, method="triton")


def _layouts(shape: str) -> list:
    """The matrices the device check builds at a shape: bfloat16 (None) and the GGUF layouts of its files; bfloat16
    for the other families (their products are the same kernels: the block types are swept at the 1.5B shape)."""
    import gpu_check
    from qwen_shapes import SHAPES

    if shape in FAMILIES:
        return [("bf16", None)]
    bf16, q4, q3 = ("bf16", None), ("Q4_K_M", gpu_check.Q4_K_M), ("Q3_K_M", gpu_check.Q3_K_M)
    return {"0.5b": [bf16, ("Q5_0", gpu_check.Q5_0_FILE)], "1.5b": [bf16, q4], "7b": [bf16, q3, q4]}.get(
        shape, [("Q4_K_M", gpu_check.seed_layout(SHAPES[shape], False))])


def _every_block_type() -> list:
    """One layout per GGUF block type the GPU path reads, every matrix of that type (users' files: Q4_0, Q5_K_M,
    IQ4_XS, ...), for the 1.5B shape, whose widths are multiples of 256."""
    from specdecode.gpu import gguf_blocks as gb

    return [(name, {matrix: (name,) * parts for matrix, parts in
                    (("qkv", 3), ("out_proj", 1), ("gate_up", 2), ("down", 1), ("lm_head", 1))})
            for name in gb.NAMES.values()]


def record(shapes: list[str], quick: bool, production: bool, path: Path) -> None:
    from specdecode.gpu.exact_pass import ExactPass

    seen: dict = {}
    _recorder(seen, run_anyway={"greedy_verdict_kernel", "_pick_kernel"})
    settings = _tile_settings()
    runnable = {name: settings[name] for name in ("default", "swap", "fused", "swap+fused")}
    if quick:
        settings = {name: settings[name] for name in ("default", "swap+fused")}
    elif production:  # the tiles a model may run with, not the sweeps' candidates (for other architectures)
        settings = runnable
    runs = [(shape, layout, settings) for shape in shapes
            for layout in (_layouts(shape)[-1:] if quick else _layouts(shape))]
    if not quick:
        runs += [("1.5b", layout, runnable) for layout in _every_block_type()]
    for shape, (label, layout), chosen in runs:
        model = _empty_model(shape, layout)
        for name, tiles in chosen.items():
            if isinstance(tiles, tuple):  # one per-shape candidate for every product shape of the model
                layer = model.layers[0]
                keys = {tuple(w.shape) for w in (layer.qkv, layer.out_proj, layer.gate_up, layer.down)}
                tiles = dataclasses.replace(settings["default"], shapes=tuple((k, tiles[1]) for k in keys))
            model.exact_pass = _as_on_a_gpu(ExactPass(model, tiles))
            _passes(model)
            print(f"recorded {shape} {label} {name}: {len(seen)} launches", flush=True)
        del model
    _sampling_and_verdicts(_hf_config(shapes[0])["vocab_size"])
    path.write_text(json.dumps(list(seen.values()), indent=1))


# ---------------------------------------------------------------------- 2. compiling (no interpreter, no device)
def _materialize(description):
    import torch
    import triton.language as tl

    if "tensor" in description:
        buffer = torch.empty(64, dtype=getattr(torch, description["tensor"]))
        return buffer if description["aligned"] else buffer[1:]  # one element on: off 16-byte alignment
    if "jit" in description:
        module, name = description["jit"]
        return getattr(importlib.import_module(module), name)
    if "tl_dtype" in description:
        return getattr(tl, description["tl_dtype"])
    return description["value"]


def _ptxas_report(ptx: str, arch: int) -> tuple[int, int]:
    """(registers, spill bytes) ptxas reports for the kernel."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        suffix = "a" if arch >= 90 else ""
        done = subprocess.run([get_ptxas(arch).path, f"-arch=sm_{arch}{suffix}", "-v", str(source), "-o",
                               str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True)
    log = done.stdout + done.stderr
    registers = int(m.group(1)) if (m := re.search(r"Used (\d+) registers", log)) else -1
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    return registers, spills


def _specialized(entry: dict, arch: int, pdl: bool):
    """The kernel and what the JIT compiles for this launch on sm_`arch`: (kernel, signature, constexprs, attrs,
    options), by Triton's own binder and argument packing (launch options included)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = getattr(importlib.import_module(entry["module"]), entry["name"])
    kwargs = {name: _materialize(value) for name, value in entry["args"].items()} | dict(entry["options"])
    if pdl:
        kwargs |= {"PDL": True, "launch_pdl": True}
    kwargs |= {"debug": False}
    backend = make_backend(GPUTarget("cuda", arch, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, *binder(**kwargs))
    return kernel, signature, constexprs, attrs, options


def _key(entry: dict, arch: int, pdl: bool) -> str:
    kernel, signature, constexprs, attrs, options = _specialized(entry, arch, pdl)
    return json.dumps([entry["module"], entry["name"], signature, {str(k): str(v) for k, v in constexprs.items()},
                       {str(k): v for k, v in attrs.items()}, sorted((k, str(v)) for k, v in options.__dict__.items())])


def compile_entry(job) -> dict:
    """Compiles one launch as the JIT would for sm_`arch`; its resources, or the error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    entry, arch, pdl = job
    row = {"kernel": entry["name"], "pdl": pdl, "constexprs": {}}
    try:
        kernel, signature, constexprs, attrs, options = _specialized(entry, arch, pdl)
        row["constexprs"] = {kernel.arg_names[path[0]]: str(value) for path, value in constexprs.items()}
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                                  options=options.__dict__)
    except Exception as exc:  # noqa: BLE001  the finding itself: reported, and the others go on
        return row | {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc) else ''}"}
    registers, spills = _ptxas_report(compiled.asm["ptx"], arch)
    warps, limit = compiled.metadata.num_warps, shared_limit(arch)
    problems = ptx_problems(entry["name"], row["constexprs"], compiled.asm["ptx"])
    if compiled.metadata.shared > limit:
        problems.append(f"shared memory {compiled.metadata.shared} B > {limit}")
    if registers > REGISTERS_PER_THREAD or registers * 32 * warps > REGISTERS_PER_BLOCK:
        problems.append(f"{registers} registers x {32 * warps} threads")
    return row | {"shared": compiled.metadata.shared, "registers": registers, "spills": spills, "warps": warps,
                  "stages": compiled.metadata.num_stages, "problems": problems}


def _compile_all(launches: list[dict], arch: int, jobs: int) -> list[dict]:
    """Each distinct specialization once (launches that differ only where the JIT does not look are one), with a
    PDL twin of every kernel that takes the PDL switch on sm_90 and later (the interpreter never launches it so)."""
    work: dict[str, tuple] = {}
    for entry in launches:
        kernel = getattr(importlib.import_module(entry["module"]), entry["name"])
        for pdl in (False, True) if "PDL" in kernel.arg_names and arch >= 90 else (False,):  # (ExactPass: Hopper on)
            try:
                key = _key(entry, arch, pdl)
            except Exception as exc:  # noqa: BLE001  compiled (and reported) below
                key = repr((entry, pdl, exc))
            work.setdefault(key, (entry, arch, pdl))
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(compile_entry, work.values()))


def _report(rows: list[dict], arch: int, out: Path, command: str) -> int:
    failed = [r for r in rows if r.get("error") or r.get("problems")]
    lines = [f"# Triton kernels compiled for sm_{arch} (no device)", "", f"Command: `{command}`", "",
             f"{len(rows)} specializations, {len(failed)} failing. Shared memory limit {shared_limit(arch)} B "
             f"a block; registers at most {REGISTERS_PER_THREAD} a thread and {REGISTERS_PER_BLOCK} a block.", "",
             "| kernel | PDL | warps | stages | shared B | registers | spill B | constexprs | result |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (bool(r.get("error") or r.get("problems")) is False, r["kernel"])):
        consts = ", ".join(f"{k}={v}" for k, v in r["constexprs"].items())
        result = r.get("error") or "; ".join(r.get("problems", [])) or "ok"
        cells = [r["kernel"], "yes" if r["pdl"] else "", *(r.get(k, "") for k in ("warps", "stages", "shared",
                                                                              "registers", "spills")), consts, result]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    spilled = [r for r in rows if r.get("spills")]
    print(f"{len(rows)} specializations compiled for sm_{arch}: {len(failed)} failing, {len(spilled)} spilling "
          f"registers ({out / 'report.md'})")
    for r in failed:
        print(f"  FAILED {r['kernel']}{' (PDL)' if r['pdl'] else ''}: {r.get('error') or r.get('problems')}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability as one number (90: sm_90)")
    parser.add_argument("--shapes", default=",".join(["0.5b", "1.5b", "7b", "32b", "72b", *FAMILIES]))
    parser.add_argument("--quick", action="store_true", help="default and swap+fused tiles, one layout a shape")
    parser.add_argument("--production", action="store_true",
                        help="only the tiles a model may run with (default, SWAP_AB, fused, both), not the sweeps'")
    parser.add_argument("--out", default="triton-compile-out")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--record", help=argparse.SUPPRESS)  # the child's part: where to write the launches
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.record:
        record(args.shapes.split(","), args.quick, args.production, Path(args.record))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    launches = out / "launches.json"
    child = [sys.executable, __file__, "--record", str(launches), "--shapes", args.shapes]
    child += ["--quick"] * args.quick + ["--production"] * args.production
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")])))
    if subprocess.run(child, env=env).returncode:
        print("triton_compile_check: recording the launches failed", file=sys.stderr)
        return 1
    rows = _compile_all(json.loads(launches.read_text()), args.arch, args.jobs)
    return _report(rows, args.arch, out, " ".join(["python", "scripts/triton_compile_check.py"] + sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
