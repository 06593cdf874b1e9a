"""Helpers shared by the tests: tiny random-weight models, a fake tokenizer, references, statistics.

Tiny models are built directly (`Transformer(ModelConfig(...))`, every parameter filled from a
seeded generator) so exact properties can be checked in milliseconds. The fake tokenizer wraps a
minimal stand-in for a Hugging Face tokenizer in the real `Tokenizer` class, so the engine runs its
normal code path (eos ids, fingerprint, streaming decode) without any files.

(A uniquely named module rather than conftest.py, so `import` never picks up another conftest.)
"""
from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from specdecode.models.config import ModelConfig
from specdecode.models.loader import LoadedModel
from specdecode.models.transformer import Transformer
from specdecode.tokenizer import Tokenizer

SMOLLM2 = "smollm2-135m"
QWEN_05B = "qwen2.5-coder-0.5b"


# --------------------------------------------------------------------------- tiny models
def tiny_config(
    arch: str = "llama",
    vocab_size: int = 256,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    head_dim: int = 16,
    context_length: int = 256,
    tie_embeddings: bool = False,
    qkv_bias: bool | None = None,
    rope_theta: float = 10000.0,
    **extra,  # the other ModelConfig fields (sliding windows, Gemma's attention scale, ...)
) -> ModelConfig:
    return ModelConfig(
        arch=arch,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        rope_theta=rope_theta,
        rms_norm_eps=1e-6,
        context_length=context_length,
        tie_embeddings=tie_embeddings,
        qkv_bias=(arch == "qwen2") if qkv_bias is None else qkv_bias,
        **extra,
    )


