"""Tool calls (OpenAI function tools) on the chat route: the request's tools checked, the answer's calls parsed
(whole, or as they stream), and the grammar that makes a call compulsory. All knowledge of the call format is here.

The format is Qwen2.5's (Hermes'): the chat template lists the tools, and the model answers a call as
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
with text, if any, before it and further calls after it. `<tool_call>` and `</tool_call>` are tokens of their own.

    tools, choice, parallel = parse_tool_options(body)      # 400s name the field at fault
    content, calls = parse_tool_calls(text)                   # OpenAI's message.tool_calls
    stream = ToolCallStream(); deltas = stream.feed(text) + stream.finish()   # chat chunk deltas
    tool_grammar(tools, "required") -> Lark text (llguidance) | None
"""
from __future__ import annotations

import json
import re
import uuid

from ..grammar import GrammarSpec
from .api_error import ApiError

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
MAX_TOOLS = 128
# An answer that may be a call without the tags (it starts with "{" or FENCE_OPEN) is held until it ends, and is
# then parsed whole; past this many characters it is handed on as text instead. Real bare calls are short.
MAX_BARE_CALL_CHARS = 64 * 1024
FENCE_OPEN = "```json"
# How deep a tool's parameter schema, or a past call's arguments, may nest. Real schemas nest a few levels; the chat
# template renders these recursively, and a few hundred levels overflowed its recursion (a 500).
MAX_NESTING = 64
# The JSON of a call exactly as the template writes one back into the conversation (tojson: ", " and ": ").
CALL_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _kind(value) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(type(value), "null" if value is None else type(value).__name__)


# ---------------------------------------------------------------------- the request
def parse_tool_options(body: dict) -> tuple[list[dict] | None, str | dict, bool]:
    """(tools in the chat shape, tool_choice, parallel_tool_calls) of a chat request body. The tools are None when
    there are none or tool_choice is "none": then the model is not told of them and no call is parsed."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", f"'parallel_tool_calls' must be a boolean, got {_kind(parallel)}", "invalid_type")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise _bad("tool_choice", "'tool_choice' is only allowed when 'tools' are specified")
        return None, "none", parallel
    if not isinstance(tools, list):
        raise _bad("tools", f"'tools' must be an array of tools, got {_kind(tools)}", "invalid_type")
    if len(tools) > MAX_TOOLS:
        raise _bad("tools", f"'tools' takes at most {MAX_TOOLS} tools, got {len(tools)}")
    cleaned = [_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools)]
    names = [tool["function"]["name"] for tool in cleaned]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate:
        raise _bad("tools", f"two tools are named '{duplicate}'")
    choice = _tool_choice("auto" if choice is None else choice, names)
    return (None if choice == "none" else cleaned), choice, parallel


def _tool(tool, param: str) -> dict:
    if not isinstance(tool, dict):
        raise _bad(param, f"each tool must be an object, got {_kind(tool)}", "invalid_type")
    if tool.get("type") != "function":
        raise _bad(f"{param}.type", f"only function tools are supported (\"type\": \"function\"), got {tool.get('type')!r}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _bad(f"{param}.function", f"'{param}.function' must be an object, got {_kind(function)}",
                   "missing_required_parameter" if function is None else "invalid_type")
    return {"type": "function", "function": function_definition(function, f"{param}.function")}


def function_definition(function: dict, param: str) -> dict:
    """A function tool's {name, description, parameters, strict}, checked (Responses' flat tools share it)."""
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise _bad(f"{param}.name", f"'{param}.name' must be 1-64 letters, digits, '_' or '-', got {name!r}")
    out = {"name": name}
    description = function.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise _bad(f"{param}.description", f"'{param}.description' must be a string, got {_kind(description)}", "invalid_type")
        out["description"] = description
    parameters = function.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise _bad(f"{param}.parameters", f"'{param}.parameters' must be a JSON schema object, got {_kind(parameters)}", "invalid_type")
        if nesting(parameters) > MAX_NESTING:
            raise _bad(f"{param}.parameters", f"'{param}.parameters' nests deeper than {MAX_NESTING} levels")
        out["parameters"] = parameters
    strict = function.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise _bad(f"{param}.strict", f"'{param}.strict' must be a boolean, got {_kind(strict)}", "invalid_type")
        out["strict"] = strict
    return out


def nesting(value) -> int:
    """How many lists and objects deep `value` goes (0 for a scalar). A loop, not recursion: it measures what may
    be too deep for recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _tool_choice(choice, names: list[str]) -> str | dict:
    if choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise _bad("tool_choice.function.name", "a named 'tool_choice' needs {\"type\": \"function\", \"function\": {\"name\": ...}}",
                       "missing_required_parameter")
        if name not in names:
            raise _bad("tool_choice.function.name", f"'tool_choice' names '{name}', which is not among 'tools'")
        return {"type": "function", "function": {"name": name}}
    raise _bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or"
               f" {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {json.dumps(choice)[:80]}")


