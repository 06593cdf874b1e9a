"""Build a native Transformer from a GGUF file (weights dequantized with the `gguf` package)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .. import kernels
from ..errors import ModelError
from .config import Architecture, ModelConfig, architecture
from .rope import rope_from_gguf
from .transformer import Transformer


def _field(reader, key: str, default=None):
    return reader.get(key, default)


def open_gguf(path: Path):
    from .gguf_header import GGUFHeader

    try:
        return GGUFHeader(path)
    except Exception as exc:  # truncated or not a GGUF file at all
        raise ModelError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None


def gguf_windows(field, arch: Architecture, n_layers: int) -> tuple[int, tuple[int, ...]]:
    """(window size, windowed layers) of a GGUF file, read as llama.cpp reads them: only for architectures it runs
    with windows; the layers from sliding_window_pattern (one flag per layer, or every n-th layer global), else
    the architecture's pattern (llama.cpp's own for files written without the key)."""
    window = int(field(f"{arch.name}.attention.sliding_window", 0) or 0) if arch.sliding_windows else 0
    if not window:
        return 0, ()
    pattern = field(f"{arch.name}.attention.sliding_window_pattern", None)
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_layers:
            raise ModelError(f"the GGUF file's sliding_window_pattern has {len(pattern)} flags for {n_layers} layers")
        return window, tuple(i for i, windowed in enumerate(pattern) if windowed)
    every = int(pattern or arch.swa_pattern)
    return window, tuple(i for i in range(n_layers) if not every or (i + 1) % every)


def _gemma_extras(field, arch: Architecture, hidden: int, n_heads: int, n_layers: int) -> dict:
    """The attention scale, local rope base and logit softcap of a GGUF file, with llama.cpp's defaults."""
    name = arch.name
    if field(f"{name}.attn_logit_softcapping", None):
        raise ModelError(f"'{name}' with attention logit softcapping is not supported by the native decoder")
    extras = dict(final_logit_softcap=float(field(f"{name}.final_logit_softcapping", 0.0) or 0.0))
    if arch.default_local_rope_base:
        extras["rope_local_theta"] = float(field(f"{name}.rope.freq_base_swa", None) or arch.default_local_rope_base)
    if name == "gemma3" and n_layers == 62:
        # llama.cpp scales Gemma 3 27B's scores by hidden/heads (its query_pre_attn_scalar), not by the head size;
        # the file does not say so, llama.cpp knows the model by its 62 layers.
        extras["query_pre_attn_scalar"] = float(hidden // n_heads)
    return extras


def read_config(reader) -> ModelConfig:
    arch_facts = architecture(_field(reader, "general.architecture"))
    arch = arch_facts.name
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ModelError("the GGUF file has no token_embd.weight tensor")
    embed = tensors["token_embd.weight"]
    # llama 3's per-frequency divisors of the rotary frequencies
    divisors = tensors.get("rope_freqs.weight")
    divisors = None if divisors is None else [float(d) for d in np.asarray(divisors.data, dtype=np.float32).reshape(-1)]
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    n_heads = int(_field(reader, f"{arch}.attention.head_count"))
    n_layers = int(_field(reader, f"{arch}.block_count"))
    field = lambda key, default: _field(reader, key, default)  # noqa: E731
    window, windowed = gguf_windows(field, arch_facts, n_layers)
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // n_heads))
    _check_rope_facts(reader, tensors, arch, head_dim)
    context = int(_field(reader, f"{arch}.context_length", 2048))
    capping_window = _field(reader, f"{arch}.attention.sliding_window")
    if capping_window and arch_facts.window_caps_context:
        context = min(context, int(capping_window))
    return ModelConfig(
        arch=arch,
        vocab_size=int(embed.shape[1]),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        context_length=context,
        tie_embeddings="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors or "blk.0.attn_qkv.bias" in tensors,
        rope_scaling=rope_from_gguf(field, arch, divisors),
        sliding_window=window,
        sliding_layers=windowed,
        **_gemma_extras(field, arch_facts, hidden, n_heads, n_layers),
    )


def _check_rope_facts(reader, tensors: dict, arch: str, head_dim: int) -> None:
    """Refuse what the rotation here cannot reproduce: Phi-3's longrope factors (llama.cpp writes them as tensors,
    not as a scaling type) and a rotation of only part of each head."""
    if "rope_factors_long.weight" in tensors or "rope_factors_short.weight" in tensors:
        raise ModelError("unsupported rope scaling 'longrope' in the GGUF file (rope_factors tensors; the native decoder"
                         " covers llama3, linear and yarn, or none)")
    rotated = _field(reader, f"{arch}.rope.dimension_count")
    if rotated is not None and int(rotated) != head_dim:
        raise ModelError(f"a partial rotary embedding ({int(rotated)} of {head_dim} head dimensions) is not supported"
                         " by the native decoder")


def _unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores llama-family Q/K rows interleaved per head; restore the half-split layout."""
    rows = weight.shape[0]
    rest = weight.shape[1:]
    return weight.reshape(n_heads, rows // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(weight.shape)


def _dequantized(path: Path, tensors: dict, name: str) -> np.ndarray:
    """One tensor of the file as float32 [rows, cols] (numpy's order: GGUF lists dimensions innermost first)."""
    import gguf

    if name not in tensors:
        raise ModelError(f"{path.name}: tensor '{name}' is missing")
    t = tensors[name]
    try:
        array = gguf.quants.dequantize(t.data, t.tensor_type)
    except Exception as exc:
        raise ModelError(f"{path.name}: cannot read tensor '{name}' ({exc}); the file may be corrupt") from None
    shape = tuple(int(d) for d in reversed(t.shape))
    # Copy: float32 tensors come back as read-only views into the memory-mapped file.
    return np.array(array.reshape(shape), dtype=np.float32, copy=True)


def load_gguf_model(path: Path, device, weight_dtype: torch.dtype, max_positions: int | None, reader=None,
                    skip: frozenset = frozenset()) -> Transformer:
    """The file's model in weight_dtype; the projection matrices named in `skip` ("layers.3.qkv", "lm_head") are left
    empty, not dequantized (their GGUF blocks replace them)."""
    reader = reader or open_gguf(path)
    config = read_config(reader)
    tensors = {t.name: t for t in reader.tensors}

    def get(name: str) -> np.ndarray:
        return _dequantized(path, tensors, name)

    def qk(name: str, heads: int) -> np.ndarray:
        array = get(name)
        return _unpermute_rope_rows(array, heads) if config.architecture.gguf_permuted_qk else array

    def fused_or_parts(prefix: str, kind: str) -> np.ndarray:
        """The Q|K|V rows: one attn_qkv tensor (Phi-3) or attn_q, attn_k and attn_v stacked."""
        if f"{prefix}attn_qkv.{kind}" in tensors:
            return get(f"{prefix}attn_qkv.{kind}")
        return np.concatenate([qk(f"{prefix}attn_q.{kind}", config.n_heads), qk(f"{prefix}attn_k.{kind}", config.n_kv_heads),
                               get(f"{prefix}attn_v.{kind}")])

    model = Transformer(config, weight_dtype=weight_dtype, max_positions=max_positions)

    def put(param: torch.nn.Parameter, array: np.ndarray) -> None:
        if tuple(array.shape) != tuple(param.shape):
            raise ModelError(f"{path.name}: a tensor of shape {tuple(array.shape)} where the model needs {tuple(param.shape)}")
        param.data = torch.from_numpy(array).to(device=device, dtype=param.dtype)

    def matrix(key: str, param: torch.nn.Parameter, array) -> None:
        """array: a callable, so a skipped matrix is never dequantized."""
        if key not in skip:
            put(param, array())

    put(model.embed, get("token_embd.weight"))
    put(model.final_norm, get("output_norm.weight"))
    if model.lm_head is not None:
        matrix("lm_head", model.lm_head, lambda: get("output.weight"))
    for i, layer in enumerate(model.layers):
        p = f"blk.{i}."
        put(layer.attn_norm, get(p + "attn_norm.weight"))
        put(layer.mlp_norm, get(p + "ffn_norm.weight"))
        if layer.post_attn_norm is not None:  # Gemma's (llama.cpp's converter has added the 1 to every norm weight)
            put(layer.post_attn_norm, get(p + "post_attention_norm.weight"))
            put(layer.post_mlp_norm, get(p + "post_ffw_norm.weight"))
        matrix(f"layers.{i}.qkv", layer.qkv, lambda: fused_or_parts(p, "weight"))
        if layer.qkv_bias is not None:
            put(layer.qkv_bias, fused_or_parts(p, "bias"))
        if layer.q_norm is not None:
            put(layer.q_norm, get(p + "attn_q_norm.weight"))
            put(layer.k_norm, get(p + "attn_k_norm.weight"))
        matrix(f"layers.{i}.out_proj", layer.out_proj, lambda: get(p + "attn_output.weight"))
        # Phi-3: ffn_up holds gate and up, gate first (llama.cpp's fused SwiGLU takes the first half as the gate)
        fused = config.architecture.fused_gate_up
        matrix(f"layers.{i}.gate_up", layer.gate_up, lambda: get(p + "ffn_up.weight") if fused
               else np.concatenate([get(p + "ffn_gate.weight"), get(p + "ffn_up.weight")]))
        matrix(f"layers.{i}.down", layer.down, lambda: get(p + "ffn_down.weight"))
    return model


def matrix_tensors(config: ModelConfig, names) -> dict[str, list[tuple[str, int | None]]]:
    """The GGUF tensors behind each projection matrix, keyed by the model attribute they back ("layers.3.qkv",
    "lm_head"), as (tensor name, heads whose Q/K rows llama.cpp may have permuted, else None), in the order the
    loader stacks them. `names`: the file's tensor names (Phi-3's fused attn_qkv where the file has it)."""
    wanted = {}
    for i in range(config.n_layers):
        p = f"blk.{i}."
        fused_qkv = p + "attn_qkv.weight" in names
        wanted[f"layers.{i}.qkv"] = [(p + "attn_qkv.weight", None)] if fused_qkv else [
            (p + "attn_q.weight", config.n_heads), (p + "attn_k.weight", config.n_kv_heads), (p + "attn_v.weight", None)]
        wanted[f"layers.{i}.out_proj"] = [(p + "attn_output.weight", None)]
        wanted[f"layers.{i}.gate_up"] = ([(p + "ffn_up.weight", None)] if config.architecture.fused_gate_up
                                         else [(p + "ffn_gate.weight", None), (p + "ffn_up.weight", None)])
        wanted[f"layers.{i}.down"] = [(p + "ffn_down.weight", None)]
    # A tied head reads the embedding's blocks.
    wanted["lm_head"] = [("token_embd.weight" if config.tie_embeddings else "output.weight", None)]
    return wanted


def read_gguf_blocks(path: Path, config: ModelConfig, reader=None) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """The raw GGUF blocks behind each projection matrix (see matrix_tensors), as (ggml type, [rows, bytes per
    row] uint8) per source tensor. Matrices with any block type neither kernel reads are left out.
    """
    reader = reader or open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}

    def blocks(name: str, heads: int | None = None) -> tuple[int, torch.Tensor] | None:
        t = tensors.get(name)
        if t is None or int(t.tensor_type) not in kernels.GGUF_KERNEL_TYPES | kernels.QUANT_KERNEL_TYPES:
            return None
        data = np.asarray(t.data)
        if heads is not None and config.architecture.gguf_permuted_qk:
            data = _unpermute_rope_rows(data, heads)
        return int(t.tensor_type), torch.from_numpy(np.array(data, dtype=np.uint8, copy=True))

    wanted = {key: [blocks(name, heads) for name, heads in parts] for key, parts in matrix_tensors(config, tensors).items()}
    return {key: parts for key, parts in wanted.items() if all(part is not None for part in parts)}


def matrix_types(config: ModelConfig, reader) -> dict[str, list[str]]:
    """The ggml type names of each projection matrix's tensors (header only, no weights read)."""
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    return {key: [types.get(name, "missing") for name, _ in parts] for key, parts in matrix_tensors(config, types).items()}


def attach_gguf_blocks(model: Transformer, blocks: dict[str, list[tuple[int, torch.Tensor]]]) -> int:
    """Turn each float32 matrix that has blocks into a kernels.GGUFWeight (float32 copy kept for prompt
    GEMMs). Returns how many matrices got their blocks."""
    attached = 0
    for key, parts in blocks.items():
        owner_path, _, attr = key.rpartition(".")
        owner = model.get_submodule(owner_path) if owner_path else model
        dense = model.output_weight() if key == "lm_head" else getattr(owner, attr)
        if not isinstance(dense, torch.Tensor) or dense.dtype != torch.float32 or dense.device.type != "cpu":
            continue
        if sum(p.shape[0] for _, p in parts) != dense.shape[0]:
            raise ModelError(f"GGUF blocks for '{key}' do not match the loaded weight; delete the converted folder to rebuild")
        owner._parameters.pop(attr, None)
        setattr(owner, attr, kernels.GGUFWeight(dense.data, parts))
        attached += 1
    return attached
