"""OpenAI's Responses API over the chat route: POST /v1/responses, GET and DELETE /v1/responses/{id}.

A request becomes a chat request: the instructions as the system message, the messages of the stored chain
(`previous_response_id`) and the new input items, tools and tool_choice in the chat shape; protocol.parse_chat
checks it and the same backend generates it. The conversation so reaches the engine as the chat it is, so the
engine reuses its cached prefix and copies from earlier answers as it does for any chat.

Stored responses (store: true, the default) live in this process's memory, per client namespace (the key id,
peer address and, on a server without keys, the bearer token: http_parts.request_namespace without `user`). Each
client (its fair-queue lane: key id and peer address, whatever token it shows) holds at most `per_client` responses
and `per_client_bytes` of them, its oldest dropped first; past `total` or `total_bytes` in all, the oldest of the
client holding the most goes, so that no client, however many tokens it mints, can push out another's. A response
echoes what was read from its request (metadata within OpenAI's bounds, the tools and format as parsed), not the
client's bytes. Another namespace's id is not found, exactly as an id that never
existed.
"""
from __future__ import annotations

import itertools
import json
import re
import time
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from fastapi import FastAPI, Request

from ..grammar import GrammarSpec
from .protocol import ApiError, GenerationRequest, check_fields, check_metadata, parse_chat
from .shaping import parsed_off_the_loop_if_long
from .tools import ToolCallStream, function_definition, parse_tool_calls

INPUT_ROLES = {"user", "system", "developer", "assistant"}
# The body's fields under chat's rule (protocol.check_fields): these are used; chat's extensions (and stop) pass
# through to the chat request as they are; OpenAI's that are not implemented here are a 400 unless left at their
# default (a background run, a stored conversation, logprobs, truncation "auto", ...); any other name is a 400.
RESPONSES_FIELDS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "seed", "stream",
                    "previous_response_id", "tools", "tool_choice", "parallel_tool_calls", "text", "user", "speculative"}