def tool_message(message: dict, index: int, text_of) -> dict:
    """A chat message of role "tool", or an assistant message with `tool_calls`, as the chat template takes it
    (arguments as an object, the convention of Hugging Face's templates). `text_of(content, index)` reads content."""
    param = f"messages[{index}]"
    if message["role"] == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise _bad(f"{param}.tool_call_id", "a message of role 'tool' needs 'tool_call_id' (a string)", "missing_required_parameter")
        if message.get("content") is None:
            raise _bad(f"{param}.content", "each message needs 'content'", "missing_required_parameter")
        return {"role": "tool", "tool_call_id": call_id, "content": text_of(message["content"], index)}
    calls = message["tool_calls"]
    if not isinstance(calls, list):
        raise _bad(f"{param}.tool_calls", f"'tool_calls' must be an array, got {_kind(calls)}", "invalid_type")
    content = message.get("content")
    cleaned = {"role": "assistant", "content": None if content is None else text_of(content, index),
               "tool_calls": [_past_call(call, f"{param}.tool_calls[{number}]") for number, call in enumerate(calls)]}
    return cleaned


def _past_call(call, param: str) -> dict:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise _bad(param, "each tool call must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}", "invalid_type")
    name, arguments = call["function"].get("name"), call["function"].get("arguments")
    if not isinstance(name, str) or not name:
        raise _bad(f"{param}.function.name", "a tool call needs its function's 'name'", "missing_required_parameter")
    if not isinstance(arguments, str):
        raise _bad(f"{param}.function.arguments", f"'arguments' must be a JSON string, got {_kind(arguments)}", "invalid_type")
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
        too_deep = nesting(parsed) > MAX_NESTING  # the chat template renders them recursively
    except ValueError:
        raise _bad(f"{param}.function.arguments", "'arguments' must hold a JSON object") from None
    except RecursionError:  # deeper than the parser goes
        too_deep = True
    if too_deep:
        raise _bad(f"{param}.function.arguments", f"'arguments' nests deeper than {MAX_NESTING} levels")
    if not isinstance(parsed, dict):
        raise _bad(f"{param}.function.arguments", f"'arguments' must hold a JSON object, got {_kind(parsed)}")
    call_id = call.get("id")
    return {"id": call_id if isinstance(call_id, str) else "", "type": "function",
            "function": {"name": name, "arguments": parsed}}


# ---------------------------------------------------------------------- the grammar of a compulsory call
def forces_call(tool_choice: str | dict) -> bool:
    """Whether the answer must be a call ("required", or a named function): a grammar then constrains it."""
    return tool_choice == "required" or isinstance(tool_choice, dict)