def fill_random(model: Transformer, seed: int, scale: float = 0.3) -> Transformer:
    """Fill every parameter (created as zeros/ones) with seeded random values."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            value = 1.0 + 0.1 * torch.randn(param.shape, generator=gen)
        elif "bias" in name:
            value = 0.5 * torch.randn(param.shape, generator=gen)
        else:
            value = scale * torch.randn(param.shape, generator=gen)
        param.data = value.to(param.dtype)
    return model


def make_tiny_model(seed: int = 0, scale: float = 0.3, max_positions: int | None = None, **config) -> Transformer:
    cfg = tiny_config(**config)
    return fill_random(Transformer(cfg, max_positions=max_positions), seed, scale)


def perturbed_copy(model: Transformer, noise: float, seed: int, max_positions: int | None = None) -> Transformer:
    """Same architecture and weights plus small noise: a strong draft for `model`."""
    copy = Transformer(model.config, max_positions=max_positions or model.max_positions)
    gen = torch.Generator().manual_seed(seed)
    source = dict(model.named_parameters())
    for name, param in copy.named_parameters():
        base = source[name].data.float()
        param.data = (base + noise * base.abs().mean() * torch.randn(base.shape, generator=gen)).to(param.dtype)
    return copy


# The block types of a Q4_K_M file (as the default target's): Q4_K for most matrices, Q6_K for V, down and head.
KQUANT_LAYOUT = {"qkv": ("Q4_K", "Q4_K", "Q6_K"), "out_proj": ("Q4_K",), "gate_up": ("Q4_K", "Q4_K"),
                 "down": ("Q6_K",), "lm_head": ("Q6_K",)}
# The 256-weight block types the int8 kernel reads besides those (Q5_K_M, Q3_K_M, Q2_K and IQ4_XS files), mixed.
NEWER_KQUANT_LAYOUT = {"qkv": ("Q5_K", "Q3_K", "Q2_K"), "out_proj": ("IQ4_XS",), "gate_up": ("Q5_K", "Q2_K"),
                       "down": ("Q3_K",), "lm_head": ("IQ4_XS",)}


def random_kquant_blocks(name: str, rows: int, cols: int, gen: np.random.Generator) -> np.ndarray:
    """[rows, bytes] of random blocks of a 256-weight type whose weights have mean ~0 and std ~0.25.

    gguf-py cannot quantize to k-quants, so the blocks are random bytes with the float16 super-block
    scales set: Q4_K's min scale is 7.5x its scale, which centres d*sc*q - dmin*m on zero (Q5_K 15.5x,
    Q2_K 1.5x); Q3_K and IQ4_XS weights are centred already."""
    import gguf

    _, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    blocks = gen.integers(0, 256, size=(rows * cols // 256, block_bytes), dtype=np.uint8)
    d = gen.uniform(0.8, 1.2, size=len(blocks))
    fields = {"Q4_K": [(0, 1e-3 * d), (2, 7.5e-3 * d)], "Q6_K": [(208, 1.8e-4 * d)], "Q5_K": [(0, 5e-4 * d), (2, 7.75e-3 * d)],
              "Q3_K": [(108, 6e-3 * d)], "Q2_K": [(80, 2.5e-2 * d), (82, 3.75e-2 * d)], "IQ4_XS": [(0, 2e-4 * d)]}[name]
    for offset, value in fields:
        blocks[:, offset : offset + 2] = value.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def random_gguf_blocks(kind: int, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """[rows, bytes] of random blocks of a type the GPU kernel reads, whose float16 scales are small and finite."""
    from specdecode.gpu import gguf_blocks

    rng = np.random.default_rng(seed)
    per_block, size = gguf_blocks.BLOCKS[kind]
    raw = rng.integers(0, 256, size=(rows, cols // per_block, size), dtype=np.uint8)
    for at in gguf_blocks.HALVES[kind]:
        scale = rng.uniform(1e-4, 2e-2, size=raw.shape[:2]).astype(np.float16)
        raw[..., at : at + 2] = scale[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def kquant_model(seed: int, arch: str = "qwen2", layout: dict = KQUANT_LAYOUT, width: int = 256) -> tuple[Transformer, dict]:
    """A tiny model whose matrices are random Q4_K/Q6_K blocks: (float32 model with the dequantized weights,
    {matrix key: [(ggml type, blocks)]} for `loader._to_quant_weights`). Dimensions are multiples of 256,
    the k-quant block length; `width` (hidden and intermediate size) 512 gives every matrix but the attention
    output two blocks per row, so the kernels' steps from block to block are exercised too."""
    import gguf

    model = make_tiny_model(seed=seed, arch=arch, hidden_size=width, intermediate_size=width, n_heads=4,
                            n_kv_heads=2, head_dim=64)
    c, gen = model.config, np.random.default_rng(seed)
    rows = {"qkv": (c.q_size, c.kv_size, c.kv_size), "out_proj": (c.hidden_size,),
            "gate_up": (c.intermediate_size, c.intermediate_size), "down": (c.hidden_size,), "lm_head": (c.vocab_size,)}
    blocks = {}
    for key, param in model.named_parameters():
        name = key.rpartition(".")[2]
        if name not in layout:
            continue
        parts = [(t, random_kquant_blocks(t, n, param.shape[1], gen)) for t, n in zip(layout[name], rows[name])]
        dense = [gguf.quants.dequantize(b, gguf.GGMLQuantizationType[t]) for t, b in parts]
        param.data = torch.from_numpy(np.concatenate(dense)).float()
        blocks[key] = [(int(gguf.GGMLQuantizationType[t]), torch.from_numpy(b)) for t, b in parts]
    return model, blocks


