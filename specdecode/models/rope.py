"""Rotary position embeddings: the frequencies of each model (with its context-length scaling), their cos/sin
tables, and how Hugging Face configs and GGUF files describe the scaling.

The tables are computed once in float64 and rounded to float32; every path (float32, int8, the C++ layer)
rotates with these same tables, so a scaling type is implemented here once.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from ..errors import ModelError
from .config import ModelConfig, RopeScaling


def _yarn_ramp(scaling: RopeScaling, theta: float, dim: int) -> torch.Tensor:
    """[dim/2] in 0..1: how far each frequency is interpolated (1: divided by the factor, 0: kept)."""

    def dimension_turning(turns: float) -> float:  # the dimension whose frequency turns `turns` times over the context
        return dim * math.log(scaling.original_context / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension_turning(scaling.beta_fast), dimension_turning(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    span = (high - low) if high != low else 0.001
    return ((torch.arange(dim // 2, dtype=torch.float64) - low) / span).clamp(0, 1)


def rope_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim/2] float64, factor on cos and sin) of the model's rotary embedding."""
    scaling, dim = config.rope_scaling, config.head_dim
    inv_freq = config.rope_theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if scaling.freq_divisors is not None:
        if len(scaling.freq_divisors) != dim // 2:
            raise ModelError(f"rope frequency divisors: {len(scaling.freq_divisors)} values for head size {dim} (expected {dim // 2})")
        inv_freq = inv_freq / torch.tensor(scaling.freq_divisors, dtype=torch.float64)
    if scaling.kind == "linear":
        return inv_freq / scaling.factor, 1.0
    if scaling.kind == "llama3":
        wavelength = 2 * math.pi / inv_freq
        short = wavelength < scaling.original_context / scaling.high_freq_factor  # kept
        long = wavelength > scaling.original_context / scaling.low_freq_factor  # divided by the factor
        blend = (scaling.original_context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        between = (1 - blend) * inv_freq / scaling.factor + blend * inv_freq
        return torch.where(short, inv_freq, torch.where(long, inv_freq / scaling.factor, between)), 1.0
    if scaling.kind == "yarn":
        interpolated = _yarn_ramp(scaling, config.rope_theta, dim)
        kept = (1 - interpolated) * scaling.extrapolation
        inv_freq = inv_freq / scaling.factor * (1 - kept) + inv_freq * kept
        return inv_freq, yarn_attention_factor(scaling.factor) if scaling.attention_factor is None else scaling.attention_factor
    return inv_freq, 1.0


def yarn_attention_factor(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_tables(config: ModelConfig, max_positions: int, device, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_positions, head_dim/2] float32 of every position's angles; `local`: of the windowed layers
    that rotate with their own base (config.rope_local_theta, unscaled)."""
    if local:
        config = dataclasses.replace(config, rope_theta=config.rope_local_theta, rope_scaling=RopeScaling())
    inv_freq, attention_factor = rope_frequencies(config)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)  # [P, half]
    return (angles.cos() * attention_factor).float().to(device), (angles.sin() * attention_factor).float().to(device)


# --------------------------------------------------------------------------- what the files say
def _unsupported(kind, where: str) -> ModelError:
    return ModelError(f"unsupported rope scaling '{kind}' in {where} (the native decoder covers"
                      " llama3, linear and yarn, or none)")


def rope_from_hf(cfg: dict) -> tuple[float, RopeScaling]:
    """(theta, scaling) from a Hugging Face config.json: transformers 5's `rope_parameters` or the older
    top-level `rope_theta` with `rope_scaling`."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if params and all(isinstance(v, dict) for v in params.values()):  # one set per layer type: the global layers'
        if set(params) - {"full_attention", "sliding_attention"}:
            raise ModelError(f"rope parameters for layer types {sorted(params)} in config.json are not supported by"
                             " the native decoder (it covers full_attention and sliding_attention)")
        return rope_from_hf({**cfg, "rope_parameters": params.get("full_attention") or {}, "rope_scaling": None})
    theta = float(params.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
    kind = params.get("rope_type") or params.get("type") or "default"
    if float(params.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0) != 1.0:
        raise ModelError("a partial rotary embedding (partial_rotary_factor) is not supported by the native decoder")
    max_positions = int(cfg.get("max_position_embeddings", 2048))
    original = int(cfg.get("original_max_position_embeddings") or params.get("original_max_position_embeddings") or max_positions)
    if kind == "default":
        return theta, RopeScaling()
    if kind == "linear":
        return theta, RopeScaling("linear", factor=float(params["factor"]))
    if kind == "llama3":
        return theta, RopeScaling("llama3", factor=float(params["factor"]), original_context=original,
                                  low_freq_factor=float(params["low_freq_factor"]), high_freq_factor=float(params["high_freq_factor"]))
    if kind == "yarn":
        factor = float(params.get("factor") or max_positions / original)
        attention = params.get("attention_factor")
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if attention is None and mscale and mscale_all_dim:
            attention = yarn_attention_factor(factor, mscale) / yarn_attention_factor(factor, mscale_all_dim)
        return theta, RopeScaling("yarn", factor=factor, original_context=original, beta_fast=float(params.get("beta_fast") or 32),
                                  beta_slow=float(params.get("beta_slow") or 1), truncate=bool(params.get("truncate", True)),
                                  attention_factor=None if attention is None else float(attention))
    raise _unsupported(kind, "config.json")


def local_rope_theta_from_hf(cfg: dict) -> float:
    """The windowed layers' own rope base where the config gives one (Gemma 3), else 0. transformers 5 writes it as
    rope_parameters["sliding_attention"], older files as rope_local_base_freq; any scaling of it is refused."""
    params = cfg.get("rope_parameters") or {}
    local = params.get("sliding_attention") if all(isinstance(v, dict) for v in params.values()) else None
    if local is None:
        return float(cfg.get("rope_local_base_freq") or 0.0)
    if (local.get("rope_type") or "default") != "default":
        raise _unsupported(local.get("rope_type"), "config.json's sliding_attention layers")
    return float(local.get("rope_theta") or cfg.get("rope_local_base_freq") or 10000.0)


def rope_from_gguf(field, arch: str, freq_divisors: list[float] | None) -> RopeScaling:
    """The scaling of a GGUF file: `{arch}.rope.scaling.*` keys (field(key, default) reads one) and the
    `rope_freqs` tensor (llama 3's per-frequency divisors), computed the way llama.cpp computes them."""
    kind = field(f"{arch}.rope.scaling.type", None)
    factor = float(field(f"{arch}.rope.scaling.factor", 0.0) or field(f"{arch}.rope.scale_linear", 0.0) or 1.0)
    if kind in (None, "none") or (kind == "linear" and factor == 1.0):
        return RopeScaling(freq_divisors=freq_divisors)
    if kind == "linear":
        return RopeScaling("linear", factor=factor, freq_divisors=freq_divisors)
    if kind == "yarn":
        # llama.cpp's attention factor: 1 + 0.1 ln(factor), or its ratio form when a log multiplier is given,
        # times rope.scaling.attn_factor (its yarn_attn_factor key is replaced by this, so it is not read).
        log_mul = float(field(f"{arch}.rope.scaling.yarn_log_multiplier", 0.0))
        attention = yarn_attention_factor(factor) / (yarn_attention_factor(factor, log_mul) if log_mul else 1.0)
        return RopeScaling(
            "yarn", factor=factor,
            original_context=int(field(f"{arch}.rope.scaling.original_context_length", 0) or field(f"{arch}.context_length", 2048)),
            beta_fast=float(field(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(field(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)),
            extrapolation=max(float(field(f"{arch}.rope.scaling.yarn_ext_factor", 1.0)), 0.0) or 1.0,
            attention_factor=attention * float(field(f"{arch}.rope.scaling.attn_factor", 1.0)), freq_divisors=freq_divisors,
        )
    raise _unsupported(kind, "the GGUF file")