def tool_grammar(tools: list[dict] | None, tool_choice: str | dict, parallel: bool = True,
                 tags_are_tokens: bool = True) -> str | None:
    """A grammar (llguidance's Lark dialect) that admits only calls, in the template's format: to any of the tools
    for "required", to the named one for {"type": "function", ...}; one call, or several when `parallel`. None when
    the model chooses ("auto") or must not call ("none"). Arguments follow each tool's parameter schema.
    tags_are_tokens: the tags are tokens of their own (Qwen2.5's vocabulary), named as such; else text, spelled out
    in whatever tokens the vocabulary has (a Hermes-format template on another model: call_format)."""
    if not tools or not forces_call(tool_choice):
        return None
    if isinstance(tool_choice, dict):
        tools = [tool for tool in tools if tool["function"]["name"] == tool_choice["function"]["name"]]
    alternatives = " | ".join(f"call_{index}" for index in range(len(tools)))
    repeat = ' ("\\n" call)*' if parallel else ""
    # A newline may end the calls: after "</tool_call>" the model writes "\n" before ending its turn, and a grammar
    # in which "\n" can only start another call makes it call again and again until max_tokens.
    open_tag, close_tag = (TOOL_OPEN, TOOL_CLOSE) if tags_are_tokens else (json.dumps(TOOL_OPEN), json.dumps(TOOL_CLOSE))
    lines = [f"start: call{repeat} \"\\n\"?",
             f"call: {open_tag} \"\\n\" ({alternatives}) \"\\n\" {close_tag}"]
    for index, tool in enumerate(tools):
        schema = call_schema(tool["function"])
        lines.append(f"call_{index}: %json {json.dumps(schema, ensure_ascii=False)}")
    return "\n".join(lines) + "\n"


def call_schema(function: dict) -> dict:
    """The JSON schema of one call's object: {"name": <this name>, "arguments": <its parameters>}, in that order."""
    parameters = dict(function.get("parameters") or {"type": "object"})
    # definitions move to the root, where the parameters' "#/$defs/..." references now point
    definitions = {key: parameters.pop(key) for key in ("$defs", "definitions") if key in parameters}
    return {"x-guidance": CALL_JSON_STYLE, "type": "object",
            "properties": {"name": {"const": function["name"]}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False, **definitions}


def call_format(tokenizer) -> str:
    """How this model writes a call: "tokens" (its template writes <tool_call>, a token of its own: Qwen2.5), "text"
    (its template writes the tags, its vocabulary spells them out), or "" (its template has no <tool_call> format,
    so no call can be forced in it)."""
    hf = tokenizer.hf
    if TOOL_OPEN not in str(getattr(hf, "chat_template", None) or ""):
        return ""
    ids = [hf.convert_tokens_to_ids(tag) for tag in (TOOL_OPEN, TOOL_CLOSE)]
    return "tokens" if all(i is not None and i != hf.unk_token_id for i in ids) else "text"


def compulsory_call(tools: list[dict], tool_choice: str | dict, parallel: bool, tokenizer) -> GrammarSpec:
    """The grammar of a compulsory call as this model writes calls: every schema checked (seconds for many large
    ones: call it off the event loop), and a 400 naming tool_choice where the model has no call format."""
    check_tool_grammar(tools)
    form = call_format(tokenizer)
    if not form:
        raise _bad("tool_choice", "this model's chat template has no <tool_call> format (Qwen2.5/Hermes), so a call"
                   " cannot be made compulsory; send tool_choice \"auto\" and read the calls the model makes")
    return GrammarSpec("lark", tool_grammar(tools, tool_choice, parallel, tags_are_tokens=form == "tokens"))


def tool_constraint(tools: list[dict] | None, tool_choice: str | dict, parallel: bool = True) -> GrammarSpec | None:
    """The grammar a request with a compulsory call carries (GenerationRequest.grammar), in Qwen2.5's format. The
    scheduler's tokenizing replaces it with compulsory_call's, which checks the schemas (compiling 128 large ones
    takes seconds, which must not run on the event loop nor before the request holds a place in the queue) and
    fits the tags to the model."""
    grammar = tool_grammar(tools, tool_choice, parallel)
    return None if grammar is None else GrammarSpec("lark", grammar)


def check_tool_grammar(tools: list[dict]) -> None:
    """400 naming the tool whose parameter schema the grammar engine (llguidance) cannot compile, if installed.
    Seconds for many large schemas: call it off the event loop."""
    try:
        import llguidance
    except ImportError:
        return
    for index, tool in enumerate(tools):
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(call_schema(tool["function"])))
            failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        except (ValueError, TypeError) as exc:
            failed, messages = True, [str(exc)]
        if failed:
            raise _bad(f"tools[{index}].function.parameters", f"this JSON schema cannot be enforced: {'; '.join(messages)[:300]}")


