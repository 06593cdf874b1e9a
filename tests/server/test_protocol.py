"""Request parsing and validation: no model, no server."""
from __future__ import annotations

import pytest

from specdecode.server.protocol import ApiError, parse_chat, parse_completion, parse_json_body

BASE = {"model": "m", "prompt": "hi"}


def test_completion_defaults_and_fields():
    req = parse_completion({**BASE, "max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 3, "stop": "x",
                            "stream": True, "stream_options": {"include_usage": True}, "user": "u",
                            "speculative": {"drafter": "lookup", "k": 4}})
    assert (req.max_tokens, req.temperature, req.top_p, req.seed, req.stop) == (5, 0.0, 0.5, 3, ["x"])
    assert req.stream and req.include_usage and req.user == "u" and (req.drafter, req.k) == ("lookup", 4)
    plain = parse_completion(BASE)
    assert plain.max_tokens is None and plain.drafter is None and plain.k == "auto" and plain.stop == []
    assert parse_completion({**BASE, "prompt": ["one"]}).prompt == "one"
    assert parse_completion({**BASE, "prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    assert parse_completion({**BASE, "n": 1, "logprobs": None, "presence_penalty": 0}).prompt == "hi"
    assert parse_completion({**BASE, "n": 3}).n == 3 and plain.n == 1  # the server caps n at its batch size
    assert plain.controls is None and plain.min_p == 0.0


def test_sampling_controls_logprobs_and_response_format():
    req = parse_completion({**BASE, "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
                            "logit_bias": {"7": -100, "3": 2.5}, "min_p": 0.1, "logprobs": 2,
                            "metadata": {"a": "b"}})
    c = req.controls
    assert (c.presence_penalty, c.frequency_penalty, c.repetition_penalty) == (0.5, -1.0, 1.2)
    assert c.logit_bias == ((3, 2.5), (7, -100.0)) and c.logprobs == 2 and req.min_p == 0.1 and c.grammar is None
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                       "top_logprobs": 4, "response_format": {"type": "json_schema", "json_schema": {
                           "name": "x", "schema": {"type": "object"}, "strict": True}}})
    assert chat.controls.logprobs == 4 and chat.grammar.kind == "json_schema"
    assert chat.engine_controls().grammar == chat.grammar and chat.engine_controls().logprobs == 4
    assert parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True}).controls.logprobs == 0
    assert parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": False,
                       "response_format": {"type": "text"}}).controls is None


@pytest.mark.parametrize("change, param", [
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": "json"}, "response_format"),
    ({"audio": {"voice": "x"}}, "audio"),
    ({"n": 0}, "n"),
])
def test_chat_field_rejections(change, param):
    with pytest.raises(ApiError) as err:
        parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], **change})
    assert err.value.status == 400 and err.value.param == param


def test_chat_messages_and_content_parts():
    req = parse_chat({"model": "m", "max_completion_tokens": 7, "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert req.prompt == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    assert req.max_tokens == 7 and req.kind == "chat"


@pytest.mark.parametrize("change, param", [
    ({"model": None}, "model"),
    ({"model": 3}, "model"),
    ({"prompt": None}, "prompt"),
    ({"prompt": 42}, "prompt"),
    ({"prompt": ["a", [1, 2]]}, "prompt"),  # a batch mixes strings and token ids (["a", "b"] is a batch of two)
    ({"prompt": [[1, 2], []]}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": "8"}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 129}, "n"),
    ({"n": 1.5}, "n"),
    ({"seed": -1}, "seed"),
    ({"stop": 5}, "stop"),
    ({"stop": ["a", 1]}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"speculative": "draft"}, "speculative"),
    ({"speculative": {"drafter": "oracle"}}, "speculative.drafter"),
    ({"speculative": {"k": 100}}, "speculative.k"),
    ({"speculative": {"k": "many"}}, "speculative.k"),
    ({"speculative": {"depth": 2}}, "speculative"),
    ({"best_of": 3}, "best_of"),
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"echo": True}, "echo"),
    ({"logit_bias": {"one": 5}}, "logit_bias"),
    ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"logit_bias": [1]}, "logit_bias"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": "x"}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"guided_json": {}}, "guided_json"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
])
def test_completion_rejections_name_the_param(change, param):
    body = {**BASE, **change}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(ApiError) as err:
        parse_completion(body)
    assert err.value.status == 400 and err.value.param == param
    assert set(err.value.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("messages, param", [
    (None, "messages"),
    ([], "messages"),
    ("hello", "messages"),
    (["hello"], "messages[0]"),
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content"),
])
def test_chat_rejections(messages, param):
    body = {"model": "m"} if messages is None else {"model": "m", "messages": messages}
    with pytest.raises(ApiError) as err:
        parse_chat(body)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("raw, code", [
    (b"", "invalid_json"), (b"{not json", "invalid_json"), (b"[1, 2]", "invalid_json"),
    (b'{"a": NaN}', "invalid_json"), (b"\xff\xfe{}", "invalid_encoding"),
])
def test_body_rejections(raw, code):
    with pytest.raises(ApiError) as err:
        parse_json_body(raw)
    assert err.value.status == 400 and err.value.code == code
