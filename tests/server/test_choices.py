"""`n` > 1 through the real server and the official openai client: choice i is the request alone with seed + i
(plain decoding's answer), in chat and completions, streamed and not; usage sums the choices; bad n is a 400.
Broken twin: a server whose choices all take the request's seed fails the same comparison."""
from __future__ import annotations

import httpx
import pytest

from specdecode.sampling import SamplingParams
from specdecode.server import choices as choices_module

from .conftest import MODEL

MESSAGES = [{"role": "user", "content": "Invent a name for a small cat and say why."}]
SEED = 21


@pytest.fixture(scope="module")
def alone(reference_engine):
    """Plain decoding straight from the engine, one request at a time."""
    def generate(prompt, max_tokens, temperature=0.0, seed=None, **kwargs):
        sampling = SamplingParams(temperature=temperature, seed=seed)
        return reference_engine.generate(prompt, drafter="none", max_new_tokens=max_tokens, sampling=sampling, **kwargs)
    return generate


def seeded_chat(client, n, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0.9, seed=SEED,
                                          n=n, extra_body={"speculative": {"drafter": "auto"}}, **kwargs)


def test_seeded_chat_choices_are_the_request_alone_with_seed_plus_index(client, alone):
    response = seeded_chat(client, 3)
    assert [c.index for c in response.choices] == [0, 1, 2]
    expected = [alone(MESSAGES, 12, 0.9, SEED + i) for i in range(3)]
    assert [c.message.content for c in response.choices] == [e.text for e in expected]
    assert len({c.message.content for c in response.choices}) > 1  # sampled choices differ
    usage = response.usage
    assert usage.prompt_tokens == expected[0].stats.prompt_tokens
    assert usage.completion_tokens == sum(len(e.token_ids) for e in expected)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    tokens = [extension["tokens"] for extension in response.model_extra["specdecode"]["choices"]]
    assert tokens == [e.token_ids for e in expected]


def test_the_choice_check_catches_choices_sharing_one_seed(client, alone, monkeypatch):
    """Broken twin: every choice gets the request's own seed; choices 1 and 2 then differ from their solo answers."""
    monkeypatch.setattr(choices_module, "choice_seed", lambda seed, index: seed)
    response = seeded_chat(client, 3)
    monkeypatch.undo()
    got = [c.message.content for c in response.choices]
    assert got != [alone(MESSAGES, 12, 0.9, SEED + i).text for i in range(3)]


def test_streamed_chat_choices_carry_their_index_and_one_summed_usage(client, alone):
    stream = seeded_chat(client, 3, stream=True, stream_options={"include_usage": True})
    texts, finishes, usages = {}, {}, []
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        if chunk.usage:
            usages.append(chunk.usage)
    expected = [alone(MESSAGES, 12, 0.9, SEED + i) for i in range(3)]
    assert [texts[i] for i in range(3)] == [e.text for e in expected]
    assert [finishes[i] for i in range(3)] == [e.finish_reason for e in expected]
    assert len(usages) == 1 and usages[0].completion_tokens == sum(len(e.token_ids) for e in expected)


def test_greedy_completion_choices_are_all_the_plain_answer(client, alone):
    response = client.completions.create(model=MODEL, prompt="def fibonacci(n):", max_tokens=10, temperature=0, n=2)
    expected = alone("def fibonacci(n):", 10, chat=False).text
    assert [c.text for c in response.choices] == [expected, expected]
    assert [c.index for c in response.choices] == [0, 1]


def test_completion_choices_with_logprobs_equal_one_choice_requests(client):
    def ask(n, seed):
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=1.0,
                                         seed=seed, n=n, logprobs=2, extra_body={"speculative": {"drafter": "draft"}})
    together = ask(2, 5)
    for index, choice in enumerate(together.choices):
        single = ask(1, 5 + index).choices[0]
        assert choice.text == single.text
        assert choice.logprobs.token_logprobs == single.logprobs.token_logprobs


@pytest.mark.parametrize("n", [0, 9, -1])
def test_n_outside_one_to_the_batch_size_is_a_400(live_server, n):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1, "n": n}
    response = httpx.post(live_server.api_url + "/completions", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "n"


@pytest.mark.parametrize("stream", [False, True])
def test_a_batch_of_prompts_answers_each_with_n_choices(client, alone, stream):
    """/v1/completions refused a list of prompts; OpenAI answers each, n choices per prompt, prompt i's choice j at
    index i * n + j, and usage counts each prompt once."""
    prompts = ["def add(a, b):", "The capital of France is"]
    expected = [alone(prompt, 6, 0.9, SEED + j, chat=False) for prompt in prompts for j in range(2)]
    response = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=6, temperature=0.9, seed=SEED,
                                         stream=stream, **({"stream_options": {"include_usage": True}} if stream else {}))
    texts, usage = {}, None
    for chunk in (response if stream else [response]):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
        usage = chunk.usage or usage
    assert [texts[index] for index in range(4)] == [e.text for e in expected]
    assert usage.prompt_tokens == expected[0].stats.prompt_tokens + expected[2].stats.prompt_tokens
    assert usage.completion_tokens == sum(len(e.token_ids) for e in expected)


def test_a_batch_too_large_for_the_batch_is_a_400(client):
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=["a", "b", "c"], n=3, max_tokens=1)
    assert refused.value.body["param"] == "prompt"
