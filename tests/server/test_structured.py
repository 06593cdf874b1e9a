"""Structured outputs, sampling controls and log-probabilities through a real server and the real `openai` SDK.

The target is Qwen2.5-Coder 0.5B on the int8 kernel (the default target's family and path): `parse` with ten
pydantic models gives objects that validate; the same request with every drafter gives the same answer and the
same log-probabilities, bit for bit, over HTTP.
"""
from __future__ import annotations

import enum
from typing import Literal, Optional

import pytest

from tests.server.conftest import start_server

pydantic = pytest.importorskip("pydantic")
openai = pytest.importorskip("openai")
BaseModel, Field = pydantic.BaseModel, pydantic.Field

pytestmark = pytest.mark.slow
QWEN_05B = "qwen2.5-coder-0.5b"


class Person(BaseModel):
    name: str
    age: int


class Address(BaseModel):
    street: str
    city: str
    postcode: str


class Customer(BaseModel):
    name: str
    address: Address


class Paint(BaseModel):
    colour: Literal["red", "green", "blue"]
    glossy: bool


class Member(BaseModel):
    name: str
    role: Literal["lead", "engineer", "designer"]


class Team(BaseModel):
    name: str
    members: list[Member] = Field(max_length=3)


class Book(BaseModel):
    title: str
    subtitle: Optional[str]
    year: Optional[int]


class Point(BaseModel):
    x: float
    y: float


class Tags(BaseModel):
    tags: list[str] = Field(max_length=4)


class Grid(BaseModel):
    rows: list[list[int]] = Field(max_length=3)


class Priority(str, enum.Enum):
    low = "low"
    high = "high"


class Task(BaseModel):
    title: str
    priority: Priority
    done: bool


class Item(BaseModel):
    sku: str
    quantity: int


class Order(BaseModel):
    order_id: int
    customer: Person
    items: list[Item] = Field(max_length=3)
    status: Literal["open", "shipped"]


SCHEMAS = [
    (Person, "Ann is 31 years old."),
    (Customer, "Bob lives at 1 High Street, Leeds, LS1 4AB."),
    (Paint, "A glossy red paint."),
    (Team, "Team Apollo: Cy is the lead, Di is an engineer."),
    (Book, "The book 'Dune' from 1965, no subtitle."),
    (Point, "The point at x 1.5 and y -2."),
    (Tags, "Tag this post about Python and testing."),
    (Grid, "The 2x2 identity matrix."),
    (Task, "Write the report, urgent, not done yet."),
    (Order, "Order 7 by Eve, 40: two of sku A1, one of sku B2; it has shipped."),
]


@pytest.fixture(scope="module")
def qwen_server():
    import torch

    from specdecode.engine import Engine
    from specdecode.models.loader import load_model
    from specdecode.server.app import create_app

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    target = load_model(QWEN_05B, device="cpu", dtype="int8", max_context=2048)
    draft = load_model(QWEN_05B, device="cpu", dtype="int8", max_context=2048)
    engine = Engine(target, draft, max_context=2048)
    server = start_server(create_app(engine, "auto", QWEN_05B, queue_size=8), engine)
    yield server
    server.stop()
    torch.set_num_threads(threads)


@pytest.fixture
def qwen(qwen_server):
    return openai.OpenAI(base_url=qwen_server.api_url, api_key="unused", max_retries=0, timeout=300)


def ask(text: str) -> list[dict]:
    return [{"role": "system", "content": "Extract the data as JSON. Keep every value short."},
            {"role": "user", "content": text}]


@pytest.mark.parametrize("schema, text", SCHEMAS, ids=[s.__name__ for s, _ in SCHEMAS])
def test_parse_gives_objects_that_validate(qwen, schema, text):
    completion = qwen.chat.completions.parse(model=QWEN_05B, messages=ask(text), response_format=schema,
                                             max_tokens=300, temperature=0)
    message = completion.choices[0].message
    assert isinstance(message.parsed, schema), message.content
    assert completion.choices[0].finish_reason == "stop"
    schema.model_validate_json(message.content)


def test_every_drafter_gives_the_same_answer_and_logprobs_over_http(qwen):
    def answer(drafter: str):
        completion = qwen.chat.completions.parse(
            model=QWEN_05B, messages=ask(SCHEMAS[-1][1]), response_format=Order, max_tokens=200, logprobs=True,
            top_logprobs=3, presence_penalty=0.2, frequency_penalty=0.1, temperature=0, extra_body={"speculative": {"drafter": drafter}})
        choice = completion.choices[0]
        logprobs = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in choice.logprobs.content]
        return choice.message.content, logprobs, completion

    plain, plain_logprobs, plain_completion = answer("none")
    assert len(plain_logprobs) == plain_completion.usage.completion_tokens
    for drafter in ("lookup", "draft", "auto"):
        text, logprobs, completion = answer(drafter)
        assert (text, logprobs) == (plain, plain_logprobs), drafter
    assert completion.model_extra["specdecode"]["stats"]["target_passes"] < plain_completion.usage.completion_tokens


def test_completions_logprobs_and_sampling_controls(qwen):
    def complete(drafter):
        return qwen.completions.create(model=QWEN_05B, prompt="def add(a, b):\n    return", max_tokens=24, logprobs=2,
                                       temperature=0.7, seed=5, logit_bias={"220": 3},
                                       extra_body={"min_p": 0.1, "top_k": 40, "repetition_penalty": 1.1,
                                                   "speculative": {"drafter": drafter}})
    plain = complete("none")
    lp = plain.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == plain.usage.completion_tokens
    assert all(len(top) <= 2 for top in lp.top_logprobs) and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == plain.choices[0].text
    for drafter in ("lookup", "auto"):
        got = complete(drafter)
        assert got.choices[0].text == plain.choices[0].text
        assert got.choices[0].logprobs.token_logprobs == lp.token_logprobs


def test_streamed_logprobs_match_the_whole_answer(qwen):
    kwargs = dict(model=QWEN_05B, messages=ask("Ann is 31."), max_tokens=40, logprobs=True, top_logprobs=1, seed=3,
                  response_format={"type": "json_object"})
    whole = qwen.chat.completions.create(**kwargs)
    streamed = [entry for chunk in qwen.chat.completions.create(stream=True, **kwargs) if chunk.choices
                and chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole.choices[0].logprobs.content]


@pytest.mark.parametrize("body, param, code", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format", "invalid_value"),  # compiled while the request is tokenized, which names the field
    ({"logit_bias": {"99999999": 1}}, "logit_bias", "invalid_value"),  # checked against the vocabulary while tokenized
    ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),
    ({"guided_json": {"type": "object"}}, "guided_json", "unknown_parameter"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction", "unsupported_parameter"),
])
def test_bad_structured_requests_are_400s(qwen_server, body, param, code):
    import httpx

    response = httpx.post(qwen_server.api_url + "/chat/completions", timeout=120, json={
        "model": QWEN_05B, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and (param is None or error["param"] == param)
