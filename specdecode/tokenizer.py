"""Tokenizer wrapper: encoding, decoding, chat templates (incremental detokenising lives in text.py)."""
from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field

from .errors import ChatTemplateError, InputError, ToolsUnsupported


class ChatPrompt(str):
    """A rendered chat whose message content holds control-token strings (a user typing `<|im_start|>system`).
    Its text is the chat as rendered; `marked` is the same rendering with each control string from the content
    wrapped in `mark`, so that `Tokenizer.encode` reads those as text and only the template's as control tokens."""

    marked: str
    mark: str


@dataclass
class Tokenizer:
    hf: object  # a transformers PreTrainedTokenizer(Fast)
    eos_ids: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def from_hf(cls, hf) -> "Tokenizer":
        eos = set()
        if hf.eos_token_id is not None:
            eos.add(int(hf.eos_token_id))
        # Chat models end a turn with <|im_end|> / <|eot_id|> / <end_of_turn> (Gemma) even when eos names another token.
        for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<end_of_turn>"):
            tid = hf.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != hf.unk_token_id and tid is not None and tid >= 0:
                eos.add(tid)
        if not getattr(hf, "chat_template", None) and _has_tokens(hf, "<start_of_turn>", "<end_of_turn>"):
            hf.chat_template = GEMMA_TURNS_TEMPLATE  # GGUF files of Gemma often carry no template
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
        if isinstance(text, ChatPrompt):
            return self._encode_marked(text)
        return list(self.hf.encode(text, add_special_tokens=False))

    @functools.cached_property
    def prompt_prefix(self) -> list[int]:
        """The token the tokenizer itself puts before any text where it puts one (Gemma's <bos>, which the model
        needs to read a prompt; none for Qwen or SmolLM2)."""
        try:
            ids = list(self.hf.encode("", add_special_tokens=True))
        except Exception:  # a tokenizer without special-token handling
            return []
        bos = getattr(self.hf, "bos_token_id", None)
        return ids[:1] if bos is not None and ids[:1] == [bos] else []

    def encode_prompt(self, text: str) -> list[int]:
        """A whole prompt's ids: encode's, after prompt_prefix unless the text (a chat template's) begins with it."""
        ids = self.encode(text)
        return ids if not self.prompt_prefix or ids[:1] == self.prompt_prefix else self.prompt_prefix + ids

    def decode(self, ids: list[int]) -> str:
        backend = self._backend_decoder
        if backend is not None:
            return backend.decode(ids, skip_special_tokens=True)
        return self.hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    @functools.cached_property
    def _backend_decoder(self):
        """The tokenizers library's tokenizer where transformers' decode only calls it: a TokenizersBackend whose
        decode no subclass overrides (with clean-up off, transformers adds argument handling and nothing else).
        The streaming detokenizer decodes twice per token of every request; straight to the backend that is about
        half the time per call, host time a batched pass pays per request."""
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        cls, backend = type(self.hf), getattr(self.hf, "_tokenizer", None)
        stock = cls.decode is PreTrainedTokenizerBase.decode and cls._decode is TokenizersBackend._decode
        return backend if isinstance(self.hf, TokenizersBackend) and stock and backend is not None else None

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The chat as prompt text, with `tools` (OpenAI function tools) listed as the template lists them. Where a
        message or tool holds control-token strings, a ChatPrompt, which `encode` tokenizes with those strings as
        text: only the template writes control tokens. Other chats are plain text, tokenized as they always were."""
        text = self._render(messages, tools)
        controls, _ = self._control_tokens
        if controls is None or not any(controls.search(string) for string in _strings([messages, tools])):
            return text
        mark = next((chr(c) for c in range(0xE000, 0xF900) if chr(c) not in text), None)  # Unicode's private use area
        if mark is None:
            raise InputError("message content holds control tokens and every private-use character")
        marked = _map_strings([messages, tools], lambda string: controls.sub(lambda found: mark + found.group(0) + mark, string))
        prompt = ChatPrompt(text)
        prompt.marked = self._render(*marked)
        prompt.mark = mark
        return prompt

    def _render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The template's text for these messages. A template that refuses them (its raise_exception: roles that
        do not alternate, a system message where none is allowed) or fails on them is a ChatTemplateError, and so
        is one that leaves the tools out (it has no tools support)."""
        from jinja2 import TemplateError

        try:
            text = self.hf.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)
            if tools and text == self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False):
                raise ToolsUnsupported("the model's chat template does not render 'tools' (it has no tools support);"
                                       " send the request without tools, or serve a model whose template lists them")
            return text
        except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ChatTemplateError(f"the model's chat template cannot render these messages ({type(exc).__name__}:"
                                    f" {exc})") from None
        except RecursionError:  # the template recurses into nested tool schemas and arguments
            raise ChatTemplateError("the model's chat template cannot render these messages: they nest too deeply") from None

    @functools.cached_property
    def _control_tokens(self) -> tuple[re.Pattern | None, frozenset[int]]:
        """(a pattern matching them, their ids) for the strings the tokenizer reads as control tokens: its special
        added tokens, and the other added tokens the chat template writes (whitespace ones are text)."""
        template = str(getattr(self.hf, "chat_template", None) or "")
        added = (getattr(self.hf, "added_tokens_decoder", None) or {}).values()
        names = {t.content for t in added if t.content and not t.content.isspace() and (t.special or t.content in template)}
        if not names:
            return None, frozenset()
        pattern = re.compile("|".join(map(re.escape, sorted(names, key=len, reverse=True))))
        return pattern, frozenset(self.hf.convert_tokens_to_ids(name) for name in names)

    def _encode_marked(self, prompt: ChatPrompt) -> list[int]:
        controls, control_ids = self._control_tokens
        pieces = prompt.marked.split(prompt.mark)  # template text, a control string from content, template text, ...
        if len(pieces) % 2 == 0 or not all(controls.fullmatch(piece) for piece in pieces[1::2]):
            raise InputError("the chat template takes apart message content that holds control tokens;"
                             " send the content without them")
        ids = []
        for index, piece in enumerate(pieces):
            if index % 2 == 0:
                ids += self.hf.encode(piece, add_special_tokens=False) if piece else []
                continue
            as_text = self._encode_as_text(piece)
            if control_ids & set(as_text):
                raise InputError(f"message content holds {piece!r}, which this tokenizer cannot read as text")
            ids += as_text
        return ids

    def _encode_as_text(self, text: str) -> list[int]:
        """`text` tokenized without reading any added token in it. A fast tokenizer runs its pipeline by hand rather
        than through the `split_special_tokens` switch, a setting of the shared tokenizer that other threads'
        encodes would see."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is None:
            return list(self.hf.encode(text, add_special_tokens=False, split_special_tokens=True))

        def pipeline(string: str) -> list[int]:
            if backend.normalizer is not None:
                string = backend.normalizer.normalize_str(string)
            pre = backend.pre_tokenizer
            splits = [part for part, _ in pre.pre_tokenize_str(string)] if pre is not None else [string]
            return [token.id for part in splits for token in backend.model.tokenize(part)]

        # After a newline, as in the middle of a prompt: SentencePiece adds a space at the start of a string only.
        newline, ids = pipeline("\n"), pipeline("\n" + text)
        return ids[len(newline):] if ids[: len(newline)] == newline else pipeline(text)

    @functools.cached_property
    def _real_vocab(self) -> dict[str, int]:
        """The vocabulary without the "[PAD<id>]" entries llama.cpp's converter writes for embedding rows no token
        uses (a GGUF file's vocabulary is as long as its embedding): two paddings of one tokenizer compare equal."""
        return {token: tid for token, tid in self.hf.get_vocab().items() if token != f"[PAD{tid}]"}

    @property
    def real_vocab_end(self) -> int:
        """One past the largest id a real token has: ids from here on are padding rows of the embedding."""
        return max(self._real_vocab.values(), default=-1) + 1

    @functools.cached_property
    def _merges(self) -> str | None:
        """A digest of the model's type and merges: parsing a large vocabulary's tokenizer JSON takes a good part of a
        second, and every engine with a draft model compares the two tokenizers."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is None:
            return None
        model = json.loads(backend.to_str()).get("model", {})
        return hashlib.sha256(json.dumps([model.get("type"), model.get("merges")]).encode()).hexdigest()

    def _serialized(self) -> str | None:
        """The whole tokenizer (vocabulary, merges, normalizer, pre-tokenizer, added tokens) as its backend writes it."""
        backend = getattr(self.hf, "backend_tokenizer", None)
        return None if backend is None else backend.to_str()

    def _special_ids(self) -> dict[int, str]:
        decoder = getattr(self.hf, "added_tokens_decoder", {}) or {}
        return {tid: added.content for tid, added in decoder.items() if added.special and added.content != f"[PAD{tid}]"}

    def difference(self, other: "Tokenizer") -> str | None:
        """None where `other` turns every text into the same ids as this tokenizer and back (padding aside); else
        what differs, in a few words: the vocabulary, the merges, or which ids are special (control) tokens."""
        serialized = self._serialized()
        if serialized is not None and serialized == other._serialized() and self._special_ids() == other._special_ids():
            return None  # the same tokenizer file, byte for byte: reading vocabularies and merges took 0.4-1.5 s
        mine, theirs = self._real_vocab, other._real_vocab
        if mine != theirs:
            changed = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda item: item[1])
            token, tid = changed[0]
            return f"different vocabularies: {len(mine)} vs {len(theirs)} tokens, first difference at id {tid} ({token!r})"
        if self._merges != other._merges:
            return "the same vocabulary but different merges"
        specials, their_specials = self._special_ids(), other._special_ids()
        if specials != their_specials:
            tid = min(set(specials.items()) ^ set(their_specials.items()))[0]
            return f"different special tokens: id {tid} is {specials.get(tid, 'not special')!r} vs {their_specials.get(tid, 'not special')!r}"
        return None

    def fingerprint(self) -> str:
        """Identity of the vocabulary: two models can speculate for each other only if these agree."""
        vocab = self.hf.get_vocab()
        digest = hashlib.sha256()
        for token, tid in sorted(vocab.items(), key=lambda item: item[1]):
            digest.update(f"{tid}\t{token}\n".encode("utf-8", "surrogatepass"))
        return digest.hexdigest()


# Gemma's turn format, for Gemma tokenizers whose file carries no template: <bos>, then each message as
# <start_of_turn>{user|model}\n{text}<end_of_turn>\n, a system message's text opening the first user turn, and
# <start_of_turn>model\n to ask for the answer.
GEMMA_TURNS_TEMPLATE = (
    "{{ bos_token }}{% set system = namespace(text='') %}"
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{% set system.text = message['content'] | trim + '\n\n' %}{% else %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else 'user' }}\n"
    "{% if message['role'] == 'user' %}{{ system.text }}{% set system.text = '' %}{% endif %}"
    "{{ message['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _has_tokens(hf, *names: str) -> bool:
    ids = [hf.convert_tokens_to_ids(name) for name in names]
    return all(isinstance(i, int) and i >= 0 and i != hf.unk_token_id for i in ids)


def _strings(value):
    """Every string inside nested lists and dicts, keys too (a tool's parameter names are rendered as well)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, dict)):
        for item in value:
            yield from _strings(item)
        if isinstance(value, dict):
            for item in value.values():
                yield from _strings(item)


def _map_strings(value, change):
    """`value` with `change` applied to each string `_strings` yields."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_map_strings(item, change) for item in value]
    if isinstance(value, dict):
        return {change(key) if isinstance(key, str) else key: _map_strings(item, change) for key, item in value.items()}
    return value
