"""One decoder pass over the rows of one or more sequences through the Triton kernels, each row exact.

`ExactPass.run(segments)` computes every segment's new tokens (a decode step, a verify chain or tree, a prompt
chunk) against its own cache slot, all rows in one launch of each kernel, and returns each segment's logits.
A row's bits depend on its own tokens, position and cache alone (triton_kernels.py says how), so a verify block
reproduces the decode steps it stands for and a request in a batch gets its solo output.

On CUDA the passes of up to CAPTURED_ROWS rows run as CUDA graphs, one per row-count bucket: the rows are padded
to the bucket (padding rows write to the pool's slot 0 and are dropped), their metadata goes to the device in one
copy, and the pass is one replay. Larger passes (prompt chunks) launch the same kernels one by one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import torch

from ..sampling import int64_to_device
from .gguf_blocks import K_STEP, BlockPart, BlockWeight
from .kv_pool import KVPool

# Row-count buckets captured as CUDA graphs; a pass of more rows runs eagerly.
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
CAPTURED_ROWS = BUCKETS[-1]
# Metadata rows of a pass (int32 [META + depth, rows]): token, position, cache slot, cache entry written, keys
# seen, keys before the tree part; then the entries of a token tree's ancestors by depth.
TOKEN, POS, SLOT, WRITE, KEYS, PREFIX = range(6)
META = 6


@dataclass(frozen=True)
class ShapeTiles:
    """A product's launch for one weight shape, where a device sweep found another faster than the defaults (chosen
    by the matrix's N and K, never by rows: every pass multiplies a matrix the same way, so rows stay exact)."""

    block_n: int = 64
    split: int = 0  # the reduction length of one split (a multiple of block_k); 0: Tiles.split_size's rule
    warps: int = 4
    stages: int = 3


