"""/v1/responses on the real server with the openai client: a conversation chained by previous_response_id, the
streamed events, stored responses kept per client namespace, and bad input answered 4xx with its param."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from specdecode.server.protocol import ApiError
from specdecode.server.responses import ResponseStore, Stored, chat_request

from .conftest import MODEL

SHORT = {"temperature": 0, "max_output_tokens": 8}


def other_client(live_server, key: str):
    """A client with another bearer token: on a server without keys, another namespace."""
    return openai.OpenAI(base_url=live_server.api_url, api_key=key, max_retries=0, timeout=120)


def test_three_turns_chained_by_previous_response_id(client):
    first = client.responses.create(model=MODEL, input="Name a colour.", instructions="Answer briefly.", **SHORT)
    assert first.id.startswith("resp_") and first.object == "response" and first.status in ("completed", "incomplete")
    assert isinstance(first.output_text, str) and first.output_text
    assert first.output[0].type == "message" and first.output[0].role == "assistant"
    usage = first.usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens and 0 < usage.output_tokens <= 8
    second = client.responses.create(model=MODEL, input="And another?", previous_response_id=first.id, **SHORT)
    third = client.responses.create(model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": "One more."}]}],
                                    previous_response_id=second.id, **SHORT)
    assert second.previous_response_id == first.id and third.previous_response_id == second.id
    # each turn's prompt holds the turns before it, answers included
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    assert client.responses.retrieve(third.id).output_text == third.output_text


def test_the_answer_is_the_chat_answer(client):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a fruit."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    response = client.responses.create(model=MODEL, instructions="Answer briefly.", input="Name a fruit.", store=False, **SHORT)
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    with pytest.raises(openai.NotFoundError):  # store=False: nothing kept
        client.responses.retrieve(response.id)


def test_chats_extensions_take_effect(client):
    """top_k, min_p, the penalties and stop were dropped in silence; they pass through to the chat request."""
    messages = [{"role": "user", "content": "Count from one to ten in words."}]
    extensions = {"repetition_penalty": 1.3, "top_k": 5, "stop": [" four"]}
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0, extra_body=extensions)
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    response = client.responses.create(model=MODEL, input=messages[0]["content"], store=False, temperature=0,
                                       max_output_tokens=24, extra_body=extensions)
    assert response.output_text == chat.choices[0].message.content != plain.choices[0].message.content


def test_streamed_events(client):
    first = client.responses.create(model=MODEL, input="Say hello.", **SHORT)
    events = list(client.responses.create(model=MODEL, input="Again.", previous_response_id=first.id, stream=True, **SHORT))
    types = [event.type for event in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          events[-1].type]
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas and final.output_text == deltas == events[-4].text
    assert final.previous_response_id == first.id
    assert client.responses.retrieve(final.id).output_text == deltas  # stored once whole


def test_another_namespace_cannot_see_or_chain_or_delete(client, live_server):
    mine = client.responses.create(model=MODEL, input="Say yes.", **SHORT)
    stranger = other_client(live_server, "someone-else")
    with pytest.raises(openai.NotFoundError) as caught:
        stranger.responses.create(model=MODEL, input="Hi", previous_response_id=mine.id, **SHORT)
    never = other_client(live_server, "someone-else")
    with pytest.raises(openai.NotFoundError) as unknown:
        never.responses.create(model=MODEL, input="Hi", previous_response_id="resp_" + "0" * 32, **SHORT)
    # the same answer as for an id that never existed, the id aside: nothing tells whether it exists
    assert caught.value.body["code"] == unknown.value.body["code"] == "previous_response_not_found"
    assert caught.value.body["param"] == "previous_response_id"
    assert caught.value.body["message"].replace(mine.id, "X") == unknown.value.body["message"].replace("resp_" + "0" * 32, "X")
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.delete(mine.id)
    assert client.responses.retrieve(mine.id).id == mine.id
    client.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(mine.id)


GOOD = {"model": MODEL, "input": "hi", "max_output_tokens": 1}


@pytest.mark.parametrize("change, status, param", [
    ({"input": None}, 400, "input"),
    ({"input": 5}, 400, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, 400, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400, "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, 400, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, 400, "input[0].call_id"),
    ({"max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"max_output_tokens": 100_000}, 400, "max_output_tokens"),  # past the context: found later, named in chat's terms
    ({"temperature": 5}, 400, "temperature"),
    ({"instructions": ["x"]}, 400, "instructions"),
    ({"previous_response_id": 7}, 400, "previous_response_id"),
    ({"previous_response_id": "resp_nope"}, 404, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, 400, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}}, 400, "tool_choice.name"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema"),
    ({"text": {"format": {"type": "xml"}}}, 400, "text.format.type"),
    ({"store": "yes"}, 400, "store"),
    ({"model": "gpt-17"}, 404, "model"),
    # Fields the route does not implement were dropped in silence (a 200 that ignored them), where chat answers 400.
    ({"bogus_field": 1}, 400, "bogus_field"),
    ({"background": True}, 400, "background"),
    ({"conversation": "conv_123"}, 400, "conversation"),
    ({"include": ["message.output_text.logprobs"]}, 400, "include"),
    ({"top_logprobs": 5}, 400, "top_logprobs"),
    ({"truncation": "auto"}, 400, "truncation"),
    ({"n": 3}, 400, "n"),
    ({"reasoning": {"effort": "low"}}, 400, "reasoning"),
    ({"presence_penalty": 3}, 400, "presence_penalty"),  # chat's extensions pass through, checked as chat checks them
])
def test_bad_input_is_a_4xx_naming_the_param(live_server, change, status, param):
    body = {key: value for key, value in {**GOOD, **change}.items() if value is not None}
    response = httpx.post(live_server.api_url + "/responses", json=body, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] and error["type"] == "invalid_request_error"


def test_unknown_ids_on_get_and_delete_are_404s(live_server):
    for method in (httpx.get, httpx.delete):
        response = method(live_server.api_url + "/responses/resp_missing", timeout=30)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_items_tools_and_formats_become_the_chat_request():
    body = {"model": MODEL, "instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "22 C"}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 5, "seed": 3, "top_p": 0.5}
    history = [{"role": "user", "content": "Earlier"}, {"role": "assistant", "content": "Reply"}]
    gen, conversation = chat_request(body, history)
    assert [m["role"] for m in gen.prompt] == ["system", "user", "assistant", "system", "user", "assistant", "tool"]
    assert gen.prompt[0]["content"] == "Be brief." and conversation[:2] == history and len(conversation) == 6
    assert gen.prompt[5]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert gen.max_tokens == 5 and gen.seed == 3 and gen.top_p == 0.5
    assert gen.tool_choice == {"type": "function", "function": {"name": "get_weather"}} and gen.grammar.kind == "lark"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    plain = {"model": MODEL, "input": "x"}
    gen, _ = chat_request({**plain, "text": {"format": {"type": "json_schema", "name": "s", "schema": schema, "strict": True}}}, [])
    assert gen.grammar.kind == "json_schema" and json.loads(gen.grammar.source) == schema
    gen, _ = chat_request({**plain, "text": {"format": {"type": "json_object"}}}, [])
    assert (gen.grammar.kind, gen.grammar.source) == ("json_object", "")
    assert chat_request({**plain, "text": {"format": {"type": "text"}}}, [])[0].grammar is None


def test_the_store_keeps_each_client_to_its_bound():
    store = ResponseStore(per_client=2, total=3)
    for index in range(3):
        store.put(f"a{index}", Stored("A", {}, [], client="a"))
    assert store.get("A", "a0") is None and store.get("A", "a2") is not None
    store.put("b0", Stored("B", {}, [], client="b"))
    store.put("b1", Stored("B", {}, [], client="b"))  # four held, two each: the oldest of the older client goes
    assert store.get("A", "a1") is None and store.get("B", "b0") is not None and store.get("A", "a2") is not None
    assert store.get("B", "a2") is None and not store.delete("B", "a2")


def test_a_client_minting_namespaces_pushes_out_only_its_own_responses():
    """The cap was per namespace and the total dropped the oldest of anyone's: on a keyless server a client
    varying its bearer token (a namespace per token) evicted every other client's stored conversations."""
    store = ResponseStore(per_client=5, total=20)
    store.put("victim", Stored("V", {}, [], client="victim"))
    for token in range(20):
        for index in range(5):
            store.put(f"x{token}.{index}", Stored(f"X{token}", {}, [], client="attacker"))
    assert store.get("V", "victim") is not None
    for other in range(18):  # 18 other clients fill the store: the one holding the most (the attacker) makes room
        store.put(f"o{other}", Stored(f"O{other}", {}, [], client=f"other{other}"))
    assert store.get("V", "victim") is not None and len([k for k in store._items if k.startswith("x")]) == 1


