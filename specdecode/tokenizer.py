"""Tokenizer wrapper: encoding, decoding, chat templates (incremental detokenising lives in text.py)."""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field

from .errors import ChatTemplateError


@dataclass
class Tokenizer:
    hf: object  # a transformers PreTrainedTokenizer(Fast)
    eos_ids: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def from_hf(cls, hf) -> "Tokenizer":
        eos = set()
        if hf.eos_token_id is not None:
            eos.add(int(hf.eos_token_id))
        # Chat models end a turn with <|im_end|> / <|eot_id|> even when eos names another token.
        for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>"):
            tid = hf.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != hf.unk_token_id and tid is not None and tid >= 0:
                eos.add(tid)
        return cls(hf=hf, eos_ids=frozenset(eos))

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        """At most how many bytes of text one token stands for: the UTF-8 length of the longest vocabulary
        string (byte-level BPE spells each byte with one character, SentencePiece spells text as itself).
        A text of more than n times this many bytes cannot fit in n tokens."""
        return max((len(token.encode("utf-8")) for token in self.hf.get_vocab()), default=1)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def chat_prompt(self, messages: list[dict]) -> str:
        """The template's text for these messages. A template that refuses them (its raise_exception: roles that
        do not alternate, a system message where none is allowed) or fails on them is a ChatTemplateError."""
        from jinja2 import TemplateError

        try:
            return self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ChatTemplateError(f"the model's chat template cannot render these messages ({type(exc).__name__}:"
                                    f" {exc})") from None

    def fingerprint(self) -> str:
        """Identity of the vocabulary: two models can speculate for each other only if these agree."""
        vocab = self.hf.get_vocab()
        digest = hashlib.sha256()
        for token, tid in sorted(vocab.items(), key=lambda item: item[1]):
            digest.update(f"{tid}\t{token}\n".encode("utf-8", "surrogatepass"))
        return digest.hexdigest()
