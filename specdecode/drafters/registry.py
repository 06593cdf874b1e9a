"""Every drafter by name: what builds it and whether it needs a draft model.

The engine, the command line, the server and the benchmark all read this one table, so a new
drafter is added here once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import InputError
from .base import Drafter
from .draft_model import DraftModelDrafter, TreeDrafter
from .lookup import PromptLookupDrafter
from .auto import AutoDrafter
from .suffix import SuffixDrafter


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    needs_draft_model: bool
    # engine -> a new drafter for it; None for plain decoding.
    build: Callable[[object], Drafter] | None
    description: str


DRAFTERS: dict[str, DrafterSpec] = {
    spec.name: spec
    for spec in (
        DrafterSpec("auto", False, lambda engine: AutoDrafter(
            engine.drafter("suffix"), engine.drafter("draft") if engine.draft is not None and engine.auto_draft_model else None),
                    "per step: copy from this or earlier requests, else the draft model where it pays"),
        DrafterSpec("none", False, None, "plain decoding, one target pass per token"),
        DrafterSpec("lookup", False, lambda engine: PromptLookupDrafter(),
                    "copy what followed an earlier occurrence of the recent tokens (no model)"),
        DrafterSpec("suffix", False, lambda engine: SuffixDrafter(engine.suffix_store),
                    "prompt lookup over this request and the same client's earlier requests (no model)"),
        DrafterSpec("draft", True, lambda engine: DraftModelDrafter(engine.draft.model, engine.max_context, engine.draft_opening),
                    "a small model of the same tokenizer drafts a chain"),
        DrafterSpec("tree", True, lambda engine: TreeDrafter(engine.draft.model, engine.max_context, engine.draft_opening),
                    "the draft model's top-2 token tree (greedy only)"),
    )
}
DRAFTER_NAMES = tuple(DRAFTERS)
# Other spellings of plain decoding (the benchmark calls it "ar", autoregressive).
ALIASES = {"ar": "none", "plain": "none"}


def drafter_spec(name: str) -> DrafterSpec:
    spec = DRAFTERS.get(ALIASES.get(name, name))
    if spec is None:
        raise InputError(f"unknown drafter '{name}' (choose from {', '.join(DRAFTER_NAMES)})")
    return spec


def build_drafter(owner, built: dict[str, Drafter], name: str | Drafter | None) -> Drafter | None:
    """owner's drafter of that name, made once and kept in `built` with its state (None: plain decoding).
    owner: what the builders read (an Engine, or one batch slot with drafters of its own)."""
    if name is None or isinstance(name, Drafter):
        return name
    spec = drafter_spec(name)
    if spec.build is None:
        return None
    if spec.needs_draft_model and owner.draft is None:
        raise InputError(f"drafter '{spec.name}' needs a draft model (load the engine with one)")
    drafter = built.get(spec.name)
    if drafter is None:
        drafter = built[spec.name] = spec.build(owner)
    return drafter


def available_drafters(has_draft_model: bool) -> list[str]:
    """Every drafter by name, less those that need a draft model where the engine has none."""
    return [name for name, spec in DRAFTERS.items() if has_draft_model or not spec.needs_draft_model]