@dataclass(frozen=True)
class Tiles:
    """The kernels' fixed shapes. None of them may depend on a pass's row count: they decide how every row is
    summed. attn_split is the attention segment (keys merged per segment, segments merged in order)."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = K_STEP  # GGUF-block matrices need K a multiple of it (gguf_blocks.gpu_readable)
    max_split: int = 512
    attn_chunk: int = 64
    attn_split: int = 64
    elementwise: int = 1024
    warps: int = 4  # the products' launch: how, not what, they compute
    stages: int = 3
    # A residual's splits are summed by column blocks of sum_block first where a row holds more partial sums than
    # serial_sum_limit (floats). Off by default: on an H200 (docs/bench/gpu-h200-run4-two-phase-sums) the 7B shape's
    # down projection ran slower so, with blocks of 1024 (4 programs a row); narrower blocks are untried.
    serial_sum_limit: int = 1 << 62
    sum_block: int = 128
    # The last split of each product tile adds the tile's splits (in order) where the product has several, so the
    # consumers read one sum per row instead of one program per row reading every split; the last segment of a
    # row's attention merges the segments (in order), so no merge kernel is launched (triton_kernels.py).
    # Off by default until a device run shows it bitwise (issue 63): the interpreter runs programs one at a time in
    # grid order, so it can never show the arrival counters under real concurrency (scripts/gpu_check.py does).
    fused_sums: bool = False
    # The gate|up product's tiles pair each gate column with its up column and their last split applies the gated
    # activation (with fused_sums; a matrix whose gate and up are blocks of two types runs the activation kernel).
    # Off by default for the same reason: the paired lanes have not run under a GPU's MMA.
    fused_act: bool = False
    # A check's twin, never a production choice: programs take splits and segments last to first, so that another
    # program arrives last and adds the others (the sums must not change).
    reversed: bool = False
    # Programmatic dependent launch (Hopper and later): each kernel launches while the one before still runs and
    # waits at its start for it to finish (triton_kernels._after_previous), hiding the gap between kernels. No value
    # changes; off until a device run has measured it (scripts/gpu_check.py, part pdl). Not in the interpreter.
    pdl: bool = False
    # Per weight shape ((N, K), ShapeTiles) pairs: the products of those shapes launch so (`for_shape`); others, and
    # every kernel but the products, keep the fields above. Empty until a device sweep chooses (scripts/gpu_check.py,
    # part shape_tiles, prints the table it found).
    shapes: tuple = ()
    split: int = 0  # set by for_shape only: this shape's split length
    # The products' tiles computed transposed (weights on the MMA's M side, rows on its N side: linear_partial_kernel's
    # SWAP_AB), with block_m the rows a tile holds: `swapped()` gives 16-row tiles, so a decode step's tile
    # multiplies 16 rows where the 64-row tile multiplies 64, mostly padding. Every pass of a model takes them (a
    # prompt chunk as 16-row tiles), so rows stay exact. Off until a device run has measured and checked it
    # (scripts/gpu_check.py, part swap).
    swap_ab: bool = False
    # With fused_sums: the end of each sublayer (residual add and the next RMSNorm) runs in the output and down
    # products' last tile of each row block (linear_partial_kernel's RESIDUAL), two launches a layer fewer. Off
    # until a device run has checked and measured it: that tile ends its rows one after another (scripts/gpu_check.py,
    # part swap).
    fused_residual: bool = False
    # With fused_sums: the QKV epilogue (bias, q/k norms, rotary embedding, cache writes) runs in the QKV product's
    # last tile of each row block (linear_partial_kernel's QKV), one launch a layer fewer. Off until a device run
    # has checked and measured it (part swap times it with the other fusions).
    fused_qkv: bool = False

    def swapped(self, rows: int = 16) -> "Tiles":
        """These tiles with the products transposed over tiles of `rows` rows (16: the narrowest tile tl.dot takes)."""
        return dataclasses.replace(self, swap_ab=True, block_m=rows)

    def for_shape(self, n: int, k: int) -> "Tiles":
        """The tiles a product over an [n, k] matrix launches with: a function of the matrix alone."""
        for key, chosen in self.shapes:
            if key == (n, k):
                if chosen.split % self.block_k:
                    raise ValueError(f"a split of {chosen.split} for [{n}, {k}]: not a multiple of {self.block_k}")
                return dataclasses.replace(self, block_n=chosen.block_n, split=chosen.split, warps=chosen.warps,
                                           stages=chosen.stages, shapes=())
        return self

    def split_size(self, k: int) -> int:
        """Reduction length of one split of a product over k: from k alone (about k/8, so that small row counts
        still fill the device), a multiple of block_k; or the split a shape's tiles chose."""
        if self.split:
            return self.split
        target = min(self.max_split, triton_next_pow2(k) // 8)
        return max(self.block_k, target // self.block_k * self.block_k)


def check_shape(weight, tiles: Tiles) -> None:
    """Refuse a matrix the product kernel would read out of bounds: GGUF blocks whose K is not a multiple of the
    kernel's K step (its loads are masked by whole steps), or a matrix of 2^31 weights or more (32-bit offsets)."""
    n, k = weight.shape
    if isinstance(weight, BlockWeight) and k % tiles.block_k:
        raise ValueError(f"a matrix of GGUF blocks [{n}, {k}]: the Triton kernel reads K in steps of {tiles.block_k}"
                         f" (load it as bfloat16: --precision bfloat16)")
    if n * k >= 1 << 31:
        raise ValueError(f"a matrix of {n} x {k} weights: the Triton kernel indexes weights in 32 bits")


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass
class PlannedPass:
    """One pass decided on the host (ExactPass.prepare): what ExactPass.launch runs."""

    pool: KVPool
    rows: int  # the segments' rows (the bucket's padding rows not counted)
    keys: int  # the most keys a row sees
    bucket: tuple[int, int] | None  # the captured pass that runs it (rows, keys); None: eager
    meta: np.ndarray  # int32 [META + width, bucket rows or rows]
    wanted: list[int]  # the rows whose logits it returns


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class ExactPass:
    """The Triton pass of one native Transformer (models/transformer.py), its cache pools and captured graphs."""

    def __init__(self, model, tiles: Tiles = Tiles(), graphs: bool | None = None):
        from . import triton_kernels  # Triton reads TRITON_INTERPRET when the kernels are defined

        self.k = triton_kernels
        self.model = model
        self.tiles = tiles
        c = model.config
        self.act_dtype = model.layers[0].qkv.dtype
        self.dot_f32 = interpreting() or self.act_dtype == torch.float32
        # Weights rebuilt from GGUF blocks are rounded to bfloat16 on their bits where Triton's conversion truncates
        self.round_by_bits = interpreting()
        # every launch's programmatic dependent launch (Tiles.pdl: the kernels' switch and the launch's), where the
        # device has it (compute capability 9.0 and later)
        hopper = model.device.type == "cuda" and torch.cuda.get_device_capability(model.device)[0] >= 9
        self.pdl = dict(PDL=True, launch_pdl=True) if tiles.pdl and hopper and not interpreting() else {}
        self.group = c.n_heads // c.n_kv_heads
        self.group_pad = max(16, triton_next_pow2(self.group))
        self.graphs = model.device.type == "cuda" if graphs is None else graphs
        self.device = model.device  # the device every launch and capture runs on (made current for them)
        self.pools: dict[int, KVPool] = {}
        self._captured: dict = {}
        # Greedy draft rounds as one CUDA graph each (gpu/draft_round.RoundGraph, by their passes' shapes): off until
        # a device run has checked and timed them (scripts/gpu_check.py, part rounds); without CUDA the same
        # launches run uncaptured.
        self.round_graphs = False
        self.rounds: dict = {}
        self._memory = None  # one memory pool for every captured pass: they replay one at a time
        self._head_cache: tuple[torch.Tensor, torch.Tensor] | None = None  # (output weight, its copy in act_dtype)
        # The most rows one pass holds (plan cuts larger ones): the partial sums of the splits and of the attention
        # segments grow with the rows.
        self.max_rows = 128
        # The most float32 values a pass's attention scratch (per layer: rows x kv heads x segments x padded group
        # x (head size + 2)) may hold: plan gives long contexts fewer rows a pass (1 GiB; under 2^31 offsets).
        self.scratch_limit = 1 << 28
        # Arrival counts of fused split sums: enough for 4,096 rows of the widest product (the head)
        widest = max(c.vocab_size, c.q_size + 2 * c.kv_size, 2 * c.intermediate_size)
        narrowest = min([tiles.block_n] + [chosen.block_n for _, chosen in tiles.shapes])
        self._shape_tiles: dict[tuple, Tiles] = {}  # Tiles.for_shape by (tiles, N, K)
        self._counts = [torch.zeros(-(-4096 // tiles.block_m) * -(-widest // narrowest), dtype=torch.int32,
                                    device=model.device)]
        # Arrival counts of the row blocks a product ends (Tiles.fused_residual, fused_qkv): 4,096 rows
        self._row_counts = torch.zeros(-(-4096 // tiles.block_m), dtype=torch.int32, device=model.device)

    # ------------------------------------------------------------------ caches
    def new_cache(self, max_len: int):
        c = self.model.config
        with self.on_device():
            if max_len not in self.pools:
                self.pools[max_len] = KVPool(c.n_layers, c.n_kv_heads, c.head_dim, max_len, self.act_dtype,
                                              self.model.device)
            return self.pools[max_len].new_cache()

    def on_device(self):
        """The model's device made current: Triton launches on the current device, and graphs capture there
        (a model on cuda:1 must not launch on cuda:0)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    # ------------------------------------------------------------------ a pass
    def run(self, segments) -> torch.Tensor | None:
        """Logits [wanted rows, vocab] (float32) of the rows the segments want (models.transformer.Segment: each
        row of an "all" segment, the last of a "last" one), in order, after writing every row's keys and values to
        its cache; None where no row wants logits. The segments' caches all come from one pool of this pass, and
        their rows fit one pass (plan). One tensor for the whole pass, so that what follows it (finishing the
        logits, the argmaxes) is a launch or two however many sequences share it."""
        planned = self.prepare(segments)
        with self.on_device():
            return self.launch(planned, self.upload(planned.meta))

    def upload(self, meta: np.ndarray) -> torch.Tensor:
        """A pass's metadata on the device, copied behind the work queued there: from pinned memory on CUDA, so that
        neither the host nor the copy waits for the passes still running (a batch launches its next pass before it
        reads the last: batch_ahead.py)."""
        host = torch.from_numpy(meta)
        if self.model.device.type == "cuda":
            host = host.pin_memory()
        return host.to(self.model.device, non_blocking=True)

    def prepare(self, segments) -> "PlannedPass":
        """What a pass over the segments launches, decided on the host: its captured bucket (or None: eager), its
        metadata (numpy, to be copied to the device) and the rows whose logits it returns."""
        pool = segments[0].cache.pool
        if any(seg.cache.pool is not pool for seg in segments):
            raise ValueError("segments of one pass must share a cache pool")
        rows = sum(seg.rows for seg in segments)
        keys = max(seg.cache.length + seg.rows for seg in segments)  # the most keys a row of the pass sees
        bucket = self._bucket(rows, keys, pool)
        width = max_depth(segments) if bucket is None else bucket[0]
        meta = pass_metadata(segments, rows if bucket is None else bucket[0], width).numpy()
        return PlannedPass(pool, rows, keys, bucket, meta, wanted_rows(segments))

    def launch(self, planned: "PlannedPass", meta: torch.Tensor, tokens: torch.Tensor | None = None
               ) -> torch.Tensor | None:
        """The pass `prepare` planned, over its metadata on the device (`meta`: planned.meta's copy). tokens: the
        first rows' tokens as a device tensor, written over the metadata's on the device (a draft round feeds each
        pass the token its last pass chose without reading it to the host). Call within on_device()."""
        if tokens is not None:
            meta[TOKEN, : tokens.shape[0]].copy_(tokens)
        wanted, rows = planned.wanted, planned.rows
        if planned.bucket is None:
            picked = None if len(wanted) == rows else int64_to_device(wanted, self.model.device)
            return self.forward(meta, planned.pool, planned.keys, picked)
        graph, static_meta, static_logits = self._graph(*planned.bucket, planned.pool)
        static_meta.copy_(meta, non_blocking=True)
        graph.replay()
        # A copy of the rows wanted: the bucket's next replay overwrites its logits. The wanted rows' index goes up
        # from pinned memory: a blocking copy would wait for every pass still queued (launch_ahead's, a draft round).
        if len(wanted) == rows:
            return static_logits[:rows].clone()
        return static_logits.index_select(0, int64_to_device(wanted, self.model.device)) if wanted else None

    def _bucket(self, rows: int, keys: int, pool: KVPool) -> tuple[int, int] | None:
        """The captured pass (rows, keys) that runs these rows: rows and attention segments rounded up to powers
        of two (segments at most the pool's), where the scratch stays within scratch_limit; None: run eagerly."""
        bucket = next((b for b in BUCKETS if b >= rows), None) if self.graphs else None
        if bucket is None:
            return None
        split = self.tiles.attn_split
        segments = min(triton_next_pow2(-(-keys // split)), -(-pool.max_len // split))
        if bucket * self.scratch_per_row(segments * split) > self.scratch_limit:
            return None
        return bucket, segments * split

    def _graph(self, bucket: int, keys: int, pool: KVPool):
        """The captured pass of `bucket` rows whose rows see at most `keys` keys. Keyed on the pool's tensors and
        the output head it reads (a draft's head subset may be replaced), and holding that head, so that a graph
        never reads freed memory."""
        head = self.head_weight()
        key = (bucket, keys, id(pool), pool.version, id(head))
        if key not in self._captured:
            self._captured = {k: v for k, v in self._captured.items() if k[2] != key[2] or k[3] == pool.version}
            meta = padding_metadata(bucket, bucket).to(self.model.device)
            self._captured[key] = (*self._capture(meta, pool, keys), head)
        return self._captured[key][:3]

    def _capture(self, meta: torch.Tensor, pool: KVPool, keys: int):
        """(graph, its metadata, its logits) of one pass over `meta`'s rows."""
        graph, logits = self.capture(lambda: self.forward(meta, pool, keys))
        return graph, meta, logits

    def capture(self, work):
        """(graph, what work() returned): work's launches captured as one CUDA graph in the passes' memory pool
        (captured passes replay one at a time), after one run on a side stream that compiles the kernels and
        settles the allocator."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            work()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self._memory = self._memory or torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._memory):
            out = work()
        return graph, out

    def forget_graphs(self) -> None:
        """Drop the captured passes and rounds (the model's head changed: they would read the old one)."""
        self._captured = {}
        self.rounds = {}

    # ------------------------------------------------------------------ how many rows a pass takes
    def scratch_per_row(self, keys: int) -> int:
        """float32 values of one row's attention scratch per layer (m, l and acc) where rows see up to `keys` keys."""
        c = self.model.config
        return c.n_kv_heads * -(-keys // self.tiles.attn_split) * self.group_pad * (c.head_dim + 2)

    def rows_for(self, keys: int) -> int:
        """The most rows one pass may hold where its rows see up to `keys` keys (at least 1)."""
        return max(1, min(self.max_rows, self.scratch_limit // self.scratch_per_row(keys)))

    def plan(self, segments) -> list[list]:
        """The passes that run `segments` (of one pool) in order, each within rows_for its longest row: lists of
        (index of the segment, Segment). A chain longer than a pass takes is cut into pieces run in successive
        passes (each piece attends the keys the one before wrote); a tree is never cut."""
        passes, current, rows, keys = [], [], 0, 0
        for index, seg in enumerate(segments):
            pieces = self._pieces(seg)
            for number, piece in enumerate(pieces, start=1):
                ends = piece.cache.length + sum(p.rows for p in pieces[:number])  # the keys its last row sees
                if current and rows + piece.rows > self.rows_for(max(keys, ends)):
                    passes.append(current)
                    current, rows, keys = [], 0, 0
                current.append((index, piece))
                rows, keys = rows + piece.rows, max(keys, ends)
                if number < len(pieces):
                    passes.append(current)
                    current, rows, keys = [], 0, 0
        return passes + ([current] if current else [])

    def _pieces(self, seg) -> list:
        """A segment cut into chains that a pass takes at the segment's longest keys (its logits: every piece's
        rows for "all", the last piece's last row for "last"); a tree, or a segment that fits, whole."""
        size = self.rows_for(seg.cache.length + seg.rows)
        if seg.parents is not None or seg.rows <= size:
            return [seg]
        cuts = range(0, seg.rows, size)
        return [dataclasses.replace(seg, tokens=seg.tokens[at : at + size],
                                    logits=seg.logits if seg.logits == "all" or at + size >= seg.rows else "none")
                for at in cuts]

    def forward(self, meta: torch.Tensor, pool: KVPool, keys: int, picked: torch.Tensor | None = None
                ) -> torch.Tensor | None:
        """The pass itself over device metadata [META + depth, rows] whose rows see at most `keys` keys: logits
        [rows, vocab] float32, or of the rows `picked` (indices) only; None where none is picked."""
        model, c = self.model, self.model.config
        rows = meta.shape[1]
        x = model.embed[meta[TOKEN].long()]
        x = (x * model.embed_scale if model.embed_scale is not None else x).float().contiguous()
        h = torch.empty(rows, c.hidden_size, dtype=self.act_dtype, device=x.device)
        self.k.rms_norm_kernel[(rows,)](x, model.layers[0].attn_norm, h, c.hidden_size, c.rms_norm_eps,
                                        BLOCK=triton_next_pow2(c.hidden_size), **self.pdl)
        for index, layer in enumerate(model.layers):
            attn = self._attention(layer, index, h, meta, pool, keys)
            h = self._mlp(layer, index, x, attn)
        if picked is not None:  # a row's logits depend on its own row alone: the others need no head
            if not picked.numel():
                return None
            h = h.index_select(0, picked)
        return self._head(h)

    # ------------------------------------------------------------------ parts of a layer
    def product(self, x: torch.Tensor, weight: torch.Tensor, gated: torch.Tensor | None = None,
                gelu: bool = False, residual: tuple | None = None, qkv: tuple | None = None
                ) -> tuple[torch.Tensor, int]:
        """The splits of x [rows, K] @ weight [N, K].T: float32 partial sums [splits, rows, N] and their count (one
        sum where the kernel adds them). gated [rows, N / 2]: weight is [gate | up] and the kernel writes
        act(gate) * up there instead (act: SiLU, or GELU where gelu). residual (x, post, norm, h), with fused
        sums: the kernel also ends the sublayer as _residual does (x += the product, h = the next norm); qkv
        (_attention's), with fused sums: it also finishes the QKV rows as qkv_finish_kernel does."""
        rows, k = x.shape
        n = weight.shape[0]
        t = self.tiles
        if t.shapes:  # chosen once per tiles and matrix shape: eager passes (prompt chunks) run this every product
            key = (t, n, k)
            if key not in self._shape_tiles:
                self._shape_tiles[key] = t.for_shape(n, k)
            t = self._shape_tiles[key]
        check_shape(weight, t)
        split = t.split_size(k)
        splits = -(-k // split)
        part = torch.empty(splits, rows, n, dtype=torch.float32, device=x.device)
        fuse = t.fused_sums and (splits > 1 or residual is not None or qkv is not None) or gated is not None
        summed = part
        if gated is not None:
            summed = gated
        elif fuse:
            summed = torch.empty(1, rows, n, dtype=torch.float32, device=x.device)
        # A matrix of GGUF blocks: one launch per run of one block type, each writing its columns of part
        parts = weight.parts if isinstance(weight, BlockWeight) else [BlockPart(0, 0, n, (weight,) * 6)]
        end_args, end_consts = self._product_end(parts, t, n, residual, qkv)
        for p in parts:
            grid = (-(-rows // t.block_m), -(-p.rows // t.block_n), splits)
            counts = self._arrivals(grid[0] * grid[1], x.device)
            self.k.linear_partial_kernel[grid](x, *p.kernel_arrays(), part, summed, counts, rows, p.rows, k, p.first,
                                               n, *end_args, splits, split, BLOCK_M=t.block_m,
                                               BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                                               KIND=p.kind, DOT_F32=self.dot_f32, ROUND_BY_BITS=self.round_by_bits,
                                               FUSE_SUM=fuse, PAIRED=gated is not None, GELU=gelu,
                                               REVERSED=t.reversed, SWAP_AB=t.swap_ab, num_warps=t.warps,
                                               num_stages=t.stages, **end_consts, **self.pdl)
        return (summed, 1) if fuse else (part, splits)

    def _product_end(self, parts, t: Tiles, n: int, residual: tuple | None, qkv: tuple | None
                     ) -> tuple[tuple, dict]:
        """The product kernel's runtime arguments and constexprs for what its last tile of each row block ends: a
        sublayer (RESIDUAL, residual = (x, post, norm, h)), the QKV epilogue (QKV, qkv: _qkv_finish's), or nothing
        (unused pointers)."""
        unused, consts = self._row_counts, {}
        ends = (unused,) * 4
        if residual is not None:
            x, post, norm, h = residual
            ends = (x, post if post is not None else x, norm, h)
            consts = dict(RESIDUAL=True, HAS_POST=post is not None, NORM_N=n, NORM_BLOCK=triton_next_pow2(n))
        finish = (unused,) * 11 + (0, 0)
        if qkv is not None:
            finish, qkv_consts = self._qkv_finish(*qkv, unused=unused)
            consts.update(QKV=True, **qkv_consts)
        tiles = sum(-(-p.rows // t.block_n) for p in parts)  # a row block's tiles over every launch
        return (*ends, self._row_counts, tiles, self.model.config.rms_norm_eps, *finish), consts

    def _qkv_finish(self, layer, meta: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q: torch.Tensor,
                    unused: torch.Tensor) -> tuple[tuple, dict]:
        """The QKV epilogue's pointers and strides (qkv_finish_kernel's, from bias_ptr to head_stride) and its
        constexprs: the same for its kernel and for the product's last tiles."""
        c = self.model.config
        cos, sin = self._rope_tables(layer)
        present = [w if w is not None else unused for w in (layer.qkv_bias, layer.q_norm, layer.k_norm)]
        args = (*present, cos, sin, meta[POS], meta[SLOT], meta[WRITE], q, keys, values, keys.stride(0),
                keys.stride(1))
        return args, dict(H=c.n_heads, HKV=c.n_kv_heads, D=c.head_dim, HAS_BIAS=layer.qkv_bias is not None,
                          QK_NORM=layer.q_norm is not None)

    def _arrivals(self, tiles: int, device) -> torch.Tensor:
        """The products' arrival counts (int32 zeros; every launch leaves them zero, so launches share them). A
        larger set replaces a smaller one but the smaller stays alive: captured graphs point at it."""
        if self._counts[-1].numel() < tiles:
            self._counts.append(torch.zeros(max(tiles, 2 * self._counts[-1].numel()), dtype=torch.int32, device=device))
        return self._counts[-1]

    def _attention(self, layer, index: int, h: torch.Tensor, meta: torch.Tensor, pool: KVPool, n_keys: int
                   ) -> torch.Tensor:
        """QKV product, q/k norms, rotary embedding, cache writes and attention of every row: [rows, H * D]. The
        epilogue runs in the product's last tiles where the tiles say so (Tiles.fused_qkv), else in its kernel."""
        c, t = self.model.config, self.tiles
        q = torch.empty(h.shape[0], c.n_heads, c.head_dim, dtype=self.act_dtype, device=h.device)
        finish = (layer, meta, pool.keys[index], pool.values[index], q)  # pools [slots, HKV, max_len, D]
        if t.fused_sums and t.fused_qkv:
            self.product(h, layer.qkv, qkv=finish)
        else:
            part, splits = self.product(h, layer.qkv)
            args, consts = self._qkv_finish(*finish, unused=part)
            self.k.qkv_finish_kernel[(h.shape[0], c.n_heads + 2 * c.n_kv_heads)](
                part, *args, h.shape[0], c.rms_norm_eps, SPLITS=splits, **consts, **self.pdl)
        return self.attend(layer, index, q, meta, pool, n_keys)

    def attend(self, layer, index: int, q: torch.Tensor, meta: torch.Tensor, pool: KVPool, n_keys: int
               ) -> torch.Tensor:
        """Attention of every row's q [rows, H, D] over its own cache entries (at most n_keys): [rows, H * D].
        The scratch and the grid cover the segments the rows reach, not the pool's length."""
        c, t = self.model.config, self.tiles
        rows = q.shape[0]
        keys, values = pool.keys[index], pool.values[index]
        segments = -(-min(n_keys, pool.max_len) // t.attn_split)
        shape = (rows, c.n_kv_heads, segments, self.group_pad)
        m = torch.empty(shape, dtype=torch.float32, device=q.device)
        total = torch.empty(shape, dtype=torch.float32, device=q.device)
        acc = torch.empty(*shape, c.head_dim, dtype=torch.float32, device=q.device)
        scale = c.attention_scale or c.head_dim ** -0.5
        depth = meta[META:]
        common = dict(H=c.n_heads, HKV=c.n_kv_heads, GROUP=self.group, GROUP_PAD=self.group_pad, D=c.head_dim,
                      SPLIT=t.attn_split)
        out = torch.empty(rows, c.q_size, dtype=self.act_dtype, device=q.device)
        self.k.attention_partial_kernel[(rows, c.n_kv_heads, segments)](
            q, keys, values, meta[SLOT], meta[POS], meta[KEYS], meta[PREFIX], depth, depth.stride(0), m, total, acc,
            out, self._arrivals(rows * c.n_kv_heads, q.device), keys.stride(0), keys.stride(1), rows, scale,
            layer.window, segments, CHUNK=t.attn_chunk, DOT_F32=self.dot_f32, FUSE_MERGE=t.fused_sums,
            REVERSED=t.reversed, **common, **self.pdl)
        if not t.fused_sums:
            self.k.attention_merge_kernel[(rows, c.n_kv_heads)](m, total, acc, meta[POS], meta[KEYS], out, rows,
                                                                layer.window, segments, **common, **self.pdl)
        return out

    def _mlp(self, layer, index: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection and residual, MLP and residual (x updated in place); returns the next product's
        input: the next layer's normed rows, or the final norm's."""
        model, c = self.model, self.model.config
        rows = x.shape[0]
        h = torch.empty(rows, c.hidden_size, dtype=self.act_dtype, device=x.device)
        self._sublayer(attn, layer.out_proj, x, layer.post_attn_norm, layer.mlp_norm, h)
        act = self._gated(layer.gate_up, h)
        last = index + 1 == len(model.layers)
        following = model.final_norm if last else model.layers[index + 1].attn_norm
        self._sublayer(act, layer.down, x, layer.post_mlp_norm, following, h)
        return h

    def _sublayer(self, inputs: torch.Tensor, weight, x: torch.Tensor, post, norm, h: torch.Tensor) -> None:
        """A sublayer's last product and its end (x += it, h = RMSNorm(x) * norm): in the product's tiles where the
        tiles say so (Tiles.fused_residual), else by _residual."""
        if self.tiles.fused_sums and self.tiles.fused_residual:
            self.product(inputs, weight, residual=(x, post, norm, h))
        else:
            self._residual(self.product(inputs, weight), x, post, norm, h)

    def _gated(self, gate_up, h: torch.Tensor) -> torch.Tensor:
        """act(gate) * up of the rows h [rows, hidden]: [rows, intermediate], in the product's tiles where they can
        (one launch), else by the activation kernel over the product's sums."""
        c, t = self.model.config, self.tiles
        rows, inter, gelu = h.shape[0], c.intermediate_size, c.architecture.activation == "gelu_tanh"
        act = torch.empty(rows, inter, dtype=self.act_dtype, device=h.device)
        if t.fused_sums and t.fused_act and (not isinstance(gate_up, BlockWeight) or len(gate_up.parts) == 1):
            self.product(h, gate_up, gated=act, gelu=gelu)
            return act
        part, splits = self.product(h, gate_up)
        width = min(t.elementwise, triton_next_pow2(inter))
        self.k.gated_act_kernel[(rows, -(-inter // width))](part, act, rows, inter, splits, GELU=gelu, BLOCK=width,
                                                             **self.pdl)
        return act

    def _residual(self, product: tuple[torch.Tensor, int], x: torch.Tensor, post, norm, h: torch.Tensor) -> None:
        """x += the product (its splits summed in order; RMS-normed by `post` first where the architecture has it),
        then h = RMSNorm(x) * norm: one program per row. Where a row's splits are many (a long reduction's), one
        program would read them all alone, so they are first summed by column blocks in parallel (the same sums in
        the same order, a choice made from the shape alone)."""
        c = self.model.config
        part, splits = product
        rows, n = x.shape[0], c.hidden_size
        if splits * n > self.tiles.serial_sum_limit:
            summed = torch.empty(1, rows, n, dtype=torch.float32, device=x.device)
            width = min(self.tiles.sum_block, triton_next_pow2(n))
            self.k.reduce_kernel[(rows, -(-n // width))](part, part, summed, rows, n, splits, HAS_BIAS=False,
                                                         BLOCK=width, **self.pdl)
            part, splits = summed, 1
        block = triton_next_pow2(n)
        # More warps keep more of a row's loads in flight (fixed per model: every row is still reduced one way).
        self.k.residual_norm_kernel[(rows,)](part, x, post if post is not None else x, norm, h, rows, n, splits,
                                             c.rms_norm_eps, HAS_POST=post is not None, BLOCK=block,
                                             num_warps=max(4, min(16, block // 256)), **self.pdl)

    def head_weight(self):
        """The output head a pass multiplies (a draft's subset head where it has one), in the matrices' dtype."""
        model = self.model
        weight = model._subset_head if model._subset_head is not None else model.output_weight()
        return weight if weight.dtype == self.act_dtype else self._head_copy(weight)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        weight = self.head_weight()
        part, splits = self.product(h, weight)
        if splits == 1:  # summed already (a sum never ends at -0.0, so adding it to 0.0 would change no bit)
            return part[0]
        rows, n = h.shape[0], weight.shape[0]
        logits = torch.empty(rows, n, dtype=torch.float32, device=h.device)
        width = min(self.tiles.elementwise, triton_next_pow2(n))
        self.k.reduce_kernel[(rows, -(-n // width))](part, part, logits, rows, n, splits, HAS_BIAS=False, BLOCK=width,
                                                     **self.pdl)
        return logits

    def _head_copy(self, weight: torch.Tensor) -> torch.Tensor:
        """The output weight in the matrices' dtype (a float32 embedding tied to the head), made once."""
        if self._head_cache is None or self._head_cache[0] is not weight:
            self._head_cache = (weight, weight.to(self.act_dtype).contiguous())
        return self._head_cache[1]

    def _rope_tables(self, layer) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [positions, D/2] of the layer's rotation (windowed layers may have their own base)."""
        model = self.model
        local = bool(layer.window and model.config.rope_local_theta)
        if model._rope_cos is None or (local and model._local_rope is None):  # build the tables once
            zero = torch.zeros(1, dtype=torch.long, device=model.device)
            model._rope(zero)
            model._rope(zero, local=local)
        return model._local_rope if local else (model._rope_cos, model._rope_sin)


# ---------------------------------------------------------------------- the rows' metadata
def wanted_rows(segments) -> list[int]:
    """The rows of a pass whose logits its segments want, in order: an "all" segment's every row, a "last" one's
    last."""
    wanted, first = [], 0
    for seg in segments:
        if seg.logits == "all":
            wanted += range(first, first + seg.rows)
        elif seg.logits == "last" and seg.rows:
            wanted.append(first + seg.rows - 1)
        first += seg.rows
    return wanted


def max_depth(segments) -> int:
    """The most rows a token tree's path holds (its deepest node's, wherever that node sits in the block)."""
    return max((max(map(len, tree_ancestors(seg.parents))) if seg.parents else 1) for seg in segments)


def tree_ancestors(parents: list[int]) -> list[list[int]]:
    """Per block row of a token tree (row 0 the root, row i's parent parents[i-1]): its ancestors' rows and its own,
    by depth."""
    paths = [[0]]
    for index, parent in enumerate(parents, start=1):
        paths.append(paths[parent] + [index])
    return paths


def padding_metadata(rows: int, width: int) -> torch.Tensor:
    """Metadata of rows that only pad a pass: token 0 at position 0 of the pool's scratch slot 0."""
    return torch.from_numpy(_padding(rows, width))


def _padding(rows: int, width: int) -> np.ndarray:
    meta = np.zeros((META + width, rows), dtype=np.int32)
    meta[KEYS] = meta[PREFIX] = 1
    return meta


def pass_metadata(segments, rows: int, width: int) -> torch.Tensor:
    """int32 [META + width, rows] for the segments' rows in order, then padding rows up to `rows`."""
    meta = _padding(rows, width)
    first = 0
    for seg in segments:
        start, count = seg.cache.length, seg.rows
        if start + count > seg.cache.max_len:
            raise ValueError(f"block of {count} tokens does not fit: cache holds {start} of {seg.cache.max_len}")
        at = slice(first, first + count)
        meta[TOKEN, at] = seg.tokens
        meta[SLOT, at] = seg.cache.slot
        meta[WRITE, at] = np.arange(start, start + count)
        if seg.parents is None:
            meta[POS, at] = meta[WRITE, at]
            meta[KEYS, at] = meta[PREFIX, at] = meta[WRITE, at] + 1
        else:
            for offset, path in enumerate(tree_ancestors(seg.parents)):
                depth = len(path) - 1
                meta[POS, first + offset] = start + depth
                meta[KEYS, first + offset] = start + depth + 1
                meta[PREFIX, first + offset] = start
                meta[META : META + depth + 1, first + offset] = np.asarray(path) + start
        first += count
    return torch.from_numpy(meta)
