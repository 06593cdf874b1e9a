"""GGUF files of random weights in the real shapes of Qwen2.5 models, laid out as llama-quantize lays out a Q4_K_M
file (or as the 0.5B coder's file is), with Qwen2's real tokenizer: the same file for llama.cpp's tools and for
specdecode, to measure speed where no real weights of that size can be had (scripts/gpu_peer.sh; issue 64).

Blocks are random bytes with small finite scales, so every weight is a valid number of its type. One layer's
blocks are written for every layer (the bytes a step reads are the same as with distinct layers; an engine cannot
tell, and the file writes in seconds). The tokenizer comes from llama.cpp's vocabulary-only file of Qwen2
(models/ggml-vocab-qwen2.gguf in its sources), padded as Qwen's converter pads it where the shape's vocabulary is
larger.

    python3 scripts/gguf_random.py --shape 1.5b --layout q4_k_m --vocab VOCAB.gguf --out model.gguf
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from qwen_shapes import SHAPES  # noqa: E402

import gguf  # noqa: E402  (on a device: the wheel carried in peer-cuda/, scripts/device_python.sh)

Q = gguf.GGMLQuantizationType
# Where a matrix's K is no multiple of 256, llama-quantize takes a 32-weight type instead of a k-quant
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}
# Byte offsets of each type's float16 scales in its block (every other byte of a block is a valid quant or scale)
HALVES = {Q.Q4_K: (0, 2), Q.Q6_K: (208,), Q.Q5_0: (0,), Q.Q8_0: (0,)}
# A small scale per type, so that activations stay finite through many layers
SCALE = {Q.Q4_K: 1e-3, Q.Q6_K: 1.8e-4, Q.Q5_0: 3e-3, Q.Q8_0: 4e-4}


def more_bits(layer: int, layers: int) -> bool:
    """llama-quantize's Q4_K_M rule for attn_v and ffn_down: Q6_K in the first and last eighth and every third layer
    between, Q4_K elsewhere."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def layer_types(layout: str, layer: int, layers: int) -> dict[str, Q]:
    if layout == "q4_k_m":
        wide = Q.Q6_K if more_bits(layer, layers) else Q.Q4_K
        return dict(attn_q=Q.Q4_K, attn_k=Q.Q4_K, attn_v=wide, attn_output=Q.Q4_K, ffn_gate=Q.Q4_K, ffn_up=Q.Q4_K,
                    ffn_down=wide)
    if layout == "q5_0":  # the 0.5B coder's file: Q5_0, its V and down matrices alternating with wider types
        odd = layer % 2 == 1
        return dict(attn_q=Q.Q5_0, attn_k=Q.Q5_0, attn_v=Q.Q8_0 if odd else Q.Q5_0, attn_output=Q.Q5_0,
                    ffn_gate=Q.Q5_0, ffn_up=Q.Q5_0, ffn_down=Q.Q6_K if odd else Q.Q4_K)
    raise SystemExit(f"unknown layout {layout!r} (q4_k_m, q5_0)")


def outer_types(layout: str) -> dict[str, Q]:
    return dict(token_embd=Q.Q4_K, output=Q.Q6_K) if layout == "q4_k_m" else dict(token_embd=Q.Q5_0, output=Q.Q8_0)


