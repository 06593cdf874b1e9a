"""Tool calls end to end: qwen2.5-coder-0.5b (a chat template that lists tools) behind the real server, driven by
the openai client: the call, the tool's result sent back, the final answer; streamed and not; and a template
without tools support (smollm2) refused with a 400 naming 'tools'."""
from __future__ import annotations

import json

import openai
import pytest

from .conftest import MODEL, start_server

QWEN = "qwen2.5-coder-0.5b"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris right now?"}]
GREEDY = {"temperature": 0, "max_tokens": 40}


@pytest.fixture(scope="module")
def qwen_client(models):  # `models` sets torch to one thread for the package
    from specdecode.engine import Engine
    from specdecode.models.loader import load_model
    from specdecode.server.app import create_app

    try:
        # float32, not int8: at int8 every draft of these answers matched, and the compulsory-call test passed a
        # verifier broken to keep a wrong first draft token; at float32 some drafts are rejected and it fails.
        target = load_model(QWEN, device="cpu", max_context=1024)
    except Exception as exc:
        pytest.skip(f"{QWEN} is not available: {exc}")
    engine = Engine(target, None, max_context=1024)
    server = start_server(create_app(engine, "lookup", QWEN, queue_size=4), engine)
    yield openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=300)
    server.stop()


def test_call_result_and_final_answer(qwen_client):
    first = qwen_client.chat.completions.create(model=QWEN, messages=QUESTION, tools=[WEATHER], **GREEDY)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert "<tool_call>" not in (choice.message.content or "")

    messages = QUESTION + [choice.message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 23, "sky": "sunny"})}]
    final = qwen_client.chat.completions.create(model=QWEN, messages=messages, tools=[WEATHER], **GREEDY)
    answer = final.choices[0]
    assert not answer.message.tool_calls and answer.finish_reason in ("stop", "length")
    assert "23" in answer.message.content


def test_streamed_calls_match_the_whole_answer(qwen_client):
    whole = qwen_client.chat.completions.create(model=QWEN, messages=QUESTION, tools=[WEATHER], **GREEDY).choices[0]
    content, calls, finish = "", {}, None
    for chunk in qwen_client.chat.completions.create(model=QWEN, messages=QUESTION, tools=[WEATHER], stream=True, **GREEDY):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or ():
            entry = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = part.id or entry["id"]
            entry["name"] += (part.function.name or "") if part.function else ""
            entry["arguments"] += (part.function.arguments or "") if part.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == whole.finish_reason == "tool_calls"
    assert (content or None) == whole.message.content
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_tool_choice_none_answers_in_text(qwen_client):
    choice = qwen_client.chat.completions.create(model=QWEN, messages=QUESTION, tools=[WEATHER], tool_choice="none",
                                                 **GREEDY).choices[0]
    assert not choice.message.tool_calls and choice.finish_reason in ("stop", "length") and choice.message.content


def test_a_template_without_tools_is_a_400_naming_tools(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER], max_tokens=4)
    error = caught.value.body
    assert error["param"] == "tools" and error["code"] == "tools_unsupported" and "tools" in error["message"]


def test_responses_function_call_round_trip_streamed_and_not(qwen_client):
    tool = {"type": "function", **WEATHER["function"]}  # the Responses API's flat shape
    first = qwen_client.responses.create(model=QWEN, input=QUESTION[0]["content"], tools=[tool], temperature=0,
                                         max_output_tokens=40)
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    events = list(qwen_client.responses.create(model=QWEN, input=QUESTION[0]["content"], tools=[tool], temperature=0,
                                               max_output_tokens=40, stream=True))
    types = [event.type for event in events]
    assert "response.function_call_arguments.done" in types and types[-1] == "response.completed"
    streamed = [item for item in events[-1].response.output if item.type == "function_call"]
    assert [(c.name, c.arguments) for c in streamed] == [(call.name, call.arguments)]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temperature_c": 23})}
    final = qwen_client.responses.create(model=QWEN, input=[result], previous_response_id=first.id, tools=[tool],
                                         temperature=0, max_output_tokens=40)
    assert "23" in final.output_text and not [item for item in final.output if item.type == "function_call"]


