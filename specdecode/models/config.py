"""Shape and hyper-parameters of a Llama/Qwen-family decoder, and what differs between the architectures."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import ModelError


@dataclass(frozen=True)
class Architecture:
    """The facts that set one architecture of the family apart from the others. Every architecture here is a
    pre-norm decoder with RMSNorm, half-rotation RoPE, grouped-query attention and a gated MLP; adding one
    that differs only in these facts is one line in ARCHITECTURES."""

    name: str  # Hugging Face `model_type` and GGUF `general.architecture`
    qkv_bias: bool  # Q/K/V projections carry biases (HF folders; a GGUF file says so by having the tensors)
    qk_norm: bool  # per-head RMSNorm of q and k (weights of size head_dim) before the rotation
    gguf_permuted_qk: bool  # llama.cpp stores the Q/K rows of each head interleaved (convert_hf_to_gguf's permute)
    hf_model_type: str = ""  # the Hugging Face `model_type` where it is not `name` (gemma3_text)
    activation: str = "silu"  # of the MLP's gate: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, tanh-approximated GELU)
    sandwich_norms: bool = False  # RMSNorms also after attention and after the MLP, before each residual add (Gemma)
    hf_norm_offset: float = 0.0  # HF checkpoints store each norm weight minus this (Gemma's 1 + w); GGUF files do not
    embed_scale: bool = False  # embeddings multiplied by sqrt(hidden_size), rounded to float32, before layer 0
    sliding_windows: bool = False  # the config may give layers a sliding attention window (read, not refused)
    swa_pattern: int = 0  # files that list no layer types: every n-th layer global, the others windowed
    default_local_rope_base: float = 0.0  # files that give no rope base for the windowed layers (GGUF without freq_base_swa)
    # Phi-3: one Q|K|V matrix (HF self_attn.qkv_proj, GGUF attn_qkv) and one gate|up matrix (HF mlp.gate_up_proj,
    # GGUF ffn_up of 2 x feed_forward_length rows, gate first): the decoder's own fused layout, read as it is.
    fused_qkv: bool = False
    fused_gate_up: bool = False
    # config.json's `sliding_window` applies to every layer (Phi-3). The native decoder attends fully, which equals
    # the window up to `sliding_window` positions, so the context is capped there instead of running another model.
    window_caps_context: bool = False


ARCHITECTURES = {
    "llama": Architecture("llama", qkv_bias=False, qk_norm=False, gguf_permuted_qk=True),
    "qwen2": Architecture("qwen2", qkv_bias=True, qk_norm=False, gguf_permuted_qk=False),
    "qwen3": Architecture("qwen3", qkv_bias=False, qk_norm=True, gguf_permuted_qk=False),
    # Mistral is Llama with an optional window on every layer (its GGUF files say `llama`, as llama.cpp runs them).
    "mistral": Architecture("mistral", qkv_bias=False, qk_norm=False, gguf_permuted_qk=True, sliding_windows=True),
    # Gemma 3 (text): GeGLU, four norms a layer, scaled embeddings, windowed layers with their own rope base; the
    # GGUF defaults are llama.cpp's (it reads neither the pattern nor the local base from older files).
    "gemma3": Architecture("gemma3", qkv_bias=False, qk_norm=True, gguf_permuted_qk=False, hf_model_type="gemma3_text",
                           activation="gelu_tanh", sandwich_norms=True, hf_norm_offset=1.0, embed_scale=True,
                           sliding_windows=True, swa_pattern=6, default_local_rope_base=10000.0),
    "phi3": Architecture("phi3", qkv_bias=False, qk_norm=False, gguf_permuted_qk=False, fused_qkv=True, fused_gate_up=True,
                         window_caps_context=True),
}
SUPPORTED_ARCHS = tuple(ARCHITECTURES)
HF_MODEL_TYPES = {arch.hf_model_type or arch.name: arch.name for arch in ARCHITECTURES.values()}


def architecture(name) -> Architecture:
    """The architecture of that name, or a ModelError naming the ones the native decoder covers."""
    if name not in ARCHITECTURES:
        raise ModelError(f"unsupported architecture '{name}' (the native decoder covers {', '.join(SUPPORTED_ARCHS)})")
    return ARCHITECTURES[name]


def architecture_of_hf(model_type) -> Architecture:
    """The architecture a Hugging Face `model_type` names (gemma3_text is gemma3), or the same ModelError (also for
    `gemma3`, which in a config.json is the multimodal model around the text decoder)."""
    if model_type not in HF_MODEL_TYPES:
        raise ModelError(f"unsupported architecture '{model_type}' (the native decoder covers {', '.join(SUPPORTED_ARCHS)};"
                         f" Hugging Face model types {', '.join(HF_MODEL_TYPES)})")
    return architecture(HF_MODEL_TYPES[model_type])


ROPE_KINDS = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """How the rotary frequencies theta^(-2i/d) are stretched for a longer context (models.rope computes them).

    default: unchanged. linear: every frequency divided by `factor`. llama3: low frequencies (wavelength over
    original_context / low_freq_factor) divided by `factor`, high ones (under original_context / high_freq_factor)
    kept, a smooth blend between. yarn: frequencies that turn less than beta_slow times over the original context
    divided by `factor`, those turning more than beta_fast times kept, a linear ramp over the dimensions between
    (scaled by extrapolation); cos and sin then multiplied by `attention_factor` (None: 1 + 0.1 ln factor).
    freq_divisors (a GGUF file's rope_freqs tensor, one per frequency) divide the frequencies before any of this.
    """

    kind: str = "default"
    factor: float = 1.0
    original_context: int = 0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    extrapolation: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True  # yarn: the ramp's ends rounded outwards to whole dimensions
    freq_divisors: tuple[float, ...] | None = None

    def __post_init__(self):
        if self.kind not in ROPE_KINDS:
            raise ModelError(f"unsupported rope scaling '{self.kind}' (the native decoder covers {', '.join(ROPE_KINDS)})")
        if self.freq_divisors is not None:  # a list once read back from JSON
            object.__setattr__(self, "freq_divisors", tuple(float(d) for d in self.freq_divisors))


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # a key of ARCHITECTURES
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
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    # Sliding-window attention: the layers listed attend only the last `sliding_window` positions (their own
    # included: key position p is seen from query position q iff q - p < sliding_window).
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    rope_local_theta: float = 0.0  # rope base of the windowed layers, unscaled (Gemma 3); 0: as the other layers
    query_pre_attn_scalar: float = 0.0  # attention scores scaled by its inverse square root; 0: by head_dim's
    final_logit_softcap: float = 0.0  # logits = cap * tanh(logits / cap); 0: none

    def __post_init__(self):
        if isinstance(self.rope_scaling, dict):  # read back from a converted folder's config.json
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        object.__setattr__(self, "sliding_layers", tuple(int(i) for i in self.sliding_layers))  # a JSON list
        if self.sliding_layers and self.sliding_window <= 0:
            raise ModelError(f"windowed layers {list(self.sliding_layers)} without a window size")

    def layer_window(self, layer: int) -> int:
        """How many positions the layer's attention sees back from each query (itself included); 0: all."""
        return self.sliding_window if layer in self.sliding_layers else 0

    @property
    def attention_scale(self) -> float | None:
        """The factor on q.k where query_pre_attn_scalar sets it, rounded to float32 as the kernels use it; None: the
        usual 1/sqrt(head_dim), left to each attention (as before, so other models keep their bits)."""
        if not self.query_pre_attn_scalar:
            return None
        return float(torch.tensor(self.query_pre_attn_scalar ** -0.5, dtype=torch.float32))

    @property
    def architecture(self) -> Architecture:
        return architecture(self.arch)

    @property
    def qk_norm(self) -> bool:
        return self.architecture.qk_norm

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim
