"""Build a native Transformer from a Hugging Face model folder (config.json + safetensors)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import ModelError
from .config import HF_MODEL_TYPES, Architecture, ModelConfig, architecture_of_hf
from .rope import local_rope_theta_from_hf, rope_from_hf
from .transformer import Transformer


def read_hf_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise ModelError(f"{folder} has no config.json: not a Hugging Face model folder") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{folder}/config.json is not valid JSON ({exc})") from None


def is_native_arch(hf_config: dict) -> bool:
    return hf_config.get("model_type") in HF_MODEL_TYPES


# config.json's names of the gate activations, by Architecture.activation
HF_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def _refuse_what_is_not_implemented(arch: Architecture, cfg: dict) -> None:
    """One ModelError line for a config that asks for something the native decoder would silently not do."""
    sliding = cfg.get("use_sliding_window") or any(kind != "full_attention" for kind in cfg.get("layer_types") or ())
    activation = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    problem = (
        "sliding-window attention" if sliding and not arch.sliding_windows
        else "MLP biases" if cfg.get("mlp_bias")
        else "attention logit softcapping (attn_logit_softcapping)" if cfg.get("attn_logit_softcapping")
        else "bidirectional attention" if cfg.get("use_bidirectional_attention")
        else f"the activation '{activation}' (it runs {arch.activation})" if HF_ACTIVATIONS.get(activation) != arch.activation
        else None
    )
    if problem:
        raise ModelError(f"'{arch.name}' with {problem} is not supported by the native decoder")


def windows_from_hf(arch: Architecture, cfg: dict, n_layers: int) -> tuple[int, tuple[int, ...]]:
    """(window size, windowed layers): layer_types where the config lists them, else every n-th layer global
    (sliding_window_pattern, or the architecture's: Gemma 3's 6), else every layer (Mistral)."""
    window = int(cfg.get("sliding_window") or 0) if arch.sliding_windows else 0
    if not window:
        return 0, ()
    types = cfg.get("layer_types")
    if types is None:
        pattern = int(cfg.get("sliding_window_pattern") or arch.swa_pattern)
        types = ["full_attention" if pattern and (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)]
    if len(types) != n_layers or set(types) - {"full_attention", "sliding_attention"}:
        raise ModelError(f"layer_types {sorted(set(types))} for {n_layers} layers: the native decoder covers"
                         " full_attention and sliding_attention, one per layer")
    return window, tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")


def config_from_hf(cfg: dict) -> ModelConfig:
    arch = architecture_of_hf(cfg.get("model_type"))
    _refuse_what_is_not_implemented(arch, cfg)
    n_heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    rope_theta, rope_scaling = rope_from_hf(cfg)
    window, windowed = windows_from_hf(arch, cfg, int(cfg["num_hidden_layers"]))
    context = int(cfg.get("max_position_embeddings", 2048))
    if arch.window_caps_context and cfg.get("sliding_window"):
        context = min(context, int(cfg["sliding_window"]))
    return ModelConfig(
        arch=arch.name,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        n_layers=int(cfg["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
        head_dim=int(cfg.get("head_dim") or hidden // n_heads),
        rope_theta=rope_theta,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        context_length=context,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch.qkv_bias or bool(cfg.get("attention_bias", False)),
        rope_scaling=rope_scaling,
        sliding_window=window,
        sliding_layers=windowed,
        rope_local_theta=(local_rope_theta_from_hf(cfg) or arch.default_local_rope_base) if arch.default_local_rope_base else 0.0,
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or 0.0),
        final_logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
    )


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder} has no .safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except Exception as exc:
            raise ModelError(f"cannot read {f.name} ({exc}); the file may be corrupt") from None
    return tensors


def load_hf_native(folder: Path, device, weight_dtype: torch.dtype, max_positions: int | None) -> Transformer:
    return native_from_hf(read_hf_config(folder), _read_safetensors(folder), device, weight_dtype, max_positions, folder)


def native_from_hf(hf_config: dict, tensors: dict[str, torch.Tensor], device, weight_dtype: torch.dtype,
                   max_positions: int | None, folder="the model") -> Transformer:
    """The native decoder of a Hugging Face config and state dict (a folder's, or a model's in memory)."""
    config = config_from_hf(hf_config)
    if "lm_head.weight" not in tensors and not config.tie_embeddings:
        config = ModelConfig(**{**config.__dict__, "tie_embeddings": True})
    model = Transformer(config, weight_dtype=weight_dtype, max_positions=max_positions)

    def get(name: str) -> torch.Tensor:
        try:
            return tensors[name].float()
        except KeyError:
            raise ModelError(f"{folder}: tensor '{name}' is missing") from None

    def put(param: torch.nn.Parameter, value: torch.Tensor) -> None:
        if value.shape != param.shape:  # a fused matrix of another layout would otherwise load and compute nonsense
            raise ModelError(f"{folder}: a tensor of shape {tuple(value.shape)} where the model needs {tuple(param.shape)}")
        param.data = value.to(device=device, dtype=param.dtype).contiguous()

    offset = config.architecture.hf_norm_offset

    def norm(name: str) -> torch.Tensor:  # Gemma's checkpoints store w for a norm that multiplies by 1 + w
        return get(name) + offset if offset else get(name)

    put(model.embed, get("model.embed_tokens.weight"))
    put(model.final_norm, norm("model.norm.weight"))
    if model.lm_head is not None:
        put(model.lm_head, get("lm_head.weight"))
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        put(layer.attn_norm, norm(p + "input_layernorm.weight"))
        if layer.post_attn_norm is not None:  # Gemma: post_attention_layernorm follows attention, before the add
            put(layer.post_attn_norm, norm(p + "post_attention_layernorm.weight"))
            put(layer.mlp_norm, norm(p + "pre_feedforward_layernorm.weight"))
            put(layer.post_mlp_norm, norm(p + "post_feedforward_layernorm.weight"))
        else:
            put(layer.mlp_norm, norm(p + "post_attention_layernorm.weight"))
        if config.architecture.fused_qkv:
            put(layer.qkv, get(a + "qkv_proj.weight"))
        else:
            put(layer.qkv, torch.cat([get(a + "q_proj.weight"), get(a + "k_proj.weight"), get(a + "v_proj.weight")]))
        if layer.qkv_bias is not None:
            put(layer.qkv_bias, torch.cat([get(a + "q_proj.bias"), get(a + "k_proj.bias"), get(a + "v_proj.bias")]))
        if layer.q_norm is not None:
            put(layer.q_norm, norm(a + "q_norm.weight"))
            put(layer.k_norm, norm(a + "k_norm.weight"))
        put(layer.out_proj, get(a + "o_proj.weight"))
        if config.architecture.fused_gate_up:
            put(layer.gate_up, get(p + "mlp.gate_up_proj.weight"))
        else:
            put(layer.gate_up, torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]))
        put(layer.down, get(p + "mlp.down_proj.weight"))
    return model