# ---------------------------------------------------------------------- the answer
def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call(block: str, tools: list[dict] | None = None) -> dict | None:
    """One call as OpenAI answers it ({id, type, function: {name, arguments as JSON text}}), or None when the text
    between the tags is no call the client could send back in its next turn (tool_message takes it): not JSON,
    arguments that are no object or nest too deep, or a name that is none of `tools` (None: any name)."""
    try:
        parsed = json.loads(block)
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str) or not parsed["name"]:
            return None
        arguments = parsed.get("arguments", parsed.get("parameters", {}))
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
        if not isinstance(value, dict) or nesting(value) > MAX_NESTING:
            return None
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
    except (ValueError, RecursionError):  # an answer nested deeper than the parser goes is no call either
        return None
    if tools is not None and parsed["name"] not in {tool["function"]["name"] for tool in tools}:
        return None
    return {"id": new_call_id(), "type": "function", "function": {"name": parsed["name"], "arguments": arguments}}


def _bare_call(text: str, tools: list[dict] | None) -> dict | None:
    """A whole answer that is one call's JSON without the tags (small Qwen models answer so), perhaps in a ```json
    fence, as a call; only when it names one of the tools."""
    if not tools:
        return None
    return _call(_unfenced(text.strip()), tools)


def _unfenced(text: str) -> str:
    """The inside of a ``` or ```json fence around the whole of `text`, stripped; else `text`. String methods, not a
    regex: the answer is the model's, so its length and its whitespace runs are the client's to choose, and the
    regex this replaces (blanks around a lazy group) backtracked in cubic time on them (review turn 5, finding 1)."""
    if len(text) < 6 or not (text.startswith("```") and text.endswith("```")):
        return text
    inside = text[3:-3]
    return (inside[4:] if inside.startswith("json") else inside).strip()


def _tag_begun(text: str, tag: str, start: int) -> int:
    """How many of text[start:]'s last characters may begin `tag` (the next step may complete it)."""
    return next((n for n in range(min(len(tag) - 1, len(text) - start), 0, -1) if text.endswith(tag[:n])), 0)


def parse_tool_calls(text: str, tools: list[dict] | None = None, parallel: bool = True) -> tuple[str | None, list[dict]]:
    """(content, calls) of an answer: the calls of its complete `<tool_call>` blocks, in order, and the text
    outside them, stripped (None when empty). A block that holds no valid call stays text; one cut off (the answer
    ends inside it: max_tokens) is neither; an answer that is a call to one of `tools` without the tags is that call.
    Without `parallel`, the first call only."""
    stream = ToolCallStream(parallel, tools)
    stream.feed(text)
    stream.finish()
    return stream.content(), stream.completed


