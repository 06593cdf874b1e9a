"""`specdecode models inspect`: what a model file or folder holds and how specdecode would run it, from its
metadata alone (the GGUF header and tensor table, or config.json, safetensors headers and tokenizer files): no
weight is read or dequantized, so it answers in a second for any size."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .. import kernels, registry
from ..errors import ModelError
from .config import ModelConfig


def inspect_model(name_or_path: str) -> list[str]:
    """The report's lines for a registry name (pulled if missing), a GGUF file or a Hugging Face folder."""
    path = registry.resolve(name_or_path)
    if path.is_dir():
        return [f"model: {path} (Hugging Face folder)", *_inspect_folder(path)]
    return [f"model: {path} (GGUF, {path.stat().st_size / 1e6:.0f} MB)", *_inspect_gguf(path)]


def _describe_config(config: ModelConfig) -> list[str]:
    c, rope = config, config.rope_scaling
    scaling = rope.kind if rope.kind != "default" else "none"
    if rope.kind != "default":
        scaling += f" (factor {rope.factor:g}, original context {rope.original_context})"
    if rope.freq_divisors is not None:
        scaling += f", {len(rope.freq_divisors)} per-frequency divisors (rope_freqs)"
    return [
        f"architecture: {c.arch} (native decoder)",
        f"sizes: {c.n_layers} layers, hidden {c.hidden_size}, intermediate {c.intermediate_size}, {c.n_heads} heads /"
        f" {c.n_kv_heads} kv heads, head_dim {c.head_dim}, vocab {c.vocab_size} rows"
        f"{', tied output' if c.tie_embeddings else ''}{', qkv bias' if c.qkv_bias else ''}{', q/k norm' if c.qk_norm else ''}",
        f"context: {c.context_length} positions",
        f"rope: theta {c.rope_theta:g}, scaling {scaling}",
    ]


def _kernel_verdict(type_names: list[str]) -> str:
    """How a matrix of these block types runs at --precision int8 / float32."""
    import gguf

    ids = {int(gguf.GGMLQuantizationType[name]) for name in type_names if name in gguf.GGMLQuantizationType.__members__}
    if len(ids) == len(set(type_names)) and ids <= kernels.QUANT_KERNEL_TYPES:
        return "int8 kernel (its own blocks)"
    return "not the int8 kernel: --precision int8 refuses it, q8_0 quantizes it to Q8_0 at load, float32 runs it exactly"


def _matrix_lines(types: dict[str, list[str]]) -> list[str]:
    """One line per kind of matrix (qkv, out_proj, gate_up, down, lm_head): its block types and where it runs."""
    by_kind: dict[str, Counter] = {}
    for key, names in types.items():
        by_kind.setdefault(key.rpartition(".")[2], Counter()).update(names)
    return [f"  {kind:9s} {', '.join(f'{n} {name}' for name, n in sorted(counts.items()))}: {_kernel_verdict(list(counts))}"
            for kind, counts in by_kind.items()]


def _inspect_gguf(path: Path) -> list[str]:
    from .gguf_loader import _field, matrix_types, open_gguf, read_config

    reader = open_gguf(path)
    lines = []
    try:
        config = read_config(reader)
    except ModelError as exc:  # still worth showing what the file holds
        config = None
        lines.append(f"architecture: {_field(reader, 'general.architecture')}: not runnable here ({exc})")
    if config is not None:
        lines += _describe_config(config)
    counts = Counter(t.tensor_type.name for t in reader.tensors)
    lines.append(f"tensors: {len(reader.tensors)} ({', '.join(f'{n} {name}' for name, n in counts.most_common())})")
    if config is not None:
        lines += ["matrices:", *_matrix_lines(matrix_types(config, reader))]
    return lines + _gguf_tokenizer(reader)


def _gguf_tokenizer(reader) -> list[str]:
    from .gguf_loader import _field

    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    if not tokens:
        return ["tokenizer: none in the file (load_model refuses it)"]
    special = []
    for role in ("bos", "eos", "eot", "pad", "unknown"):
        tid = _field(reader, f"tokenizer.ggml.{role}_token_id")
        if tid is not None and 0 <= int(tid) < len(tokens):
            special.append(f"{role} {int(tid)} {tokens[int(tid)]!r}")
    padding = sum(1 for tid, token in enumerate(tokens) if token == f"[PAD{tid}]")
    return [f"tokenizer: {_field(reader, 'tokenizer.ggml.model')} ({_field(reader, 'tokenizer.ggml.pre', 'default')}"
            f" pre-tokenizer), {len(tokens)} tokens{f' ({padding} of them padding)' if padding else ''}",
            f"special tokens: {', '.join(special) or 'none named'}",
            f"chat template: {'yes' if _field(reader, 'tokenizer.chat_template') else 'no'}"]


def _inspect_folder(path: Path) -> list[str]:
    from .hf_loader import config_from_hf, read_hf_config

    hf_config = read_hf_config(path)
    lines = []
    try:
        config = config_from_hf(hf_config)
        lines += _describe_config(config)
    except ModelError as exc:
        lines.append(f"architecture: {hf_config.get('model_type')}: not in the native decoder ({exc}); float32 or"
                     " bfloat16 through the transformers adapter, if transformers knows it")
    lines.append(f"tensors: {_safetensors_dtypes(path)}")
    lines.append("matrices: float weights: --precision int8 refuses them, q8_0 quantizes them to Q8_0 at load,"
                 " float32 runs them exactly")
    return lines + _folder_tokenizer(path)


def _safetensors_dtypes(path: Path) -> str:
    """Tensor count per dtype, from the safetensors headers (the JSON at the start of each file) only."""
    counts: Counter = Counter()
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        counts.update(spec["dtype"] for name, spec in header.items() if name != "__metadata__")
    return ", ".join(f"{n} {dtype}" for dtype, n in counts.most_common()) or "no .safetensors files"


def _folder_tokenizer(path: Path) -> list[str]:
    settings_file, spec_file = path / "tokenizer_config.json", path / "tokenizer.json"
    if not spec_file.is_file():
        return ["tokenizer: no tokenizer.json"]
    spec = json.loads(spec_file.read_text())
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    vocab = spec.get("model", {}).get("vocab") or {}
    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))  # BPE: a dict; Unigram: a list
    ids |= {token["id"] for token in spec.get("added_tokens", [])}
    special = [f"{token['id']} {token['content']!r}" for token in spec.get("added_tokens", []) if token.get("special")]
    more = f" (+{len(special) - 12} more)" if len(special) > 12 else ""
    template = settings.get("chat_template") or (path / "chat_template.jinja").is_file()
    return [f"tokenizer: {spec.get('model', {}).get('type')}, {len(ids)} tokens",
            f"special tokens: {', '.join(special[:12]) or 'none'}{more}",
            f"chat template: {'yes' if template else 'no'}"]