CHAT_EXTENSIONS = ("top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "stop")
UNSUPPORTED_RESPONSES = {"background", "conversation", "include", "top_logprobs", "truncation", "prompt",
                         "max_tool_calls", "reasoning", "stream_options"}
TEXT_PARTS = {"input_text", "output_text"}


@dataclass
class ChatHost:
    """What the chat app lends this route: its checks, its namespaces and its generation runner."""

    model_name: str
    check_api_key: Callable  # (request) -> key id
    read_body: Callable  # async (request) -> dict
    namespace_of: Callable  # (request, key id, user) -> namespace
    client_of: Callable  # (request, key id) -> whose quota: the fair queue's lane (key id, peer address)
    run_generation: Callable  # async (request, GenerationRequest, key id, answer, stream) -> response
    gather: Callable  # async (ticket, watch) -> shaping.Gathered


@dataclass
class Stored:
    namespace: str
    response: dict
    messages: list[dict]  # the conversation in chat shape, answer included, instructions not
    client: str = ""  # whose quota it counts against (the fair-queue lane): a client's namespaces share one
    size: int = 0  # what it holds, in characters of JSON (ResponseStore.put measures it)


def stored_size(item: Stored) -> int:
    """An item's size as the store counts it: the JSON of its response and its conversation. A chain's turns share
    their history's objects, so this overcounts a chain: the bound errs towards keeping less."""
    return len(json.dumps([item.response, item.messages], ensure_ascii=False))


@dataclass
class ResponseStore:
    """Bounded in count and in size, per client and in all: a count alone let one client pin gigabytes (r3: 3.9 MB
    of metadata in each of 100 one-token responses, and 2,000 in all)."""

    per_client: int = 100
    total: int = 2000
    per_client_bytes: int = 64 * 2**20
    total_bytes: int = 512 * 2**20
    _items: OrderedDict = field(default_factory=OrderedDict)  # id -> Stored, oldest first
    bytes_held: int = 0

    def get(self, namespace: str, response_id) -> Stored | None:
        item = self._items.get(response_id) if isinstance(response_id, str) else None
        return item if item is not None and item.namespace == namespace else None

    def put(self, response_id: str, item: Stored) -> None:
        """Stores `item`; then the client's oldest go while it holds more than its share (never the item just put),
        and while the store holds more than its total, the oldest of the client holding the most."""
        item.size = stored_size(item)
        self._drop(response_id)
        self._items[response_id] = item
        self.bytes_held += item.size
        mine = [key for key, held in self._items.items() if held.client == item.client]  # oldest first
        mine_bytes = sum(self._items[key].size for key in mine)
        while len(mine) > 1 and (len(mine) > self.per_client or mine_bytes > self.per_client_bytes):
            oldest = mine.pop(0)
            mine_bytes -= self._items[oldest].size
            self._drop(oldest)
        while len(self._items) > self.total or self.bytes_held > self.total_bytes:
            self._drop_oldest_of_the_fullest(by_size=self.bytes_held > self.total_bytes)

    def _drop_oldest_of_the_fullest(self, by_size: bool) -> None:
        """Room made by the client holding the most, in bytes or in responses, whichever bound is passed (of equals,
        the one with the oldest item): a client can push out only its own responses while it holds more than others."""
        held = Counter()  # in the order of each client's oldest item
        for item in self._items.values():
            held[item.client] += item.size if by_size else 1
        fullest = max(held, key=held.get)
        self._drop(next(key for key, item in self._items.items() if item.client == fullest))

    def _drop(self, response_id: str) -> None:
        item = self._items.pop(response_id, None)
        if item is not None:
            self.bytes_held -= item.size

    def delete(self, namespace: str, response_id: str) -> bool:
        if self.get(namespace, response_id) is None:
            return False
        self._drop(response_id)
        return True


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_found(response_id) -> ApiError:
    return ApiError(404, f"no response with id '{str(response_id)[:100]}' is stored", param="previous_response_id",
                    code="previous_response_not_found")


# ---------------------------------------------------------------------- the request, as a chat
def _text(content, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)):
                raise _bad(f"{param}[{index}]", "only text content parts ({\"type\": \"input_text\" or \"output_text\","
                           " \"text\": ...}) are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(param, "content must be a string or an array of text parts", "invalid_type")


def input_messages(value, origins: list[dict] | None = None) -> list[dict]:
    """The `input` (a string, or a list of items) as chat messages. `origins` gets, for each message, the input
    item it came from and those of its tool calls ({"item": i, "calls": [j, ...]}): input_param reads them."""
    origins = [] if origins is None else origins
    if isinstance(value, str):
        origins.append({"item": None, "calls": []})
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise _bad("input", "'input' must be a string or a non-empty array of items",
                   "missing_required_parameter" if value is None else "invalid_type")
    messages = []
    for index, item in enumerate(value):
        param = f"input[{index}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            if item.get("role") not in INPUT_ROLES:
                raise _bad(f"{param}.role", f"role must be one of {', '.join(sorted(INPUT_ROLES))}, got {item.get('role')!r}")
            messages.append({"role": item["role"], "content": _text(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call = _function_call(item, param)
            if messages and messages[-1]["role"] == "assistant":  # the calls of one turn join its text
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{param}.call_id", "a function_call_output needs 'call_id'", "missing_required_parameter")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{param}.output")})
        else:
            raise _bad(f"{param}.type" if isinstance(item, dict) else param, "input items must be messages,"
                       f" function_call or function_call_output items, got {kind!r}")
        if len(messages) > len(origins):
            origins.append({"item": index, "calls": []})
        if kind == "function_call":
            origins[-1]["calls"].append(index)
    return messages


def _function_call(item: dict, param: str) -> dict:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str):
            raise _bad(f"{param}.{name}", f"a function_call item needs '{name}' (a string)", "missing_required_parameter")
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}


def chat_tools(body: dict) -> tuple[list | None, object]:
    """Responses' flat function tools and tool_choice in the chat shape."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if isinstance(tools, list):
        converted = []
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                raise _bad(f"tools[{index}].type", "only function tools are supported (\"type\": \"function\")")
            converted.append({"type": "function", "function": function_definition(tool, f"tools[{index}]")})
        tools = converted
    if isinstance(choice, dict) and choice.get("type") == "function":
        if not isinstance(choice.get("name"), str):
            raise _bad("tool_choice.name", "a function tool_choice needs 'name'", "missing_required_parameter")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tools, choice


def text_format(body: dict) -> GrammarSpec | None:
    """`text.format` as the grammar chat's response_format maps to."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise _bad("text", "'text' must be an object like {\"format\": {\"type\": \"text\"}}", "invalid_type")
    spec = text.get("format")
    if spec is None or (isinstance(spec, dict) and spec.get("type") == "text"):
        return None
    if not isinstance(spec, dict):
        raise _bad("text.format", "'text.format' must be an object", "invalid_type")
    if spec.get("type") == "json_object":
        return GrammarSpec("json_object", "")
    if spec.get("type") != "json_schema":
        raise _bad("text.format.type", f"'text.format.type' must be text, json_object or json_schema, got {spec.get('type')!r}")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise _bad("text.format.name", "a json_schema format needs 'name'", "missing_required_parameter")
    if not isinstance(spec.get("schema"), dict):
        raise _bad("text.format.schema", "a json_schema format needs 'schema' (a JSON schema object)", "missing_required_parameter")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise _bad("text.format.strict", "'text.format.strict' must be a boolean", "invalid_type")
    return GrammarSpec("json_schema", json.dumps(spec["schema"], ensure_ascii=False))


