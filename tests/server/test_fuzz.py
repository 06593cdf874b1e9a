"""Any body on any generation route gets a 2xx or a 4xx, never a 500 (issue 51: the whole class of bad input, not
each instance a review found): numbers at the edges of int64 and float and past them, deep nesting in the body and
inside strings that are parsed again (tool-call arguments), huge keys, unicode, wrong types, known fields and
unknown ones. A tiny random model over smollm2's real tokenizer (its chat template) keeps each example cheap."""
from __future__ import annotations

import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from .conftest import MODEL  # noqa: E402

EDGE_INTS = [0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**20, 10**400, -(10**400)]
EDGE_FLOATS = [0.0, -0.0, 5e-324, 1e-300, 0.5, 1.0, 2.0, 1e308, -1e308]
TEXTS = ["", "hi", "[" * 5000, "{" * 3000, '{"a": ' * 1500, "1" * 5000, "\u0000\ufffd\U0001f600", "<tool_call>", "<|im_end|>"]
scalars = st.one_of(st.none(), st.booleans(), st.sampled_from(EDGE_INTS), st.integers(),
                    st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from(TEXTS), st.text(max_size=12))
DEEP = "__deep_%d__"  # a placeholder json.dumps cannot nest so deep; written out as raw brackets after it
deep = st.sampled_from([50, 300, 900, 5000]).map(lambda depth: DEEP % depth)
values = st.recursive(st.one_of(scalars, deep), lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(TEXTS)), inner, max_size=4)),
    max_leaves=10)
FIELDS = ["temperature", "top_p", "top_k", "min_p", "seed", "n", "max_tokens", "max_completion_tokens", "stop", "stream",
          "stream_options", "logit_bias", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "response_format", "tools", "tool_choice", "parallel_tool_calls", "speculative", "user",
          "messages", "prompt", "input", "instructions", "text", "previous_response_id", "max_output_tokens", "store",
          "truncation", "include", "model", "metadata"]
# Values a valid request may hold, so that examples also reach the engine (streams, logprobs, penalties, drafters)
plausible = st.fixed_dictionaries({}, optional={
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(0, 50), "min_p": st.floats(0, 1),
    "seed": st.integers(0, 2**63 - 1), "n": st.integers(1, 3), "stop": st.lists(st.text(max_size=3), max_size=2),
    "stream": st.booleans(), "presence_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(0.5, 2),
    "logit_bias": st.dictionaries(st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=3),
    "speculative": st.fixed_dictionaries({"drafter": st.sampled_from(["auto", "none", "lookup", "suffix"]),
                                          "k": st.integers(0, 8)})})
changes = st.one_of(plausible, st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=10)), values, max_size=4))
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}
BASES = {
    "completions": {"model": MODEL, "prompt": "hi", "max_tokens": 2},
    "chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "responses": {"model": MODEL, "input": "hi", "max_output_tokens": 2},
}
# Values a client can put where the server parses further: a tool call's arguments, a schema, a past call.
SHAPED = [
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 5000}}]}]},
    {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": '{"a": ' * 1500},
               {"type": "function_call_output", "call_id": "c", "output": "x"}]},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "integer", "maximum": 10**30}}}},
    {"text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "string", "maxLength": 2**64}}}},
    {"tools": [TOOL], "tool_choice": "required"},
    {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
    {"logit_bias": {"1" * 5000: 1}},
    {"logit_bias": {"5": 10**400}},
    {"temperature": 10**400},
    {"temperature": 1e-300},  # valid, and 0 in float32: the pass it joined failed for every request in it
    {},
]
shaped = st.sampled_from(SHAPED)


def encode(body: dict) -> bytes:
    text = json.dumps(body)
    for depth in (50, 300, 900, 5000):
        text = text.replace(json.dumps(DEEP % depth), "[" * depth + "]" * depth)
    return text.encode()


@pytest.fixture(scope="module")
def http(models):
    from starlette.testclient import TestClient

    from specdecode.engine import Engine
    from specdecode.server.app import create_app
    from testlib import as_loaded, make_tiny_model

    tokenizer = models[0].tokenizer
    model = make_tiny_model(seed=0, vocab_size=models[0].vocab_size, context_length=128)
    app = create_app(Engine(as_loaded(model, tokenizer), None, max_context=128), "lookup", MODEL)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize("route", list(BASES))
def test_no_body_gets_a_500(http, route):
    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(shape=shaped, change=changes)
    def check(shape, change):
        raw = encode({**BASES[route], **shape, **change})
        response = http.post(f"/v1/{route}", content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code < 500, (raw[:300], response.text[:300])
        assert "server_error" not in response.text, (raw[:300], response.text[-300:])  # nor one inside a stream
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"] and error["code"], response.text

    check()
    good = http.post("/v1/completions", json={**BASES["completions"], "temperature": 0})
    assert good.status_code == 200

