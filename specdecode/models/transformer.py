"""Native PyTorch decoder for the Llama/Qwen/Gemma family (config.ARCHITECTURES).

RMSNorm, rotary embeddings (half-rotation layout, as in Hugging Face checkpoints; frequencies in rope.py),
grouped-query attention, SwiGLU or GeGLU, optional QKV bias, optional per-head RMSNorm of q and k (Qwen3, Gemma 3),
optional norms after attention and MLP (Gemma), sliding-window layers (Mistral, Gemma 3), tied or
separate output head. The Q/K/V projections and
the gate/up projections are fused into one weight each, so a block of tokens streams each layer's
weights in as few matmuls as possible.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels
from ..cache import KVCache
from .config import ModelConfig
from .rope import rope_tables


@dataclass
class RowSpan:
    """Rows of one sequence inside a layer's block: `rows` rows at positions start.. of `cache`."""

    cache: KVCache
    start: int
    rows: int
    visible: torch.Tensor | None = None  # [rows, rows] bool for a token tree; None: causal


@dataclass
class Segment:
    """One sequence's part of a batched pass: new tokens appended at the end of its own cache."""

    tokens: list[int]
    cache: KVCache
    logits: str = "all"  # "all" | "last" | "none"
    parents: list[int] | None = None  # a token tree (see tree_mask); None: a chain

    @property
    def rows(self) -> int:
        return len(self.tokens)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, head_dim/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def window_mask(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """[queries, keys] bool: which keys lie inside each query's sliding window (q - k < window)."""
    return (query_positions[:, None] - key_positions[None, :]) < window


def gate_activation(gate: torch.Tensor, kind: str) -> torch.Tensor:
    return F.gelu(gate, approximate="tanh") if kind == "gelu_tanh" else F.silu(gate)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, weight_dtype: torch.dtype, index: int = 0):
        super().__init__()
        c = config
        self.config = c
        self.window = c.layer_window(index)  # 0: the layer attends every earlier position
        self.attn_norm = nn.Parameter(torch.ones(c.hidden_size), requires_grad=False)
        self.mlp_norm = nn.Parameter(torch.ones(c.hidden_size), requires_grad=False)
        # Gemma: the attention output and the MLP output are normalized again before their residual adds.
        sandwich = c.architecture.sandwich_norms
        self.post_attn_norm = nn.Parameter(torch.ones(c.hidden_size), requires_grad=False) if sandwich else None
        self.post_mlp_norm = nn.Parameter(torch.ones(c.hidden_size), requires_grad=False) if sandwich else None
        # Matrices start uninitialised: every loader overwrites them, and zero-filling the target's ~6 GB
        # only to free it took ~5 s of each load.
        self.qkv = nn.Parameter(torch.empty(c.q_size + 2 * c.kv_size, c.hidden_size, dtype=weight_dtype), requires_grad=False)
        self.qkv_bias = (
            nn.Parameter(torch.zeros(c.q_size + 2 * c.kv_size), requires_grad=False) if c.qkv_bias else None
        )
        # Qwen3: RMSNorm of each q and k head (one weight per head dimension, shared by the heads) before RoPE.
        self.q_norm = nn.Parameter(torch.ones(c.head_dim), requires_grad=False) if c.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(c.head_dim), requires_grad=False) if c.qk_norm else None
        self.out_proj = nn.Parameter(torch.empty(c.hidden_size, c.q_size, dtype=weight_dtype), requires_grad=False)
        self.gate_up = nn.Parameter(torch.empty(2 * c.intermediate_size, c.hidden_size, dtype=weight_dtype), requires_grad=False)
        self.down = nn.Parameter(torch.empty(c.hidden_size, c.intermediate_size, dtype=weight_dtype), requires_grad=False)

    def forward(self, x, layer_index: int, cache: KVCache, start: int, cos, sin, attn_mask, exact_rows: bool = False,
                visible: torch.Tensor | None = None):
        if exact_rows:
            return self.forward_rows(x, layer_index, [RowSpan(cache, start, x.shape[0], visible)], cos, sin)
        # A prompt-sized float32 block: one masked attention call (not row-exact, see Transformer.forward).
        q, k, v = self._qkv(x, cos, sin)
        cache.write(layer_index, start, k.transpose(0, 1), v.transpose(0, 1))
        keys, values = cache.view(layer_index, start + x.shape[0])
        return self._out(x, self._sdpa(q, keys, values, start, attn_mask, row_wise=False))

    def forward_rows(self, x, layer_index: int, spans: list["RowSpan"], cos, sin):
        """x holds the rows of every span in order; each span's rows attend its own cache only, row-exactly:
        a row's result depends on its own inputs and position, never on the other spans in the pass."""
        c = self.config
        fused = isinstance(self.qkv, kernels.QuantWeight)  # int8: the whole layer in one kernel call
        if fused and kernels.dispatch.FUSED_LAYER and all(s.cache.keys.dtype == torch.float32 for s in spans):
            return kernels.int8_layer(x, self, layer_index, spans, cos, sin, c)
        q, k, v = self._qkv(x, cos, sin)
        outputs, first = [], 0
        for span in spans:
            rows = slice(first, first + span.rows)
            outputs.append(self._attend(layer_index, span, q[rows], k[rows], v[rows]))
            first += span.rows
        return self._out(x, torch.cat(outputs) if len(outputs) > 1 else outputs[0])

    def _qkv(self, x, cos, sin):
        c = self.config
        seq = x.shape[0]
        if isinstance(self.qkv, kernels.QuantWeight):
            qkv = kernels.int8_attn_in(x, self, cos, sin, c)
            return (part.view(seq, -1, c.head_dim) for part in qkv.split((c.q_size, c.kv_size, c.kv_size), dim=-1))
        h = rms_norm(x, self.attn_norm, c.rms_norm_eps)
        q, k, v = kernels.linear(h, self.qkv, self.qkv_bias).split((c.q_size, c.kv_size, c.kv_size), dim=-1)
        q, k = q.reshape(seq, c.n_heads, c.head_dim), k.reshape(seq, c.n_kv_heads, c.head_dim)
        if self.q_norm is not None:
            q, k = rms_norm(q, self.q_norm, c.rms_norm_eps), rms_norm(k, self.k_norm, c.rms_norm_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v.view(seq, c.n_kv_heads, c.head_dim)

    def _attend(self, layer_index: int, span: "RowSpan", q, k, v) -> torch.Tensor:
        """One span's attention ([rows, H, D] -> [rows, q_size]) after writing its keys and values to its cache."""
        span.cache.write(layer_index, span.start, k.transpose(0, 1), v.transpose(0, 1))
        keys, values = span.cache.view(layer_index, span.start + span.rows)
        attn = kernels.block_attention(q, keys, values, span.start, span.visible, self.config.attention_scale or 0.0, self.window)
        if attn is None:
            mask = None
            if span.visible is not None:
                mask = torch.ones(span.rows, span.start + span.rows, dtype=torch.bool, device=q.device)
                mask[:, span.start :] = span.visible
                if self.window:  # a tree node sits at the position of its depth
                    depth = span.visible.sum(-1) - 1
                    keys_at = torch.cat([torch.arange(span.start, device=q.device), span.start + depth])
                    mask &= window_mask(span.start + depth, keys_at, self.window)
            attn = self._sdpa(q, keys, values, span.start, mask, row_wise=span.visible is None)
        return attn.reshape(span.rows, self.config.q_size)

    def _out(self, x, attn):
        c = self.config
        attn = attn.reshape(x.shape[0], c.q_size)
        if isinstance(self.qkv, kernels.QuantWeight):
            return kernels.int8_attn_out(x, attn, self, c)
        out = kernels.linear(attn, self.out_proj)
        if self.post_attn_norm is not None:
            out = rms_norm(out, self.post_attn_norm, c.rms_norm_eps)
        x = x + out
        h = rms_norm(x, self.mlp_norm, c.rms_norm_eps)
        gate, up = kernels.linear(h, self.gate_up).chunk(2, dim=-1)
        out = kernels.linear(gate_activation(gate, c.architecture.activation) * up, self.down)
        if self.post_mlp_norm is not None:
            out = rms_norm(out, self.post_mlp_norm, c.rms_norm_eps)
        return x + out

    def _sdpa(self, q, keys, values, start: int, attn_mask, row_wise: bool) -> torch.Tensor:
        """PyTorch's attention: prompt-sized blocks, masked (tree) blocks, and wherever the CPU kernel is missing."""
        c = self.config
        seq = q.shape[0]
        queries = q.transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
        gqa = c.n_heads != c.n_kv_heads
        if row_wise:
            # Row i attends exactly as a single-token step at position start+i would, so a verify
            # block reproduces plain decoding bit for bit (one batched masked call rounds differently).
            first = [max(0, start + i + 1 - self.window) if self.window else 0 for i in range(seq)]
            rows = [
                F.scaled_dot_product_attention(
                    queries[:, :, i : i + 1], keys[None, :, first[i] : start + i + 1], values[None, :, first[i] : start + i + 1],
                    enable_gqa=gqa, scale=c.attention_scale,
                )
                for i in range(seq)
            ]
            attn = torch.cat(rows, dim=2)
        else:
            attn = F.scaled_dot_product_attention(queries, keys[None], values[None], attn_mask=attn_mask, enable_gqa=gqa,
                                                  scale=c.attention_scale)
        return attn[0].transpose(0, 1)  # [T, H, D]


class Transformer(nn.Module):
    """forward(tokens of a block, cache) -> logits of every position (or of the last, or none)."""

    def __init__(self, config: ModelConfig, weight_dtype: torch.dtype = torch.float32, max_positions: int | None = None):
        super().__init__()
        self.config = config
        self.embed = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(config, weight_dtype, index) for index in range(config.n_layers))
        self.final_norm = nn.Parameter(torch.ones(config.hidden_size), requires_grad=False)
        self.lm_head = None if config.tie_embeddings else nn.Parameter(
            torch.empty(config.vocab_size, config.hidden_size, dtype=weight_dtype), requires_grad=False
        )
        self.max_positions = max_positions or config.context_length
        self._rope_cos = self._rope_sin = None
        self._local_rope: tuple[torch.Tensor, torch.Tensor] | None = None
        # Gemma: embeddings times sqrt(hidden_size) as a float32 number, as transformers and llama.cpp round it.
        self.embed_scale = float(torch.tensor(config.hidden_size ** 0.5)) if config.architecture.embed_scale else None
        # Optional reduced output layer (frequency-ranked vocabulary for cheap drafting):
        # logits are computed for these token ids only and every other id gets -inf.
        self.vocab_subset: torch.Tensor | None = None
        self._subset_head: torch.Tensor | None = None
        # A draft whose embedding has padding rows its target lacks: ids from here on get -inf (never proposed).
        self.vocab_limit: int | None = None
        # The GPU path (gpu.exact_pass.ExactPass, attached at load): every pass through its row-exact Triton kernels.
        self.exact_pass = None

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def int8(self) -> bool:
        """Whether the matrices are GGUF blocks times int8 activations (row-exact at any block size)."""
        return isinstance(self.layers[0].qkv, kernels.QuantWeight)

    def output_weight(self) -> torch.Tensor:
        return self.embed if self.lm_head is None else self.lm_head

    def use_draft_arithmetic(self) -> None:
        """For a model loaded to draft only: its int8 matrices take the draft layouts (kernels' QuantWeight.as_draft),
        whose roundings differ from the file's definition but take less work in prompt reads and multi-row passes.
        Never for a target (its bits are the output), nor for a model object a target may share."""
        for layer in self.layers:
            for name in ("qkv", "out_proj", "gate_up", "down"):
                weight = getattr(layer, name)
                if isinstance(weight, kernels.QuantWeight):
                    weight.as_draft()

    def set_vocab_subset(self, token_ids: torch.Tensor | None) -> None:
        if self.exact_pass is not None:  # passes captured with the old head would read it after it is freed
            self.exact_pass.forget_graphs()
        if token_ids is None:
            self.vocab_subset = self._subset_head = None
            return
        token_ids = token_ids.to(self.device, torch.long)
        self.vocab_subset = token_ids
        self._subset_head = self.output_weight().index_select(0, token_ids).contiguous()

    def set_vocab_limit(self, limit: int | None) -> None:
        self.vocab_limit = limit if limit is not None and limit < self.config.vocab_size else None

    def new_cache(self, max_len: int | None = None) -> KVCache:
        c = self.config
        length = min(max_len or self.max_positions, self.max_positions)
        if self.exact_pass is not None:
            return self.exact_pass.new_cache(length)
        return KVCache(c.n_layers, c.n_kv_heads, c.head_dim, length, self.embed.dtype, self.device)

    def _rope(self, positions: torch.Tensor, local: bool = False):
        if local:  # the windowed layers' own base (Gemma 3)
            if self._local_rope is None:
                self._local_rope = rope_tables(self.config, self.max_positions, self.device, local=True)
            return self._local_rope[0][positions], self._local_rope[1][positions]
        if self._rope_cos is None:
            self._rope_cos, self._rope_sin = rope_tables(self.config, self.max_positions, self.device)
        return self._rope_cos[positions], self._rope_sin[positions]

    def _layer_ropes(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) of the positions for each layer: windowed layers may rotate with their own base."""
        shared = self._rope(positions)
        local = self._rope(positions, local=True) if self.config.rope_local_theta else shared
        return [local if layer.window else shared for layer in self.layers]

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed[tokens]
        return x * self.embed_scale if self.embed_scale is not None else x

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,  # [T] token ids of the block
        cache: KVCache,
        positions: torch.Tensor | None = None,  # [T]; default: cache.length + arange(T)
        attn_mask: torch.Tensor | None = None,  # [T, cache.length + T] bool, True = may attend
        logits: str = "all",  # "all" | "last" | "none"
    ) -> torch.Tensor | None:
        start = cache.length
        seq = tokens.shape[0]
        if start + seq > cache.max_len:
            raise ValueError(f"block of {seq} tokens does not fit: cache holds {start} of {cache.max_len}")
        if self.exact_pass is not None:
            parents = None if attn_mask is None else mask_parents(attn_mask, start)
            return self._exact_group([Segment(tokens.tolist(), cache, logits, parents)])[0]
        if positions is None:
            positions = torch.arange(start, start + seq, device=self.device)
        # Decode steps and verify blocks compute every row exactly as it would be alone (attention kernel,
        # or PyTorch's row by row), up to the largest block whose matmuls are row-exact too; so do prompts
        # of the int8 model, whose matmuls are row-exact at any size, so a prompt token's keys and values
        # are those a decode step would write. A token tree (a mask that shows the whole prefix) attends
        # through the kernel in chain order. Other prompt-sized blocks use one masked call.
        visible = None
        if attn_mask is None:
            exact_rows = seq <= kernels.FLOAT32_CHUNKED_MAX_ROWS or self.int8
            if not exact_rows:
                attn_mask = causal_mask(start, seq, self.device)
        else:
            exact_rows = bool(attn_mask[:, :start].all())
            visible = attn_mask[:, start:] if exact_rows else None
        masks = self._window_masks(attn_mask, start, positions)
        ropes = self._layer_ropes(positions)
        x = self._embed(tokens)
        for index, layer in enumerate(self.layers):
            x = layer(x, index, cache, start, *ropes[index], masks.get(layer.window, attn_mask), exact_rows, visible)
        cache.length = start + seq
        if logits == "none":
            return None
        return self._head(x[-1:] if logits == "last" else x)

    def _window_masks(self, attn_mask, start: int, positions: torch.Tensor) -> dict:
        """For a masked (prompt-sized) block: each window size's mask, the block's mask narrowed to the window."""
        if attn_mask is None:
            return {}
        keys_at = torch.cat([torch.arange(start, device=self.device), positions])
        return {layer.window: attn_mask & window_mask(positions, keys_at, layer.window) for layer in self.layers if layer.window}

    def _softcap(self, logits: torch.Tensor) -> torch.Tensor:
        cap = self.config.final_logit_softcap  # as transformers computes it: divide, tanh, multiply
        return torch.tanh(logits / cap) * cap if cap else logits

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and output layer of the rows in x: [T, hidden] -> [T, vocab]."""
        x = rms_norm(x, self.final_norm, self.config.rms_norm_eps)
        weight = self.output_weight() if self._subset_head is None else self._subset_head
        return self._finish_logits(kernels.linear(x, weight))

    def _finish_logits(self, scores: torch.Tensor) -> torch.Tensor:
        """The output layer's scores as logits over the whole vocabulary: soft-capped, a reduced head's scattered
        (-inf elsewhere), padding ids past vocab_limit -inf. Elementwise, so each row's bits are its own."""
        if self._subset_head is None:
            logits = self._softcap(scores)
        else:
            logits = torch.full((scores.shape[0], self.config.vocab_size), float("-inf"), device=scores.device)
            logits[:, self.vocab_subset] = self._softcap(scores)
        if self.vocab_limit is not None:
            logits[:, self.vocab_limit :] = float("-inf")
        return logits

    @property
    def batch_rows(self) -> int:
        """The most rows one batched pass may hold and stay row-exact: any number on the int8 path; on the
        float32 CPU path as many as its kernels compute row by row; 0 where rows are not exact (no kernel,
        CUDA without the Triton path), so forward_batch runs each sequence alone there."""
        if self.exact_pass is not None:
            return 1 << 20
        if self.device.type != "cpu" or kernels.load_kernel() is None:
            return 0
        return 1 << 20 if self.int8 else kernels.FLOAT32_CHUNKED_MAX_ROWS

    @torch.inference_mode()
    def forward_batch(self, segments: list[Segment]) -> list[torch.Tensor | None]:
        """One pass over several sequences' new tokens, each at the end of its own cache.

        Every weight matrix multiplies all rows of all segments in one call; attention runs per segment
        over its own keys and values. Each row gets the bits it would get in `forward` alone (the kernels are
        row-exact), so a sequence's output does not depend on what else shares the pass. Returns per segment
        its logits as `forward` would ([rows, vocab], [1, vocab] or None). Where rows are not exact (see
        batch_rows), or a pass would hold more rows than stay exact, segments run in smaller groups or alone.
        """
        if self.exact_pass is not None:
            return self._exact_group(segments)
        limit = self.batch_rows
        if len(segments) == 1 or limit == 0:
            return [self._forward_segment(seg) for seg in segments]
        out, group, rows = [], [], 0
        for seg in segments:
            if group and rows + seg.rows > limit:
                out += self._forward_group(group)
                group, rows = [], 0
            group.append(seg)
            rows += seg.rows
        return out + self._forward_group(group)

    def _forward_segment(self, seg: Segment) -> torch.Tensor | None:
        tokens = torch.tensor(seg.tokens, device=self.device)
        if seg.parents is None:
            return self(tokens, seg.cache, logits=seg.logits)
        start = seg.cache.length
        logits = self(tokens, seg.cache, positions=tree_positions(start, seg.parents, self.device),
                      attn_mask=tree_mask(start, seg.parents, self.device))
        return logits[-1:] if seg.logits == "last" else (None if seg.logits == "none" else logits)

    def chain_rounds(self, rounds: list) -> list | None:
        """Greedy draft rounds (drafters.base.ChainRound) run on the device without host reads between their passes
        (gpu/draft_round.py); None off the GPU path, where a proposal drafts pass by pass."""
        if self.exact_pass is None:
            return None
        from ..gpu.draft_round import chain_rounds

        return chain_rounds(self, rounds)

    def steps_from_device(self, caches: list, tokens: torch.Tensor) -> torch.Tensor | None:
        """One decode step for each cache in one pass, the steps' tokens a device tensor (chosen on the device from
        the last pass, never read to the host: batch_ahead.py): logits [len(caches), vocab], each cache advanced by one.
        None, with nothing run, off the GPU path or where the rows do not fit one pass (caches of several pools, a
        long context's row cap)."""
        exact = self.exact_pass
        segments = [Segment([0], cache, "last") for cache in caches]  # tokens: set on the device
        if exact is None or len({id(c.pool) for c in caches}) > 1 or len(exact.plan(segments)) > 1:
            return None
        planned = exact.prepare(segments)
        with exact.on_device():
            scores = exact.launch(planned, exact.upload(planned.meta), tokens=tokens)
        for cache in caches:
            cache.length += 1
        return self._finish_logits(scores)

    def _exact_group(self, segments: list[Segment]) -> list[torch.Tensor | None]:
        """The segments through the GPU path, logits as `forward` gives them: one pass per cache pool, or as many
        as keep each within the pass's row cap (ExactPass.plan: a long chain is cut into pieces)."""
        pieces: dict[int, list] = {index: [] for index in range(len(segments))}
        for pool in dict.fromkeys(seg.cache.pool for seg in segments):
            group = [index for index, seg in enumerate(segments) if seg.cache.pool is pool]
            for passed in self.exact_pass.plan([segments[index] for index in group]):
                for (index, piece), logits in zip(passed, self._exact_pass_logits([piece for _, piece in passed])):
                    pieces[group[index]].append(logits)
        out = []
        for index, seg in enumerate(segments):
            got = [logits for logits in pieces[index] if logits is not None]
            out.append(None if seg.logits == "none" else got[0] if len(got) == 1 else torch.cat(got))
        return out

    def _exact_pass_logits(self, segments: list[Segment]) -> list[torch.Tensor | None]:
        """One pass of ExactPass over the segments; each one's logits (a view of the pass's, finished once for the
        whole pass: elementwise, so each row's bits are its own), or None."""
        scores = self.exact_pass.run(segments)
        logits = None if scores is None else self._finish_logits(scores)
        out, first = [], 0
        for seg in segments:
            seg.cache.length += seg.rows
            count = {"all": seg.rows, "last": min(seg.rows, 1)}.get(seg.logits, 0)
            out.append(logits[first : first + count] if count else None)
            first += count
        return out

    def _forward_group(self, segments: list[Segment]) -> list[torch.Tensor | None]:
        if len(segments) == 1 and segments[0].rows > self.batch_rows:
            return [self._forward_segment(segments[0])]
        spans, positions = [], []
        for seg in segments:
            start = seg.cache.length
            if start + seg.rows > seg.cache.max_len:
                raise ValueError(f"block of {seg.rows} tokens does not fit: cache holds {start} of {seg.cache.max_len}")
            if seg.parents is None:
                positions.append(torch.arange(start, start + seg.rows, device=self.device))
                visible = None
            else:
                positions.append(tree_positions(start, seg.parents, self.device))
                visible = tree_mask(start, seg.parents, self.device)[:, start:]
            spans.append(RowSpan(seg.cache, start, seg.rows, visible))
        ropes = self._layer_ropes(torch.cat(positions))
        x = self._embed(torch.tensor([t for seg in segments for t in seg.tokens], device=self.device))
        for index, layer in enumerate(self.layers):
            x = layer.forward_rows(x, index, spans, *ropes[index])
        picked, first = [], 0  # the rows whose logits are wanted, in segment order
        for seg, span in zip(segments, spans):
            seg.cache.length = span.start + span.rows
            if seg.logits == "all":
                picked.append(torch.arange(first, first + seg.rows))
            elif seg.logits == "last":
                picked.append(torch.tensor([first + seg.rows - 1]))
            first += seg.rows
        if not picked:
            return [None] * len(segments)
        logits = self._head(x[torch.cat(picked).to(self.device)])
        out, at = [], 0
        for seg in segments:
            count = {"all": seg.rows, "last": 1}.get(seg.logits, 0)
            out.append(logits[at : at + count] if count else None)
            at += count
        return out