CHAT_PARAMS = [(re.compile(r"^messages.*"), "input"), (re.compile(r"^max_(completion_)?tokens$"), "max_output_tokens"),
               (re.compile(r"^(tools\[\d+\])\.function\."), r"\1."), (re.compile(r"^tool_choice\.function\."), "tool_choice."),
               (re.compile(r"^response_format"), "text.format")]


# Chat's names for the fields of one message (server-made names, not client text)
MESSAGE_PARAM = re.compile(r"messages\[(\d+)\](.*)")
CALL_PARAM = re.compile(r"\.tool_calls\[(\d+)\](?:\.function)?(.*)")


def input_param(param: str, origins: list[dict], first: int) -> str:
    """Chat's `messages[k]...` as the Responses body names the field: `input[i]...` for the input item the message
    came from (`input[j].arguments` for its tool call's), where message `first` is the first from `input` (the
    instructions and a stored chain come before); else `input`."""
    match = MESSAGE_PARAM.fullmatch(param)
    index = int(match[1]) - first if match else -1
    if not 0 <= index < len(origins) or origins[index]["item"] is None:
        return "input"
    origin, rest = origins[index], match[2]
    call = CALL_PARAM.fullmatch(rest)
    if call:
        number = int(call[1])
        return f"input[{origin['calls'][number]}]{call[2]}" if number < len(origin["calls"]) else "input"
    return f"input[{origin['item']}]{rest.replace('.tool_call_id', '.call_id')}"


def as_responses_error(exc: ApiError, origins: list[dict] | None = None, first: int = 0) -> ApiError:
    """A chat error with its param named as the Responses body names the field; wherever it was raised (parsing,
    tokenizing, the engine's limits). With the messages' `origins` (input_messages), a message's field keeps its
    item's index."""
    if exc.param and exc.param.startswith("messages[") and origins is not None:
        exc.param = input_param(exc.param, origins, first)
    for pattern, name in CHAT_PARAMS:
        exc.param = pattern.sub(name, exc.param) if exc.param else exc.param
    return exc


def chat_request(body: dict, history: list[dict]) -> tuple[GenerationRequest, list[dict]]:
    """(the generation request, the conversation without instructions) of a Responses body."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("instructions", "'instructions' must be a string", "invalid_type")
    for name in ("store", "stream", "parallel_tool_calls"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise _bad(name, f"'{name}' must be a boolean", "invalid_type")
    check_fields(body, RESPONSES_FIELDS | set(CHAT_EXTENSIONS), UNSUPPORTED_RESPONSES)
    origins = []
    conversation = history + input_messages(body.get("input"), origins)
    first = len(history) + (1 if instructions else 0)  # the first message from `input`
    tools, choice = chat_tools(body)
    chat = {"model": body.get("model"), "messages": ([{"role": "system", "content": instructions}] if instructions else [])
            + conversation, "max_completion_tokens": body.get("max_output_tokens"), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "seed": body.get("seed"), "stream": body.get("stream"), "user": body.get("user"),
            "speculative": body.get("speculative"), "tools": tools, "tool_choice": choice,
            "parallel_tool_calls": body.get("parallel_tool_calls"), **{name: body.get(name) for name in CHAT_EXTENSIONS}}
    try:
        gen = parse_chat({key: value for key, value in chat.items() if value is not None})
    except ApiError as exc:
        raise as_responses_error(exc, origins, first) from None
    grammar = text_format(body)
    if grammar is not None:
        if gen.grammar is not None:
            raise _bad("text.format", "a required tool_choice already constrains the answer; drop 'text.format'")
        gen.grammar = grammar
    return gen, conversation


# ---------------------------------------------------------------------- the answer
def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    return {"type": "message", "id": item_id or _id("msg_"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(call: dict, status: str = "completed") -> dict:
    return {"type": "function_call", "id": _id("fc_"), "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


def output_items(text: str, gen: GenerationRequest, status: str) -> list[dict]:
    if not gen.tools:
        return [message_item(text, status)]
    content, calls = parse_tool_calls(text, gen.tools, gen.parallel_tool_calls)
    items = [message_item(content, status)] if content or not calls else []
    return items + [call_item(call) for call in calls]


def answer_message(output: list[dict]) -> dict:
    """The output items as the assistant's chat message, for the next turn of the conversation."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    return {"role": "assistant", "content": text or None, "tool_calls": calls} if calls else {"role": "assistant", "content": text}