# --------------------------------------------------------------------------- fake tokenizer
class FakeHF:
    """The part of a Hugging Face tokenizer that `specdecode.tokenizer.Tokenizer` uses.

    Token i is the text `<prefix i>`; encode() parses such text back, so string prompts work too.
    """

    def __init__(self, vocab_size: int, prefix: str = "t", chat_template: str | None = None):
        self.vocab_size = vocab_size
        self.prefix = prefix
        self.chat_template = chat_template
        self.eos_token_id = None
        self.unk_token_id = None

    def __len__(self) -> int:
        return self.vocab_size

    def piece(self, tid: int) -> str:
        return f"<{self.prefix}{tid}>"

    def get_vocab(self) -> dict[str, int]:
        return {self.piece(i): i for i in range(self.vocab_size)}

    def convert_tokens_to_ids(self, name):
        return None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        body = text.replace(">", " ").replace(f"<{self.prefix}", " ").split()
        return [int(x) for x in body]

    def decode(self, ids, skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool = False) -> str:
        return "".join(self.piece(int(i)) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "".join(m["content"] for m in messages)


def fake_tokenizer(vocab_size: int, eos_ids=(), prefix: str = "t") -> Tokenizer:
    return Tokenizer(hf=FakeHF(vocab_size, prefix), eos_ids=frozenset(eos_ids))


def as_loaded(model: Transformer, tokenizer: Tokenizer | None = None, name: str = "tiny") -> LoadedModel:
    tokenizer = tokenizer or fake_tokenizer(model.config.vocab_size)
    return LoadedModel(name, Path(name), model, tokenizer, backend="native", dtype="float32", load_seconds=0.0)


# --------------------------------------------------------------------------- references
def reference_greedy(model, prompt: list[int], max_new_tokens: int, eos_ids=(), max_context: int | None = None) -> list[int]:
    """Plain greedy decoding, one token per forward pass, written independently of the engine.

    Mirrors the engine's limits: stops after an EOS (not emitted), after max_new_tokens, or when
    the cache is full (the token predicted from the last cached position is still emitted).
    """
    cache = model.new_cache(max_context)
    logits = model(torch.tensor(prompt), cache, logits="last")[0]
    out: list[int] = []
    while True:
        token = int(logits.argmax())
        if token in eos_ids:
            return out
        out.append(token)
        if len(out) >= max_new_tokens or cache.length >= cache.max_len:
            return out
        logits = model(torch.tensor([token]), cache, logits="last")[0]


def top2_gap_at(model, context: list[int]) -> float:
    """Target's top-1 minus top-2 logit after `context` (token-by-token pass): how close a tie was."""
    cache = model.new_cache(len(context) + 1)
    logits = None
    for token in context:
        logits = model(torch.tensor([token]), cache, logits="last")[0]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def divergence_report(model, prompt: list[int], expected: list[int], got: list[int]) -> str:
    """Where two greedy outputs first differ, and the target's top-2 gap there (to help find the cause).
    Every divergence is a failure: the promise is bit-exactness, however small the gap."""
    index = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    if index >= min(len(expected), len(got)):
        return f"outputs differ in length only ({len(expected)} vs {len(got)} tokens)"
    gap = top2_gap_at(model, list(prompt) + list(expected[:index]))
    return (
        f"first difference at generated token {index}: expected {expected[index]}, got {got[index]};"
        f" the target's top-2 logit gap there is {gap:.3g} (a small gap points at a row computed differently"
        " in a block than alone; a large one at the verifier or the cache)"
    )


# --------------------------------------------------------------------------- statistics
def chi_square_pvalue(observed: dict, expected_probs: dict, n: int, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Pearson chi-square goodness of fit; cells with expected count < min_expected are pooled.

    Returns (statistic, p-value, degrees of freedom). Observations outside the support of
    expected_probs go into the pooled cell, so they count against the fit.
    """
    big = {cell for cell, prob in expected_probs.items() if prob * n >= min_expected}
    stat = 0.0
    cells = 0
    for cell in big:
        e = expected_probs[cell] * n
        stat += (observed.get(cell, 0) - e) ** 2 / e
        cells += 1
    pooled_expected = n - sum(expected_probs[c] * n for c in big)
    pooled_observed = n - sum(observed.get(c, 0) for c in big)
    if pooled_expected >= 1e-9:
        stat += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        cells += 1
    elif pooled_observed > 0:
        return math.inf, 0.0, cells - 1
    df = cells - 1
    pvalue = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, pvalue, df


# Tiny model shapes that cover the architecture options (GQA, QKV bias, tied embeddings, one KV head).
TINY_CONFIGS = {
    "llama-gqa": dict(arch="llama"),
    "qwen2-gqa-bias": dict(arch="qwen2"),
    "llama-mha-tied": dict(arch="llama", n_kv_heads=4, tie_embeddings=True),
    "qwen2-tied": dict(arch="qwen2", tie_embeddings=True, n_kv_heads=1),
    # per-head q/k RMSNorm, no bias, heads wider than hidden / n_heads (q_size 128 != hidden 64)
    "qwen3-qknorm": dict(arch="qwen3", head_dim=32),
    # GeGLU, four norms a layer, scaled embeddings, a softcap, q.k scaled by 1/sqrt(24) (untied: a tied head on
    # scaled random embeddings predicts the input token again and again); layers 0 and 2 see the
    # last 6 positions and rotate with base 1e4, layer 1 sees all and rotates with 1e6
    "gemma3-windowed": dict(arch="gemma3", head_dim=32, n_layers=3, rope_theta=1e6,
                            sliding_window=6, sliding_layers=(0, 2), rope_local_theta=1e4, query_pre_attn_scalar=24.0,
                            final_logit_softcap=30.0),
    # every layer sees the last 5 positions
    "mistral-window": dict(arch="mistral", sliding_window=5, sliding_layers=(0, 1)),
    # Phi-3's shape: fused Q|K|V and gate|up read as they are, one KV head per head (MHA), untied head
    "phi3-mha": dict(arch="phi3", n_kv_heads=4),
}
# The tiny configuration of each architecture, where the tests run one per architecture.
ARCH_CONFIGS = {"gemma3": TINY_CONFIGS["gemma3-windowed"], "mistral": TINY_CONFIGS["mistral-window"]}


def arch_config(arch: str) -> dict:
    return ARCH_CONFIGS.get(arch, {"arch": arch})


def tokens_for(model, length, seed=1):
    return torch.randint(0, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(seed))


def token_by_token(model, tokens, cache=None):
    cache = cache or model.new_cache()
    return torch.cat([model(tokens[i : i + 1], cache) for i in range(len(tokens))]), cache


# --------------------------------------------------------------------------- llama.cpp's converter
def llamacpp_converter() -> Path | None:
    """convert_hf_to_gguf.py of a llama.cpp source tree: $LLAMACPP_CONVERT, else the one scripts/build_llamacpp.sh
    unpacks next to its binaries; None where neither exists."""
    import glob
    import os

    from specdecode.registry import cache_dir

    if os.environ.get("LLAMACPP_CONVERT"):
        return Path(os.environ["LLAMACPP_CONVERT"])
    found = sorted(glob.glob(str(cache_dir() / "llama.cpp" / "src-*" / "llama_cpp_python-*" / "vendor" / "llama.cpp"
                                 / "convert_hf_to_gguf.py")))
    return Path(found[-1]) if found else None


def require_llamacpp_converter() -> Path:
    """llamacpp_converter(), or the test skips saying how to get it."""
    import pytest

    converter = llamacpp_converter()
    if converter is None or not converter.is_file():
        pytest.skip("llama.cpp's convert_hf_to_gguf.py not found (set LLAMACPP_CONVERT, or run scripts/build_llamacpp.sh)")
    return converter


# A Python that has imported the converter (torch, transformers and llama.cpp's own gguf package: ~3.5 s of CPU)
# and forks a child for each conversion, which runs the script's main() as `python convert_hf_to_gguf.py ARGS`
# would. The tests convert a dozen tiny models; each started a fresh Python before.
_CONVERTER_ZYGOTE = r"""
import json, os, sys, traceback
script = sys.argv[1]
sys.path[:0] = [os.path.dirname(script), os.path.join(os.path.dirname(script), "gguf-py")]
import convert_hf_to_gguf
for line in sys.stdin:
    args, log = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv = [script, *args]
        try:
            convert_hf_to_gguf.main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""
_zygotes: dict = {}


def run_llamacpp_converter(folder: Path, out: Path, outtype: str = "f32", timeout: float = 300) -> None:
    """llama.cpp's convert_hf_to_gguf.py on a Hugging Face folder, writing `out`; skips the test where the converter
    is absent, fails it (with the converter's output) where the conversion fails or runs past `timeout` seconds."""
    import os
    import select
    import signal
    import subprocess
    import sys

    import pytest

    converter = require_llamacpp_converter()
    zygote = _zygotes.get(converter)
    if zygote is None or zygote.poll() is not None:  # its own session: a hung conversion is killed with it
        zygote = _zygotes[converter] = subprocess.Popen([sys.executable, "-c", _CONVERTER_ZYGOTE, str(converter)],
                                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                                        start_new_session=True)
    log = Path(out).with_suffix(".convert.log")
    zygote.stdin.write(json.dumps([[str(folder), "--outtype", outtype, "--outfile", str(out)], str(log)]) + "\n")
    zygote.stdin.flush()
    code = zygote.stdout.readline().strip() if select.select([zygote.stdout], [], [], timeout)[0] else None
    output = log.read_text(errors="replace") if log.is_file() else ""
    if code is None:
        os.killpg(zygote.pid, signal.SIGKILL)
        zygote.wait()
        pytest.fail(f"llama.cpp's converter ran past {timeout} s\n{output[-2000:]}")
    assert code == "0", f"llama.cpp's converter: exit {code or 'of its zygote'}\n{output[-2000:]}"


def random_pass(seed: int, requests: int = 6, vocab: int = 5):
    """A batched pass's greedy blocks for accept.py's checks (tests/test_accept.py, scripts/gpu_check.py), as
    (logits [rows, vocab], firsts, drafts): blocks at random places among unjudged rows; each draft copies the
    block's argmaxes for a random length, then (sometimes) one wrong token and more. A small vocabulary makes ties
    and chance agreements common."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [int(torch.randint(0, 7, (1,), generator=gen)) for _ in range(requests)]  # draft lengths, 0 allowed
    gaps = [int(torch.randint(0, 3, (1,), generator=gen)) for _ in range(requests)]
    rows = sum(shapes) + requests + sum(gaps)
    logits = torch.randint(0, 3, (rows, vocab), generator=gen).float()  # integers: ties
    choice = logits.argmax(dim=-1).tolist()
    firsts, drafts, at = [], [], 0
    for length, gap in zip(shapes, gaps):
        at += gap
        kept = int(torch.randint(0, length + 1, (1,), generator=gen))
        draft = choice[at : at + kept]
        if kept < length:
            draft.append((choice[at + kept] + 1) % vocab)  # rejected here
            draft += torch.randint(0, vocab, (length - kept - 1,), generator=gen).tolist()
        firsts.append(at)
        drafts.append(draft)
        at += length + 1
    return logits, firsts, drafts


def convergents(x: Fraction):
    """The continued fraction's convergents h / k of x: its best rational approximations."""
    h0, h1, k0, k1 = 0, 1, 1, 0
    while True:
        whole = x.numerator // x.denominator
        h0, h1, k0, k1 = h1, whole * h1 + h0, k1, whole * k1 + k0
        yield h1, k1
        if x == whole:
            return
        x = 1 / (x - whole)


def near_tie(draws: np.ndarray, other_draws: np.ndarray):
    """Two token ids and float32 probabilities for them on which a race with `draws` and one with `other_draws`
    pick different tokens, or None. p_a / p_b is a convergent of E_a / E_b (numerator and denominator below 2**24,
    so exact in float32): the two races p / E then meet within about an ulp, where one ulp of E decides."""
    for a in np.flatnonzero(draws != other_draws):
        for b in np.flatnonzero(np.arange(draws.size) != a):
            for h, k in convergents(Fraction(float(draws[a])) / Fraction(float(draws[b]))):
                if max(h, k) >= 2**24:
                    break
                scale = 2.0 ** -max(h, k).bit_length()
                ids = np.array([a, b])
                p = np.array([h * scale, k * scale], dtype=np.float32)
                order = np.argsort(ids)  # the race's tie rule sees ids in ascending order
                pick = [int(ids[order][np.argmax(p[order] / d[ids[order]])]) for d in (draws, other_draws)]
                if pick[0] != pick[1]:
                    return ids, p
    return None


# --------------------------------------------------------------------------- Triton's interpreter
def fast_triton_interpreter() -> None:
    """Triton's interpreter (TRITON_INTERPRET=1) without what costs it time and changes nothing a kernel computes:
    its integer-overflow checks (a debugging aid that costs it most of its time) off, and triton.language patched
    once (below). For tests/gpu and scripts/gpu_check.py --tiny."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    if hasattr(interpreter, "_patch_lang") and hasattr(interpreter, "_LangPatchScope"):
        _patch_language_once(interpreter)


def _patch_language_once(interpreter) -> None:
    """Triton's interpreter patches triton.language's builtins (~200 of them, each wrapped to call the interpreter's
    semantics over its one builder, `interpreter_builder`) at every launch and restores them after it, and patches
    them again at every call of a jit helper inside a kernel: together about half of a test's time. The patches are
    the same every time, and restoring them matters only to a process that also compiles kernels, which a process
    that interprets them (TRITON_INTERPRET=1, where this runs) never does: here they are made once per language
    module the kernels see (triton.language, triton.language.core) and kept. Each kernel still runs exactly as the
    interpreter runs it."""
    if getattr(interpreter._patch_lang, "once", False):
        return
    import triton.language as tl
    from triton.language import core

    patch_lang, patched = interpreter._patch_lang, set()

    def patch_lang_once(fn):
        langs = {id(value) for value in fn.__globals__.values() if value is tl or value is core}
        if not langs <= patched:
            patch_lang(fn)  # its scope is dropped: nothing restores these patches
            patched.update(langs)
        return interpreter._LangPatchScope()  # nothing to restore

    patch_lang_once.once = True
    interpreter._patch_lang = patch_lang_once
