"""Constraints on what a generation may say: a grammar the engine enforces token by token.

    GrammarSpec("json_object", "")          any JSON object
    GrammarSpec("json_schema", schema_text)  JSON valid against a JSON schema (the schema as JSON text)
    GrammarSpec("lark", grammar_text)        llguidance's Lark dialect (special tokens as <|im_end|> or <[id]>)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GrammarSpec:
    kind: str
    source: str