# What a response echoes of its request is what was read from it, not the client's bytes as sent: the response is
# stored, and fields the parser skips (a tool's or a format's unknown keys) were stored whatever their size.
def echoed_tools(body: dict) -> list[dict]:
    tools, _ = chat_tools(body)
    return [{"type": "function", **tool["function"]} for tool in tools or ()]


def echoed_tool_choice(body: dict, gen: GenerationRequest):
    choice = body.get("tool_choice")
    if isinstance(gen.tool_choice, dict):
        return {"type": "function", "name": gen.tool_choice["function"]["name"]}
    return choice if isinstance(choice, str) else gen.tool_choice


def echoed_format(body: dict) -> dict:
    spec = body["text"].get("format") if isinstance(body.get("text"), dict) else None
    if not isinstance(spec, dict) or spec.get("type") not in ("json_object", "json_schema"):
        return {"type": "text"}
    return {key: spec[key] for key in ("type", "name", "description", "schema", "strict") if key in spec}


class ResponseShape:
    """One response's fixed fields (echoed from the request) and the object around its output."""

    def __init__(self, body: dict, gen: GenerationRequest, model_name: str):
        self.id = _id("resp_")
        self.created_at = int(time.time())
        self.fields = {
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "model": model_name, "parallel_tool_calls": gen.parallel_tool_calls,
            "previous_response_id": body.get("previous_response_id"), "store": body.get("store", True) is not False,
            "temperature": gen.temperature, "top_p": gen.top_p, "text": {"format": echoed_format(body)},
            "tool_choice": echoed_tool_choice(body, gen), "tools": echoed_tools(body), "truncation": "disabled",
            "user": body.get("user"), "metadata": dict(check_metadata(body.get("metadata"))),
        }

    def object(self, status: str, output: list[dict], stats: dict | None = None) -> dict:
        usage = None
        if stats is not None:
            usage = {"input_tokens": stats["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
                     "output_tokens": stats["generated_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": stats["prompt_tokens"] + stats["generated_tokens"]}
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                **self.fields, "output": output, "usage": usage}


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


class ResponseEvents:
    """Server-sent events of the Responses API for one answer: output items (a message, function calls) opened,
    filled and closed as the steps bring text and tool-call deltas."""

    def __init__(self, gen: GenerationRequest, shape: ResponseShape):
        self.shape = shape
        self.numbers = itertools.count()
        self.output: list[dict] = []  # the output items so far
        self.message: dict | None = None  # the message item open, if one is
        self.calls = ToolCallStream(gen.parallel_tool_calls, gen.tools) if gen.tools else None

    def event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": next(self.numbers), **fields}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def open_message(self) -> list[str]:
        self.message = message_item("", "in_progress")
        self.message["content"] = []
        self.output.append(self.message)
        index = len(self.output) - 1
        return [self.event("response.output_item.added", output_index=index, item=self.message),
                self.event("response.content_part.added", item_id=self.message["id"], output_index=index,
                           content_index=0, part={"type": "output_text", "text": "", "annotations": []})]

    def close_message(self, status: str) -> list[str]:
        index, text = self.output.index(self.message), self.message.pop("text", "")
        done = message_item(text, status, self.message["id"])
        self.output[index], part = done, done["content"][0]
        self.message = None
        return [self.event("response.output_text.done", item_id=done["id"], output_index=index, content_index=0,
                           text=text, logprobs=[]),
                self.event("response.content_part.done", item_id=done["id"], output_index=index, content_index=0,
                           part=part),
                self.event("response.output_item.done", output_index=index, item=done)]

    def on_text(self, text: str) -> list[str]:
        events = self.open_message() if self.message is None else []
        self.message["text"] = self.message.get("text", "") + text
        return events + [self.event("response.output_text.delta", item_id=self.message["id"],
                                    output_index=self.output.index(self.message), content_index=0, delta=text,
                                    logprobs=[])]

    def on_call(self, call: dict) -> list[str]:
        if "id" in call:  # a call begins: the text before it is done
            events = self.close_message("completed") if self.message is not None else []
            item = call_item(self.calls.completed[call["index"]], "in_progress")
            item["arguments"] = ""
            self.output.append(item)
            return events + [self.event("response.output_item.added", output_index=len(self.output) - 1, item=item)]
        item, index = self.output[-1], len(self.output) - 1  # its arguments, whole: the call is done
        item.update(arguments=call["function"]["arguments"], status="completed")
        return [self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                           delta=item["arguments"]),
                self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                           name=item["name"], arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=item)]

    def on_step(self, step) -> list[str]:
        if self.calls is not None:
            deltas = self.calls.feed(step.text) + (self.calls.finish() if step.finished else [])
        else:
            deltas = [{"content": step.text}] if step.text else []
        events = []
        for delta in deltas:
            events += self.on_text(delta["content"]) if "content" in delta else self.on_call(delta["tool_calls"][0])
        return events

    def finish(self, step) -> tuple[dict, list[str]]:
        """The whole response, and the events that close it."""
        status = status_of(step.finish_reason)
        events = self.open_message() if not self.output else []  # an empty answer is still a message
        if self.message is not None:
            events += self.close_message(status)
        response = self.shape.object(status, self.output, step.stats)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return response, events + [self.event(kind, response=response)]


