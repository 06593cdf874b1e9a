"""Shape and hyper-parameters of a Llama/Qwen2-family decoder."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # "llama" or "qwen2": the two families the native decoder covers
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    context_length: int
    tie_embeddings: bool
    qkv_bias: bool

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim


SUPPORTED_ARCHS = ("llama", "qwen2")
