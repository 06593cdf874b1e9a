"""OpenAI request parsing and validation (errors: api_error.py).

Parsing is hand-written rather than pydantic so that every rejection names the offending
parameter in the `param` field and reads like OpenAI's own messages.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from ..controls import LogitControls
from ..drafters.registry import DRAFTER_NAMES
from ..grammar import GrammarSpec
from ..sampling import finite_number
from .api_error import ApiError  # noqa: F401  (re-exported: protocol's parsers raise it)
from .tools import parse_tool_options, tool_constraint, tool_message

CHAT_ROLES = {"system", "user", "assistant", "developer", "tool"}
MAX_STOP_STRINGS = 16
MAX_SEED = 2**63 - 1
MAX_TEMPERATURE = 2.0  # OpenAI's range
MAX_LOGIT_BIAS = 1024  # entries of logit_bias
MAX_TOKEN_ID_DIGITS = 10  # a logit_bias key longer than this is no token id
MAX_TOP_LOGPROBS = {"chat": 20, "completion": 5}  # OpenAI's bounds
MAX_CHOICES = 128  # OpenAI's bound on n; a server allows at most its batch size (app.py)
# OpenAI's bounds on `metadata`: Responses echo and store it, so its size must be the server's to bound.
MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512

# One rule for the fields of a request body (README, "Request fields"):
# - implemented (OpenAI's and the extensions peers accept: top_k, min_p, repetition_penalty, speculative): used;
# - OpenAI's that change nothing a client can observe here (routing hints; metadata, which Responses only echo and
#   store): accepted and ignored, metadata checked against OpenAI's bounds (check_metadata);
# - OpenAI's that are not implemented: 400 unsupported_parameter naming the field, when set to anything but
#   their default;
# - any other name: 400 unknown_parameter, so that a typo or another server's extension is never silently ignored.
IMPLEMENTED = {
    "common": {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream",
               "stream_options", "user", "n", "presence_penalty", "frequency_penalty", "repetition_penalty",
               "logit_bias", "logprobs", "speculative"},
    "chat": {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools", "tool_choice",
             "parallel_tool_calls"},
    "completion": {"prompt"},
}
IGNORED = {"metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}
UNSUPPORTED_CHAT = {"audio", "modalities", "prediction", "web_search_options", "functions", "function_call",
                    "reasoning_effort", "verbosity"}
UNSUPPORTED_COMPLETION = {"best_of", "echo", "suffix"}


@dataclass
class GenerationRequest:
    """One validated /v1/completions or /v1/chat/completions request."""

    kind: str  # "completion" | "chat"
    model: str
    prompt: str | list[int] | list[dict]  # text, token ids, or chat messages
    max_tokens: int | None = None  # None: the server's default, capped to the room left in the context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    user: str | None = None
    drafter: str | None = None  # None: the server's default drafter
    k: int | str = "auto"
    min_p: float = 0.0
    controls: LogitControls | None = None  # penalties, logit bias, logprobs (None: none of them)
    # chat only (server/tools.py): the function tools rendered into the prompt and whose calls are parsed from the
    # answer (None: none, or tool_choice "none"), tool_choice, and whether several calls may be answered at once
    tools: list[dict] | None = None
    tool_choice: str | dict = "none"
    parallel_tool_calls: bool = True
    grammar: GrammarSpec | None = None  # what the answer must match (response_format, a compulsory tool call)
    n: int = 1  # answers to generate (server/choices.py): choice i samples with seed + i
    prompts: list | None = None  # completions only: OpenAI's batch of prompts, each answered with n choices

    def engine_controls(self) -> LogitControls | None:
        """What the engine applies to each row: the controls with the grammar."""
        if self.grammar is None:
            return self.controls
        return replace(self.controls or LogitControls(), grammar=self.grammar)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        text = repr(value)
        return f"the number {text}" if len(text) <= 40 else f"a number of {len(text)} digits"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _bad(name: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=name, code=code)


def _integer(body: dict, name: str, default, minimum: int | None = None, maximum: int | None = None):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"'{name}' must be an integer, got {_describe(value)}", "invalid_type")
    if minimum is not None and value < minimum:
        raise _bad(name, f"'{name}' must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise _bad(name, f"'{name}' must be <= {maximum}, got {value}")
    return value


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not finite_number(value):
        raise _bad(name, f"'{name}' must be a finite number, got {_describe(value)}", "invalid_type")
    return float(value)


def _boolean(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(name, f"'{name}' must be a boolean, got {_describe(value)}", "invalid_type")
    return value


def _string(body: dict, name: str, default: str | None = None, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise _bad(name, f"you must provide '{name}'", "missing_required_parameter")
        return default
    if not isinstance(value, str):
        raise _bad(name, f"'{name}' must be a string, got {_describe(value)}", "invalid_type")
    return value


def _stop(body: dict) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _bad("stop", f"'stop' must be a string or an array of strings, got {_describe(value)}", "invalid_type")
    if len(value) > MAX_STOP_STRINGS:
        raise _bad("stop", f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(value)}")
    return [s for s in value if s]


def _unset(value) -> bool:
    """An OpenAI field left at its default: absent, null, false, 0, empty, the text-only choices, or "disabled"
    (Responses' truncation)."""
    if value is None or value is False or value in ("", [], {}, ["text"], {"type": "text"}, "disabled"):
        return True
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value in (0, 1)  # n, best_of: 1


def check_metadata(value) -> dict:
    """`metadata` as OpenAI takes it ({} when absent): at most 16 pairs of strings, keys up to 64 characters, values
    up to 512. A 400 naming `metadata` otherwise: it was stored and echoed unchecked (megabytes a response)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad("metadata", f"'metadata' must be an object of strings, got {_describe(value)}", "invalid_type")
    if len(value) > MAX_METADATA_PAIRS:
        raise _bad("metadata", f"'metadata' takes at most {MAX_METADATA_PAIRS} pairs, got {len(value)}")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise _bad("metadata", f"'metadata' keys are at most {MAX_METADATA_KEY_CHARS} characters, got one of"
                       f" {len(key)} ({key[:20]!r}...)")
        if not isinstance(item, str):
            raise _bad("metadata", f"'metadata' values must be strings, got {_describe(item)} for {key!r}", "invalid_type")
        if len(item) > MAX_METADATA_VALUE_CHARS:
            raise _bad("metadata", f"'metadata' values are at most {MAX_METADATA_VALUE_CHARS} characters, got"
                       f" {len(item)} for {key!r}")
    return value


def check_fields(body: dict, implemented: set[str], unsupported: set[str]) -> None:
    """The rule above: refuse what this server would otherwise ignore or do differently (Responses' body too)."""
    for name, value in body.items():
        if name == "metadata":
            check_metadata(value)
        if name in implemented or name in IGNORED:
            continue
        if name in unsupported:
            if _unset(value):
                continue
            raise _bad(name, f"'{name}' is not supported by this server", "unsupported_parameter")
        raise _bad(name, f"unknown parameter '{name}'", "unknown_parameter")


def _speculative(body: dict) -> tuple[str | None, int | str]:
    value = body.get("speculative")
    if value is None:
        return None, "auto"
    if not isinstance(value, dict):
        raise _bad("speculative", f"'speculative' must be an object like {{\"drafter\": \"draft\", \"k\": 4}}, got {_describe(value)}", "invalid_type")
    unknown = set(value) - {"drafter", "k"}
    if unknown:
        raise _bad("speculative", f"unknown field(s) in 'speculative': {', '.join(sorted(unknown))} (use drafter, k)")
    drafter = value.get("drafter")
    if drafter is not None and drafter not in DRAFTER_NAMES:
        raise _bad("speculative.drafter", f"'speculative.drafter' must be one of {', '.join(DRAFTER_NAMES)}, got {drafter!r}")
    k = value.get("k", "auto")
    if k is None:
        k = "auto"
    if k != "auto" and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 64):
        raise _bad("speculative.k", f"'speculative.k' must be \"auto\" or an integer in 0..64, got {k!r}")
    return drafter, k


def _common(body: dict, kind: str, prompt, max_tokens_field: str = "max_tokens") -> GenerationRequest:
    check_fields(body, IMPLEMENTED["common"] | IMPLEMENTED[kind], UNSUPPORTED_CHAT if kind == "chat" else UNSUPPORTED_COMPLETION)
    model = _string(body, "model", required=True)
    n = _integer(body, "n", 1, minimum=1, maximum=MAX_CHOICES)
    temperature = _number(body, "temperature", 1.0)
    if not 0 <= temperature <= MAX_TEMPERATURE:
        raise _bad("temperature", f"'temperature' must be in 0..{MAX_TEMPERATURE:g}, got {temperature}")
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise _bad("top_p", f"'top_p' must be in (0, 1], got {top_p}")
    stream = _boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options", f"'stream_options' must be an object, got {_describe(options)}", "invalid_type")
    include_usage = (options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise _bad("stream_options.include_usage", "'stream_options.include_usage' must be a boolean, got"
                   f" {_describe(include_usage)}", "invalid_type")
    drafter, k = _speculative(body)
    return GenerationRequest(
        kind=kind,
        model=model,
        prompt=prompt,
        max_tokens=_integer(body, max_tokens_field, None, minimum=1),
        temperature=temperature,
        top_p=top_p,
        top_k=_integer(body, "top_k", 0, minimum=0),
        seed=_integer(body, "seed", None, minimum=0, maximum=MAX_SEED),
        stop=_stop(body),
        stream=stream,
        include_usage=bool(include_usage),
        user=_string(body, "user"),
        drafter=drafter,
        k=k,
        min_p=_bounded(body, "min_p", 0.0, 0.0, 1.0),
        controls=_controls(body, kind),
        grammar=_response_format(body) if kind == "chat" else None,
        n=n,
    )


def _bounded(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = _number(body, name, default)
    if not low <= value <= high:
        raise _bad(name, f"'{name}' must be in {low:g}..{high:g}, got {value:g}")
    return value


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _bad("logit_bias", f"'logit_bias' must be an object of token ids to numbers, got {_describe(value)}",
                   "invalid_type")
    if len(value) > MAX_LOGIT_BIAS:
        raise _bad("logit_bias", f"'logit_bias' takes at most {MAX_LOGIT_BIAS} tokens, got {len(value)}")
    out = []
    for key, bias in value.items():
        # a length bound before int(): past 4300 digits int() raises, and no vocabulary has 10-digit token ids
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= MAX_TOKEN_ID_DIGITS):
            raise _bad("logit_bias", f"'logit_bias' keys must be token ids, got {key[:40]!r}")
        if not finite_number(bias) or not -100 <= bias <= 100:
            raise _bad("logit_bias", f"'logit_bias' values must be numbers in -100..100, got {_describe(bias)} for {key}")
        out.append((int(key), float(bias)))
    return tuple(sorted(out))


def _logprobs(body: dict, kind: str) -> int | None:
    """How many alternatives to report per token (None: no log-probabilities)."""
    most = MAX_TOP_LOGPROBS[kind]
    if kind == "completion":  # an integer 0..5, the alternatives
        return _integer(body, "logprobs", None, minimum=0, maximum=most)
    top = _integer(body, "top_logprobs", None, minimum=0, maximum=most)
    if not _boolean(body, "logprobs", False):
        if top:
            raise _bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
        return None
    return top or 0


def _response_format(body: dict) -> GrammarSpec | None:
    value = body.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise _bad("response_format", "'response_format' must be an object with a 'type'", "invalid_type")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object", "")
    if kind != "json_schema":
        raise _bad("response_format.type", f"'response_format.type' must be text, json_object or json_schema, got {kind!r}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise _bad("response_format.json_schema", "'response_format.json_schema' must be an object with a 'schema' object",
                   "invalid_type")
    return GrammarSpec("json_schema", json.dumps(spec.get("schema", {})))


def _controls(body: dict, kind: str) -> LogitControls | None:
    penalties = {name: _bounded(body, name, 0.0, -2.0, 2.0) for name in ("presence_penalty", "frequency_penalty")}
    repetition = _number(body, "repetition_penalty", 1.0)
    if not 0 < repetition <= 10:
        raise _bad("repetition_penalty", f"'repetition_penalty' must be in (0, 10], got {repetition:g}")
    controls = LogitControls(**penalties, repetition_penalty=repetition, logit_bias=_logit_bias(body),
                             logprobs=_logprobs(body, kind))
    return None if controls == LogitControls() else controls


def parse_json_body(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not valid UTF-8 (bad byte at offset {exc.start})", code="invalid_encoding") from None
    if not text.strip():
        raise ApiError(400, "the request body is empty; send a JSON object", code="invalid_json")

    def no_constants(name: str):
        raise ValueError(f"{name} is not valid JSON")

    try:
        body = json.loads(text, parse_constant=no_constants)
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the request body nests JSON too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {_describe(body)}", code="invalid_json")
    try:  # a \ud800-style escape decodes to a lone surrogate, which no tokenizer or response can encode
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "the request body holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape)",
                       code="invalid_encoding") from None
    except RecursionError:
        raise ApiError(400, "the request body nests JSON too deeply", code="invalid_json") from None
    return body


def _is_token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_completion(body: dict) -> GenerationRequest:
    prompt = body.get("prompt")
    if prompt is None:
        raise _bad("prompt", "you must provide 'prompt'", "missing_required_parameter")
    prompts = None
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        # a batch: strings, or arrays of token ids, not the two mixed (OpenAI's types)
        if not (all(isinstance(p, str) for p in prompt) or all(_is_token_ids(p) for p in prompt)):
            raise _bad("prompt", "a batch of prompts must be all strings or all arrays of token ids", "invalid_type")
        prompts, prompt = (prompt if len(prompt) > 1 else None), prompt[0]
    if not (isinstance(prompt, str) or _is_token_ids(prompt)):
        raise _bad("prompt", f"'prompt' must be a string, an array of token ids, or an array of either, got"
                   f" {_describe(prompt)}", "invalid_type")
    request = _common(body, "completion", prompt)
    request.prompts = prompts
    return request


def _message_text(content, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text is supported
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _bad(f"messages[{index}].content", "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(f"messages[{index}].content", f"message content must be a string, got {_describe(content)}", "invalid_type")


def parse_chat(body: dict) -> GenerationRequest:
    messages = body.get("messages")
    if messages is None:
        raise _bad("messages", "you must provide 'messages'", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", f"'messages' must be a non-empty array of messages, got {_describe(messages)}", "invalid_type")
    cleaned = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f"messages[{index}]", f"each message must be an object, got {_describe(message)}", "invalid_type")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise _bad(f"messages[{index}].role", f"message role must be one of {', '.join(sorted(CHAT_ROLES))}, got {role!r}")
        if role == "tool" or (role == "assistant" and message.get("tool_calls") is not None):
            cleaned.append(tool_message(message, index, _message_text))
            continue
        content = message.get("content")
        if content is None:
            raise _bad(f"messages[{index}].content", "each message needs 'content'", "missing_required_parameter")
        cleaned.append({"role": "system" if role == "developer" else role, "content": _message_text(content, index)})
    field_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    request = _common(body, "chat", cleaned, field_name)
    request.tools, request.tool_choice, request.parallel_tool_calls = parse_tool_options(body)
    calls = tool_constraint(request.tools, request.tool_choice, request.parallel_tool_calls)
    if calls is not None:
        if request.grammar is not None:
            raise _bad("response_format", "a required tool_choice already constrains the answer; drop 'response_format'")
        request.grammar = calls
    return request