def random_blocks(kind: Q, rows: int, cols: int, rng: np.random.Generator) -> tuple[np.ndarray, Q]:
    """[rows, bytes of a row] of valid random blocks of `kind` (or of its fallback where cols does not fit it)."""
    per, size = gguf.GGML_QUANT_SIZES[kind]
    if cols % per:
        kind = FALLBACK[kind]
        per, size = gguf.GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, size=(rows, cols // per, size), dtype=np.uint8)
    half = np.frombuffer(np.float16(SCALE[kind]).tobytes(), dtype=np.uint8)
    for at in HALVES[kind]:
        blocks[:, :, at : at + 2] = half
    return blocks.reshape(rows, -1), kind


def tokenizer_fields(vocab_file: Path, vocab_size: int) -> dict:
    """Qwen2's tokenizer from llama.cpp's vocabulary-only file, its token list padded to vocab_size."""
    reader = gguf.GGUFReader(vocab_file)

    def value(key):
        field = reader.fields[key]
        return field.contents() if hasattr(field, "contents") else field.parts[field.data[0]].tolist()

    tokens = list(value("tokenizer.ggml.tokens"))
    types = list(value("tokenizer.ggml.token_type"))
    for index in range(len(tokens), vocab_size):  # as convert_hf_to_gguf pads Qwen's larger embeddings
        tokens.append(f"[PAD{index}]")
        types.append(int(gguf.TokenType.UNUSED))
    return dict(tokens=tokens, types=types, merges=list(value("tokenizer.ggml.merges")),
                eos=int(value("tokenizer.ggml.eos_token_id")), bos=int(value("tokenizer.ggml.bos_token_id")),
                pad=int(value("tokenizer.ggml.padding_token_id")))


def write(path: Path, shape: dict, layout: str, vocab_file: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    hidden, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv_heads, vocab = shape["num_attention_heads"], shape["num_key_value_heads"], shape["vocab_size"]
    head = hidden // heads
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_name(f"random Qwen2.5 shape {hidden}x{layers} ({layout})")
    writer.add_block_count(layers)
    writer.add_context_length(32768)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if layout == "q4_k_m" else gguf.LlamaFileType.MOSTLY_Q5_0)
    tok = tokenizer_fields(vocab_file, vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["types"])
    writer.add_token_merges(tok["merges"])
    writer.add_eos_token_id(tok["eos"])
    writer.add_bos_token_id(tok["bos"])
    writer.add_pad_token_id(tok["pad"])

    def matrix(name: str, kind: Q, rows: int, cols: int, cache: dict) -> None:
        if (kind, rows, cols) not in cache:  # one layer's bytes for every layer
            cache[kind, rows, cols] = random_blocks(kind, rows, cols, rng)
        data, written = cache[kind, rows, cols]
        writer.add_tensor(name, data, raw_dtype=written)

    def vector(name: str, values: np.ndarray) -> None:
        writer.add_tensor(name, values.astype(np.float32))

    cache: dict = {}
    outer = outer_types(layout)
    matrix("token_embd.weight", outer["token_embd"], vocab, hidden, cache)
    vector("output_norm.weight", np.ones(hidden))
    matrix("output.weight", outer["output"], vocab, hidden, cache)
    rows = dict(attn_q=heads * head, attn_k=kv_heads * head, attn_v=kv_heads * head, attn_output=hidden,
                ffn_gate=inter, ffn_up=inter, ffn_down=hidden)
    cols = dict(attn_q=hidden, attn_k=hidden, attn_v=hidden, attn_output=heads * head, ffn_gate=hidden,
                ffn_up=hidden, ffn_down=inter)
    biases = {name: 0.2 * rng.standard_normal(rows[name]) for name in ("attn_q", "attn_k", "attn_v")}
    for layer in range(layers):
        p = f"blk.{layer}."
        vector(p + "attn_norm.weight", np.ones(hidden))
        vector(p + "ffn_norm.weight", np.ones(hidden))
        for name, bias in biases.items():
            vector(p + name + ".bias", bias)
        for name, kind in layer_types(layout, layer, layers).items():
            matrix(p + name + ".weight", kind, rows[name], cols[name], cache)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--layout", default="q4_k_m", choices=["q4_k_m", "q5_0"])
    parser.add_argument("--vocab", required=True, type=Path, help="llama.cpp's models/ggml-vocab-qwen2.gguf")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    write(args.out, SHAPES[args.shape], args.layout, args.vocab)
    print(f"{args.out}: {args.out.stat().st_size / 1e9:.2f} GB", flush=True)


if __name__ == "__main__":
    main()