async def stream_events(ticket, gen: GenerationRequest, shape: ResponseShape, finished: Callable):
    """Server-sent events of the Responses API; `finished(response)` when the answer is whole."""
    events = ResponseEvents(gen, shape)
    yield events.event("response.created", response=shape.object("in_progress", []))
    yield events.event("response.in_progress", response=shape.object("in_progress", []))
    while True:
        kind, step = await ticket.next()
        if kind == "error":
            error = as_responses_error(step).body()["error"]
            yield events.event("error", code=error["code"], message=error["message"], param=error["param"])
            return
        for text in events.on_step(step):
            yield text
        if step.finished:
            break
    response, closing = events.finish(step)
    finished(response)
    for text in closing:
        yield text


# ---------------------------------------------------------------------- the routes
def register_responses(app: FastAPI, host: ChatHost, store: ResponseStore | None = None) -> ResponseStore:
    store = store if store is not None else ResponseStore()
    app.state.responses = store

    def owner(request: Request) -> str:
        """Whose stored responses a request sees: its namespace, `user` aside (one client's users share it)."""
        return host.namespace_of(request, host.check_api_key(request), None)

    @app.post("/v1/responses")
    async def create_response(request: Request):
        key_id = host.check_api_key(request)
        body = await host.read_body(request)
        namespace, client = host.namespace_of(request, key_id, None), host.client_of(request, key_id)
        history = []
        previous = body.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                raise _bad("previous_response_id", "'previous_response_id' must be a string", "invalid_type")
            stored = store.get(namespace, previous)
            if stored is None:
                raise not_found(previous)
            history = stored.messages
        gen, conversation = chat_request(body, history)
        shape = ResponseShape(body, gen, host.model_name)

        def finished(response: dict) -> None:
            if shape.fields["store"]:
                store.put(response["id"], Stored(namespace, response, conversation + [answer_message(response["output"])],
                                                 client))

        async def answer(ticket, watch):
            done = await host.gather(ticket, watch)
            status = status_of(done.last.finish_reason)
            output = await parsed_off_the_loop_if_long(done.text, output_items, done.text, gen, status)
            response = shape.object(status, output, done.last.stats)
            finished(response)
            return response

        try:
            return await host.run_generation(request, gen, key_id, answer,
                                             lambda ticket: stream_events(ticket, gen, shape, finished))
        except ApiError as exc:  # raised by the tokenizing or the engine's checks, named in chat's terms
            raise as_responses_error(exc) from None

    @app.get("/v1/responses/{response_id}")
    async def get_response(request: Request, response_id: str):
        stored = store.get(owner(request), response_id)
        if stored is None:
            raise ApiError(404, f"no response with id '{response_id[:100]}' is stored", param="response_id", code="not_found")
        return stored.response

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(request: Request, response_id: str):
        if not store.delete(owner(request), response_id):
            raise ApiError(404, f"no response with id '{response_id[:100]}' is stored", param="response_id", code="not_found")
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    return store