def test_metadata_at_openais_bounds_is_echoed_and_stored(live_server):
    metadata = {f"{index:02d}" + "k" * 62: "v" * 512 for index in range(16)}
    created = httpx.post(live_server.api_url + "/responses", json={**GOOD, "metadata": metadata}, timeout=60)
    assert created.status_code == 200 and created.json()["metadata"] == metadata
    stored = httpx.get(live_server.api_url + "/responses/" + created.json()["id"], timeout=30)
    assert stored.json()["metadata"] == metadata


def test_a_response_echoes_its_tools_and_format_as_read_not_as_sent():
    """Keys the parser skips rode along into the stored response, whatever their size."""
    from specdecode.server.responses import ResponseShape

    junk = "x" * 100_000
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    tools = {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "junk": junk}]}
    for body, echoed in [
        ({**GOOD, **tools, "tool_choice": {"type": "function", "name": "f", "junk": junk}},
         {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
          "tool_choice": {"type": "function", "name": "f"}}),
        ({**GOOD, **tools, "text": {"format": {"type": "json_schema", "name": "s", "schema": schema, "junk": junk}}},
         {"text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}, "tool_choice": "auto"}),
    ]:
        fields = ResponseShape(body, chat_request(body, [])[0], MODEL).fields
        assert {name: fields[name] for name in echoed} == echoed and junk not in json.dumps(fields)


def big(client: str, size: int) -> Stored:
    return Stored(client.upper(), {"output": "x" * size}, [], client=client)


def test_the_store_is_bounded_in_bytes_per_client_and_in_all():
    """The store counted responses, not bytes: 100 responses of 4 MB each were all kept (r3)."""
    store = ResponseStore(per_client=100, total=1000, per_client_bytes=1_000_000, total_bytes=3_000_000)
    for index in range(100):
        store.put(f"a{index}", big("a", 300_000))
    assert store.bytes_held <= 1_000_000 and store.get("A", "a99") is not None and store.get("A", "a96") is None
    store.put("huge", big("a", 2_000_000))  # the newest is kept even alone past the bound: its chain goes on
    assert store.get("A", "huge") is not None and store.get("A", "a99") is None
    store.put("victim", big("v", 1000))
    for index in range(30):  # other clients fill the store: whoever holds the most bytes makes room
        store.put(f"o{index}", big(f"o{index % 3}", 400_000))
    assert store.bytes_held <= 3_000_000 and store.get("V", "victim") is not None
    assert sum(item.size for item in store._items.values()) == store.bytes_held
    assert store.delete("V", "victim") and store.bytes_held == sum(item.size for item in store._items.values())


def test_an_input_items_error_keeps_its_index():
    """Chat's checks name messages[k].tool_calls[j].function.arguments; the Responses error said only `input`."""
    history = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "answer"}]
    bad = {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "[1, 2]"}
    items = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "let me call"},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}, bad,
             {"type": "function_call_output", "call_id": "c1", "output": "x"}]
    for instructions in (None, "Be brief."):
        for chain in ([], history):
            body = {"model": MODEL, "input": items, **({"instructions": instructions} if instructions else {})}
            with pytest.raises(ApiError) as caught:
                chat_request(body, chain)
            assert caught.value.param == "input[3].arguments"
    with pytest.raises(ApiError) as caught:
        chat_request({"model": MODEL, "input": [bad]}, [])
    assert caught.value.param == "input[0].arguments"