class ToolCallStream:
    """The answer's text in, chat deltas out: {"content": text} for text outside calls, and for each call
    {"tool_calls": [{"index", "id", "type", "function": {"name", "arguments": ""}}]} then its arguments
    {"tool_calls": [{"index", "function": {"arguments"}}]}. Text that may be the start of `<tool_call>` is held
    until known, and so is whitespace at the ends of the content (what parse_tool_calls strips)."""

    def __init__(self, parallel: bool = True, tools: list[dict] | None = None):
        self.parallel = parallel
        self.tools = tools
        self.holding = bool(tools)  # while the answer so far may be a call without tags: hold it all, in held
        self.held: list[str] = []
        self.held_chars = 0
        self.pending = ""  # the last step's last characters, which may begin the tag looked for (open or close)
        self.inside = False  # a <tool_call> is open: its text so far is in block
        self.block: list[str] = []  # the open block's text, as the steps brought it
        self.spaces: list[str] = []  # whitespace held back: handed on only when more content follows
        self.started = False  # some content handed on
        self.completed: list[dict] = []  # the calls so far, as message.tool_calls holds them
        self._content: list[str] = []

    def content(self) -> str | None:
        return "".join(self._content) or None

    def feed(self, text: str) -> list[dict]:
        """The deltas `text` completes. Offsets, not slices, walk the text, and what a step leaves open is carried as
        at most a tag's length (pending) or as pieces (block): each step costs its own text's length, however long
        the answer (the client chooses it)."""
        if self.holding:
            if self._hold(text):
                return []
            self.holding, text, self.held = False, "".join(self.held), []
        text, self.pending = self.pending + text, ""
        out, pos = [], 0
        while True:
            tag = TOOL_CLOSE if self.inside else TOOL_OPEN
            found = text.find(tag, pos)
            end = found if found >= 0 else len(text) - _tag_begun(text, tag, pos)
            if end > pos and self.inside:
                self.block.append(text[pos:end])
            elif end > pos:
                out += self._text(text[pos:end])
            if found < 0:
                self.pending = text[end:]  # what may be the start of the tag
                return out
            if self.inside:
                out += self._end_block()
            self.inside, pos = not self.inside, found + len(tag)

    def _end_block(self) -> list[dict]:
        """The deltas of a block closed: its call, or itself as text when it holds no call."""
        block, self.block = "".join(self.block), []
        call = _call(block, self.tools)
        if call is None:
            return self._text(TOOL_OPEN + block + TOOL_CLOSE)
        return self._call_deltas(call) if self.parallel or not self.completed else []

    def _hold(self, text: str) -> bool:
        """Holds `text` while the answer so far may be a call without tags: it starts with "{" or "```json" and is
        at most MAX_BARE_CALL_CHARS long (past that it is handed on as text: an answer is never held whole). Kept as
        pieces, and its head read only until it is known, so each step costs its own text's length."""
        if not self.held_chars:
            text = text.lstrip()  # blanks before the answer's first character: every reading strips them
        head_known = self.held_chars >= len(FENCE_OPEN)  # and it was a possible call, or holding would have ended
        self.held.append(text)
        self.held_chars += len(text)
        if self.held_chars > MAX_BARE_CALL_CHARS:
            return False
        if head_known:
            return True
        head = "".join(self.held)[:len(FENCE_OPEN)]  # fewer than len(FENCE_OPEN) characters came before this text
        return head.startswith(("{", FENCE_OPEN)) or FENCE_OPEN.startswith(head)

    def finish(self) -> list[dict]:
        """The deltas of what is held at the end; trailing whitespace is dropped. A call cut off (the answer ends inside
        its block, at max_tokens) is dropped: half a call is no call, and as content it showed clients the template's
        markup and half a JSON object as the answer (the finish reason, "length", says the answer was cut)."""
        if self.holding:
            self.holding, answer, self.held = False, "".join(self.held), []
            call = _bare_call(answer, self.tools)
            if call is not None:
                return self._call_deltas(call)
            return self.feed(answer) + self.finish()
        rest = "" if self.inside else self.pending
        self.pending, self.inside, self.block = "", False, []
        return self._text(rest)

    def _text(self, text: str) -> list[dict]:
        if not self.started:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self.spaces.append(text)  # a list: a long run of blank steps is not copied again at each step
            return []
        piece = "".join(self.spaces) + body
        self.spaces, self.started = [text[len(body):]], True
        self._content.append(piece)
        return [{"content": piece}]

    def _call_deltas(self, call: dict) -> list[dict]:
        index = len(self.completed)
        self.completed.append(call)
        head = {"index": index, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""}}
        arguments = {"index": index, "function": {"arguments": call["function"]["arguments"]}}
        return [{"tool_calls": [head]}, {"tool_calls": [arguments]}]


def finish_reason(reason: str | None, calls: int) -> str | None:
    """"tool_calls" when the model ended its turn with calls made; a cut-off answer stays "length"."""
    return "tool_calls" if calls and reason == "stop" else reason


def chat_message(text: str, reason: str | None, tools: list[dict], parallel: bool = True) -> tuple[dict, str | None]:
    """The assistant message and finish reason of a whole answer to a request with tools."""
    content, calls = parse_tool_calls(text, tools, parallel)
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message, finish_reason(reason, len(calls))