def causal_mask(start: int, seq: int, device) -> torch.Tensor:
    """[seq, start+seq] bool: row i sees the whole prefix and block positions 0..i."""
    rows = torch.arange(seq, device=device)[:, None]
    cols = torch.arange(start + seq, device=device)[None, :]
    return cols <= rows + start


def tree_mask(start: int, parents: list[int], device) -> torch.Tensor:
    """[N+1, start+N+1] bool for a block of the root plus N tree nodes: each sees the prefix, itself and its ancestors."""
    size = len(parents) + 1
    visible = torch.zeros(size, size, dtype=torch.bool)
    visible[0, 0] = True
    for index, parent in enumerate(parents, start=1):
        visible[index] = visible[parent]
        visible[index, index] = True
    mask = torch.ones(size, start + size, dtype=torch.bool)
    mask[:, start:] = visible
    return mask.to(device)


def mask_parents(attn_mask: torch.Tensor, start: int) -> list[int] | None:
    """The parents of a token tree's rows from its mask (as tree_mask builds it); None for a causal chain. Any
    other mask is refused: the GPU path attends a whole prefix plus a chain or a tree."""
    mask = attn_mask.cpu()
    visible = mask[:, start:]
    rows = visible.shape[0]
    if not bool(mask[:, :start].all()):
        raise ValueError("the GPU path takes masks that show the whole prefix (a chain or a token tree)")
    if torch.equal(visible, torch.ones(rows, rows, dtype=torch.bool).tril()):
        return None
    parents = [int(visible[i, :i].nonzero().max()) for i in range(1, rows)]
    if not torch.equal(tree_mask(0, parents, "cpu"), visible):
        raise ValueError("the GPU path takes masks that show the whole prefix (a chain or a token tree)")
    return parents


def tree_positions(start: int, parents: list[int], device) -> torch.Tensor:
    depth = [0]
    for parent in parents:
        depth.append(depth[parent] + 1)
    return torch.tensor(depth, device=device) + start