@pytest.mark.parametrize("sampling", [{**GREEDY, "max_tokens": 80}, {"temperature": 0.9, "seed": 4, "max_tokens": 80}], ids=["greedy", "seeded"])
def test_a_compulsory_call_is_the_same_with_every_drafter(qwen_client, sampling):
    """tool_choice required / named runs as a grammar through the same per-row controls as response_format: every
    drafter gives plain decoding's call and log-probabilities. K is pinned: an adaptive K's stop rule verifies a copy
    only where this machine's pass timings say it pays, and on a CPU where extra rows cost more it kept only copies
    the target then accepted, so nothing was refused and the check below had nothing to see."""
    rejected = 0  # drafts the target refused: without any, a verifier that keeps wrong drafts would pass unseen
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        def call(drafter):
            nonlocal rejected
            completion = qwen_client.chat.completions.create(
                model=QWEN, messages=QUESTION, tools=[WEATHER], tool_choice=choice, logprobs=True,
                extra_body={"speculative": {"drafter": drafter, "k": 4}}, **sampling)
            rejected += completion.usage.model_extra["drafted"] - completion.usage.model_extra["accepted"]
            choice_ = completion.choices[0]
            calls = [(c.function.name, c.function.arguments) for c in choice_.message.tool_calls or []]
            return calls, [(t.token, t.logprob) for t in choice_.logprobs.content], choice_.finish_reason

        plain = call("none")
        assert plain[0] == [("get_weather", "{\"city\": \"Paris\"}")] and plain[2] == "tool_calls"
        for drafter in ("lookup", "suffix", "auto"):
            assert call(drafter) == plain, (drafter, choice)
    assert rejected > 0, "no draft was refused: the equality above never saw the verifier reject anything"


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_off_by_max_tokens_is_no_content(qwen_client, stream):
    """The answer cut inside its <tool_call> block came back as content: the template's markup and half a JSON
    object, shown to the user as the answer. Half a call is neither a call nor content; "length" says it was cut.
    (tool_choice "required": its grammar makes the answer start with the tag, where this small model may call bare.)"""
    answer = qwen_client.chat.completions.create(model=QWEN, messages=QUESTION, tools=[WEATHER], temperature=0,
                                                 tool_choice="required", max_tokens=6, stream=stream)
    content, calls, finish = "", [], None
    for chunk in (answer if stream else [answer]):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        part = choice.delta if stream else choice.message
        content += part.content or ""
        calls += part.tool_calls or []
        finish = choice.finish_reason or finish
    assert finish == "length" and calls == [] and "<tool_call>" not in content and "{" not in content


# A Hermes-format template (the tags as text) on smollm2, whose vocabulary has no <tool_call> token
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these tools:\n<tools>\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}</tools>\nCall one as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
CITY = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_a_compulsory_call_on_a_vocabulary_without_the_tag_tokens(client, live_server, monkeypatch, choice):
    """The grammar named <tool_call> as a token: on any vocabulary without it, tool_choice "required" or a named
    function answered 400 with llguidance's raw error (param null). The tags are now text where the vocabulary
    spells them out; a template with no call format at all is one clear 400 naming tool_choice."""
    monkeypatch.setattr(live_server.engine.tokenizer.hf, "chat_template", HERMES_TEMPLATE)
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[CITY], tool_choice=choice,
                                            temperature=0, max_tokens=40).choices[0]
    [call] = answer.message.tool_calls
    assert answer.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    monkeypatch.setattr(live_server.engine.tokenizer.hf, "chat_template", HERMES_TEMPLATE.replace("tool_call", "call"))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[CITY], tool_choice=choice, max_tokens=4)
    assert refused.value.body["param"] == "tool_choice" and "<tool_call>" in refused.value.body["message"]


def test_health_stays_fast_while_a_blank_fenced_answer_is_parsed(qwen_client):
    """Review turn 5, finding 1 (r1): the model is asked to echo "```json" and thousands of blanks, and the client's
    stop string cuts the closing fence; the bare-call regex then backtracked for ~20 s per choice on the event loop,
    and /health (every client) waited. Now the answer is parsed in linear time, so /health stays fast."""
    import threading
    import time

    from .conftest import poll_get

    blanks = (" " * 600 + "\n") * 6
    request = {"model": QWEN, "temperature": 0, "max_tokens": 300, "stop": ["z```"], "n": 2, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "messages": [
        {"role": "system", "content": "You repeat the user's message exactly, character for character, and nothing else."},
        {"role": "user", "content": "```json" + blanks + "zz```"}]}
    result = {}
    attack = threading.Thread(target=lambda: result.update(answer=qwen_client.chat.completions.create(**request)))
    health, slowest = str(qwen_client.base_url).rstrip("/").removesuffix("/v1") + "/health", 0.0
    assert poll_get(health).status_code == 200  # the polling client's own setup is not the server's time
    attack.start()
    while attack.is_alive():
        start = time.perf_counter()
        assert poll_get(health).status_code == 200
        slowest = max(slowest, time.perf_counter() - start)
        time.sleep(0.1)
    attack.join()
    for choice in result["answer"].choices:  # the answer the attack needs: a fence, then a long run of blanks
        content = choice.message.content
        assert content.startswith("```json") and len(content) - len(content[7:].lstrip()) > 3000, content[:80]
    assert slowest < 1.0
