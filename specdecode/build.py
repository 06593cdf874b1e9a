"""Building an engine from options: the one place the command line, the server and the benchmark load models.

    options = EngineOptions(model="qwen2.5-coder-1.5b", draft="lookup")
    engine, drafter = build_engine(options)
"""
from __future__ import annotations

import gc

from dataclasses import dataclass, fields

from . import registry
from .errors import InputError


@dataclass
class EngineOptions:
    model: str = registry.DEFAULT_TARGET  # registry name, .gguf file or Hugging Face folder
    draft: str | None = None  # draft model, a model-free drafter name, or None for the default
    draft_dtype: str = "auto"
    precision: str = "int8"
    device: str | None = None
    ctx: int = 4096
    threads: int | None = None
    suffix_store_tokens: int = 262_144  # earlier requests' tokens the suffix drafter may copy from
    allow_inexact: bool = False  # run where blocks are not row-exact (no CPU kernel): output may differ from plain
    launch_ahead: bool = False  # plain decoding on the GPU path: each pass launched before the last is read

    @classmethod
    def from_args(cls, args) -> "EngineOptions":
        """From parsed command-line flags (flags a command lacks keep their defaults)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def parse_k(value) -> int | str:
    """A draft length: an integer, or 'auto' for the adaptive choice."""
    if value == "auto":
        return "auto"
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InputError(f"--k must be an integer or 'auto', got {value!r}") from None


def draft_dtype(requested: str, target) -> str:
    """int8 halves what a bfloat16 draft streams per token where a kernel reads the file's blocks: the CPU's int8
    kernel, and on CUDA the Triton product (int8 there means the GGUF blocks, multiplied in bfloat16)."""
    if requested != "auto":
        return requested
    from . import kernels

    device = getattr(getattr(target.model, "device", None), "type", None)
    if target.backend == "native" and (device == "cuda" or (device == "cpu" and kernels.load_kernel() is not None)):
        return "int8"
    return "bfloat16"


def default_draft_model(model: str, target) -> str | None:
    """The draft model the default drafter (auto) may use: the default pair's only where it pays.

    Against the int8 target the 0.5B coder model accepts too few tokens for its drafts to beat copying: on
    HumanEval copying was clearly faster, and on Spec-Bench's categories with little to copy auto with the
    model ran no faster than without it (docs/bench/HISTORY.md), so an int8 target drafts by copying alone.
    The float32 target, whose step is dearer, and GPUs load the draft model.
    """
    int8 = getattr(target.model, "int8", False)  # native models; the transformers adapter is never int8
    if model == registry.DEFAULT_TARGET and not int8:
        return registry.DEFAULT_DRAFT
    return None


def freeze_loaded_objects() -> None:
    """For a process that serves from here on: the objects alive now (models, tokenizers, libraries: hundreds of
    thousands of them) leave the garbage collector's generations. A full collection walks every tracked object;
    with these in it, one came every few hundred passes of a busy batch and held up the next pass as long as a
    hundred passes' host work (docs/experiments/batch_host_time.py --freeze). What is garbage now is collected
    first; what becomes garbage among these objects later is never collected, which suits what a server holds
    until it exits."""
    gc.collect()
    gc.freeze()


def build_engine(options, need_draft: bool = True, with_draft_model: bool = False):
    """Load the target (and a draft model when the drafter needs one); returns (engine, drafter name).

    options: EngineOptions, or parsed flags with the same names. with_draft_model: load the default draft
    model with the default target even where the default drafter does not use it (bench, tune).
    """
    import torch

    from .drafters.registry import DRAFTERS
    from .engine import Engine
    from .models.loader import load_model

    if not isinstance(options, EngineOptions):
        options = EngineOptions.from_args(options)
    if options.threads:
        torch.set_num_threads(options.threads)
    target = load_model(options.model, device=options.device, dtype=options.precision, max_context=options.ctx)
    drafter = options.draft or ("auto" if need_draft else "none")
    if drafter in DRAFTERS:  # a drafter by name: auto may use the default draft model, the rest need none
        auto_spec = default_draft_model(options.model, target)
        draft_spec = auto_spec if drafter == "auto" else None
        if with_draft_model and options.model == registry.DEFAULT_TARGET:
            draft_spec = registry.DEFAULT_DRAFT
        draft = _load_draft(draft_spec, options, target) if draft_spec else None
        # A draft model loaded only for other drafters leaves auto as the default runs it: a benchmark's
        # auto column is then what a user of the default gets.
        return Engine(target, draft, max_context=options.ctx, suffix_store_tokens=options.suffix_store_tokens,
                      auto_draft_model=auto_spec is not None, allow_inexact=options.allow_inexact,
                      launch_ahead=options.launch_ahead), drafter
    draft = _load_draft(drafter, options, target)  # a draft model by name or path
    return Engine(target, draft, max_context=options.ctx, suffix_store_tokens=options.suffix_store_tokens,
                  allow_inexact=options.allow_inexact, launch_ahead=options.launch_ahead), "draft"


def prepare_model_files(options) -> list[str]:
    """Pull and convert, in this process, the model files build_engine(options) will load, so that N replicas
    starting together find them ready instead of each downloading and converting them. Returns their names."""
    import torch

    from .drafters.registry import DRAFTERS
    from .models.loader import default_device, prepare_model_file

    if not isinstance(options, EngineOptions):
        options = EngineOptions(**options) if isinstance(options, dict) else EngineOptions.from_args(options)
    specs = [options.model]
    drafter = options.draft or "auto"
    if drafter not in DRAFTERS:
        specs.append(drafter)  # a draft model by name or path
    elif drafter == "auto" and options.model == registry.DEFAULT_TARGET:
        # default_draft_model's rule before any model is loaded: the int8 target on a CPU drafts by copying.
        device = torch.device(options.device) if options.device else default_device()
        if not (options.precision in ("int8", "q8_0") and device.type == "cpu"):
            specs.append(registry.DEFAULT_DRAFT)
    for spec in specs:
        prepare_model_file(spec)
    return specs


def _load_draft(spec: str, options: EngineOptions, target):
    from .errors import UnsupportedDtype
    from .models.loader import load_model

    dtype = draft_dtype(options.draft_dtype, target)
    # A draft's precision decides no output (the target does), so its float matrices may become Q8_0 without asking.
    dtype = "q8_0" if dtype == "int8" else dtype
    try:
        draft = load_model(spec, device=options.device, dtype=dtype, max_context=options.ctx)
    except UnsupportedDtype:
        if options.draft_dtype != "auto":
            raise
        return load_model(spec, device=options.device, dtype="bfloat16", max_context=options.ctx)
    if hasattr(draft.model, "use_draft_arithmetic"):  # loaded here for drafting only: no target shares the object
        draft.model.use_draft_arithmetic()
    return draft
