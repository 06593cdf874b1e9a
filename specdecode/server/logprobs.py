"""Log-probabilities in OpenAI's shapes: chat's `logprobs.content` entries, and the legacy completions object.

The engine records token ids and values (controls.TokenLogprob); here they get their text and bytes, through
llguidance's byte table of the tokenizer (the exact bytes of every token, byte-level BPE or SentencePiece).
"""
from __future__ import annotations

from ..grammar import grammar_tokenizer


def describe(tokenizer, vocab_size: int, records) -> list[dict]:
    """Chat's per-token entries: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}."""
    if not records:
        return []
    table = grammar_tokenizer(tokenizer, vocab_size)

    def entry(token: int, logprob: float) -> dict:
        raw = table.decode_bytes([token])
        return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}

    return [{**entry(r.token, r.logprob), "top_logprobs": [entry(t, lp) for t, lp in r.top]} for r in records]


def chat_logprobs(entries: list[dict]) -> dict:
    return {"content": entries, "refusal": None}


def completion_logprobs(entries: list[dict], text_offset: int = 0) -> dict:
    """The completions API's columns; text_offset: where the first token's text starts in the answer."""
    offsets = []
    for entry in entries:
        offsets.append(text_offset)
        text_offset += len(entry["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{top["token"]: top["logprob"] for top in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}
