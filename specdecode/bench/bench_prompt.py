"""One benchmark prompt: the record every suite (prompts.py, copy_suites.py, short_suite.py) builds."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    turns: tuple[str, ...]  # user turns, answered one after another as a chat
