"""The real server driven by the official openai client: results, streaming, usage, equality with the engine."""
from __future__ import annotations

import httpx
import pytest

from specdecode.drafters.registry import DRAFTER_NAMES

from .conftest import MODEL

CODE_PROMPT = "def fibonacci(n):"
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def reference(reference_engine):
    """Plain greedy decoding straight from the engine: what every speculative run over HTTP must equal."""
    def generate(prompt, max_tokens, **kwargs):
        return reference_engine.generate(prompt, drafter="none", max_new_tokens=max_tokens, **kwargs)
    return generate


def test_models_and_health(client, live_server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(live_server.base_url + "/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL and "draft" in health["drafters"]


SPECULATIVE = [{"drafter": "draft", "k": 3}, {"drafter": "lookup", "k": 2}, {"drafter": "none"}]
SPECULATIVE += [{"drafter": name, "k": 3} for name in DRAFTER_NAMES if name not in ("draft", "lookup", "none")]


@pytest.mark.parametrize("speculative", SPECULATIVE, ids=[s["drafter"] for s in SPECULATIVE])
def test_greedy_completion_equals_engine_output(client, reference, speculative):
    expected = reference(CODE_PROMPT, 12, chat=False)
    response = client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=12, extra_body={"speculative": speculative}, **GREEDY)
    choice = response.choices[0]
    assert choice.text == expected.text
    assert choice.finish_reason == expected.finish_reason == "length"
    assert response.model_extra["specdecode"]["tokens"] == expected.token_ids


def test_chat_equals_engine_output_and_usage(client, reference):
    messages = [{"role": "user", "content": "Name three colours."}]
    expected = reference(messages, 12)
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                              extra_body={"speculative": {"drafter": "draft", "k": 4}}, **GREEDY)
    assert response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == expected.text
    usage = response.usage
    assert usage.prompt_tokens == expected.stats.prompt_tokens
    assert usage.completion_tokens == len(expected.token_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    extra = usage.model_extra
    assert extra["drafter"] == "draft" and extra["drafted"] >= extra["accepted"] > 0
    assert extra["alpha"] == pytest.approx(extra["accepted"] / extra["drafted"])
    # target and draft are the same weights: every greedy draft token is accepted, so tau > 1
    assert extra["alpha"] == 1.0 and extra["tau"] > 1.5


def test_streamed_completion_matches_and_carries_origins(client, reference):
    expected = reference(CODE_PROMPT, 14, chat=False)
    stream = client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=14, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"speculative": {"drafter": "draft", "k": 3}}, **GREEDY)
    text, tokens, origins, sources, pieces, finish, usage = [], [], [], [], [], None, None
    for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        info = (chunk.model_extra or {}).get("specdecode")
        if info:
            tokens += info["tokens"]
            origins += info["origins"]
            sources += info["sources"]
            pieces += info["pieces"]
        if chunk.usage:
            usage = chunk.usage
    assert "".join(text) == expected.text and finish == "length"
    assert tokens == expected.token_ids and "".join(pieces) == expected.text
    assert set(origins) <= {"accepted", "recovered", "bonus", "plain"} and "accepted" in origins
    assert usage.completion_tokens == 14 and usage.model_extra["accepted"] == origins.count("accepted")
    # the draft model drafted every accepted token; the target's own tokens have no source
    assert sources == ["draft" if origin == "accepted" else "" for origin in origins]


def test_streamed_chat_deltas(client, reference):
    messages = [{"role": "user", "content": "Say hello."}]
    expected = reference(messages, 6)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, stream=True, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == expected.finish_reason


def test_raw_sse_ends_with_done(live_server):
    body = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 3, "stream": True, "temperature": 0}
    with httpx.stream("POST", live_server.api_url + "/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1


def test_stop_strings(client, reference):
    expected = reference(CODE_PROMPT, 14, chat=False).text
    stop = "return"
    assert stop in expected, expected  # the prompt must reach the stop string for this test to mean anything
    response = client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=14, stop=[stop, "never-seen"], **GREEDY)
    assert response.choices[0].text == expected[: expected.index(stop)]
    assert response.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=14, stop=stop, stream=True, **GREEDY)
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == expected[: expected.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_the_response_holds_only_the_answers_tokens_when_a_stop_string_withdraws_one(client, reference, reference_engine):
    """A stop string that starts in one step's token and completes in the next withdraws the token already
    handed on: the non-streaming response's tokens, origins and sources are the answer's, as its usage."""
    plain = reference(CODE_PROMPT, 14, chat=False)
    decode = reference_engine.tokenizer.decode
    ids = plain.token_ids
    # a stop string of two tokens' text, first met where the first of them starts: plain decoding streams
    # that token a step before the second completes the stop string
    j = next(j for j in range(2, len(ids) - 1) if plain.text.find(decode(ids[j : j + 2])) == len(decode(ids[:j])))
    stop = decode(ids[j : j + 2])
    expected = reference(CODE_PROMPT, 14, chat=False, stop=[stop])
    assert expected.token_ids == ids[:j] and expected.text == decode(ids[:j])
    response = client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=14, stop=[stop],
                                         extra_body={"speculative": {"drafter": "none"}}, **GREEDY)
    extension = response.model_extra["specdecode"]
    assert response.choices[0].text == expected.text and response.choices[0].finish_reason == "stop"
    assert extension["tokens"] == expected.token_ids
    assert len(extension["origins"]) == len(extension["sources"]) == j == response.usage.completion_tokens


def test_seeded_sampling_is_reproducible(client):
    def sample(seed, drafter="draft"):
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0,
                                         top_p=0.95, seed=seed, extra_body={"speculative": {"drafter": drafter, "k": 3}}
                                         ).choices[0].text

    first = sample(1234)
    assert sample(1234) == first
    others = {sample(seed) for seed in (1, 2)}
    assert others | {first} != {first}, "different seeds gave the same text every time"


def test_token_id_prompt(client, reference_engine, reference):
    ids = reference_engine.tokenizer.encode(CODE_PROMPT)
    response = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, **GREEDY)
    assert response.choices[0].text == reference(CODE_PROMPT, 6, chat=False).text
    assert response.usage.prompt_tokens == len(ids)


def test_metrics_exposition(client, live_server):
    client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=4, extra_body={"speculative": {"drafter": "draft", "k": 3}}, **GREEDY)
    text = httpx.get(live_server.base_url + "/metrics").text
    for name in ("specdecode_requests_total", "specdecode_errors_total", "specdecode_generated_tokens_total",
                 "specdecode_acceptance_rate", "specdecode_tokens_per_target_pass", "specdecode_decode_tokens_per_second_bucket",
                 "specdecode_time_to_first_token_seconds_bucket", "specdecode_inter_token_latency_seconds_bucket",
                 "specdecode_queue_depth"):
        assert name in text, name
    assert 'specdecode_acceptance_rate{drafter="draft"} 1.0' in text
    # a request with a drafter that copies from earlier requests adds its prompt and answer to the store
    client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=4, extra_body={"speculative": {"drafter": "suffix"}},
                              **GREEDY)
    text = httpx.get(live_server.base_url + "/metrics").text
    store = live_server.engine.suffix_store
    assert store.tokens > 0 and f"specdecode_suffix_store_tokens {float(store.tokens)}" in text
    assert f"specdecode_suffix_store_max_tokens {float(store.max_tokens)}" in text
    assert 'specdecode_requests_total{endpoint="/v1/completions",status="200"}' in text


def test_suffix_drafts_come_from_the_same_clients_earlier_requests_only(client, reference):
    """A request's answer joins the suffix store under its client's namespace (key, address, `user`): the
    same client asking again copies it, another user on the same server gets nothing of it."""
    prompt = "Write the alphabet backwards, letter by letter:"
    expected = reference(prompt, 24, chat=False)

    def ask(user):
        response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, user=user,
                                              extra_body={"speculative": {"drafter": "suffix", "k": 8}}, **GREEDY)
        assert response.choices[0].text == expected.text
        return response.usage.model_extra["accepted"]

    first = ask("alice-suffix")
    again = ask("alice-suffix")
    stranger = ask("bob-suffix")
    assert again >= 16 > first  # copied from alice's first answer
    assert stranger == first  # bob starts from nothing, as alice did


def test_a_continued_prompt_counts_as_a_prefix_hit(client, live_server):
    def counter(name: str) -> float:
        line = [l for l in httpx.get(live_server.base_url + "/metrics").text.splitlines() if l.startswith(name + " ")]
        return float(line[0].split()[1]) if line else 0.0

    story = "Once upon a time, in a small village by the sea, there lived an old fisherman and his three daughters. " * 2
    client.completions.create(model=MODEL, prompt=story, max_tokens=2, **GREEDY)
    hits, reused = counter("specdecode_prefix_hits_total"), counter("specdecode_prefix_reused_tokens_total")
    client.completions.create(model=MODEL, prompt=story + "The eldest daughter", max_tokens=2, **GREEDY)
    assert counter("specdecode_prefix_hits_total") == hits + 1
    assert counter("specdecode_prefix_reused_tokens_total") - reused >= 40
    client.completions.create(model=MODEL, prompt="A different start altogether, " + story, max_tokens=2, **GREEDY)
    assert counter("specdecode_prefix_hits_total") == hits + 1


def test_concurrent_clients_share_passes_and_each_gets_its_solo_answer(client, reference, live_server):
    """Eight clients at once through the openai SDK (chat, mixed drafters, greedy and seeded): the server runs
    them in one batch (its /metrics shows passes of several requests) and each answer equals plain decoding of
    that request alone."""
    from concurrent.futures import ThreadPoolExecutor

    from specdecode.sampling import SamplingParams

    prompts = [f"Write a short poem about the number {n}." for n in range(4)] + \
              [f"def add_{n}(a, b):\n    # add a and b, then {n}" for n in range(4)]
    drafters = ["auto", "lookup", "none", "draft"]

    def ask(index: int):
        seeded = index % 2 == 1
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompts[index]}], max_tokens=24,
            temperature=0.7 if seeded else 0, seed=index if seeded else None, user=f"client-{index}",
            extra_body={"speculative": {"drafter": drafters[index % 4]}})

    before = httpx.get(live_server.base_url + "/metrics").text
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    for index, answer in enumerate(answers):
        sampling = SamplingParams(temperature=0.7, seed=index) if index % 2 else SamplingParams()
        expected = reference([{"role": "user", "content": prompts[index]}], 24, sampling=sampling)
        assert answer.choices[0].message.content == expected.text, index
    metrics = httpx.get(live_server.base_url + "/metrics").text

    def shared_passes(text: str) -> float:  # passes that held two requests or more
        count = lambda le: float(next(line.split()[-1] for line in text.splitlines()  # noqa: E731
                                      if line.startswith(f'specdecode_batch_size_bucket{{le="{le}"}}')))
        return count("+Inf") - count("1.0")

    assert shared_passes(metrics) > shared_passes(before)


TIMINGS = {"tokens_per_s", "time", "predicted_speedup", "notes"}


def test_responses_carry_no_timings_unless_the_operator_exposes_them(client, live_server, models):
    """A request's prefill time tells its client whether a prefix was cached, its tokens/s how busy the passes were:
    out of every response (final stats, streamed stats, usage) unless the server runs with --expose-timings."""
    from specdecode.engine import Engine
    from specdecode.server.app import create_app

    from .conftest import start_server

    response = client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=4, **GREEDY)
    stats = response.model_extra["specdecode"]["stats"]
    assert stats["generated_tokens"] == 4 and "alpha" in stats and not TIMINGS & set(stats)
    assert "tokens_per_s" not in response.usage.model_extra
    stream = client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=4, stream=True,
                                       stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    streamed = [c.model_extra["specdecode"]["stats"] for c in chunks if (c.model_extra or {}).get("specdecode")]
    assert streamed and not any(TIMINGS & set(s) for s in streamed)
    assert not any("tokens_per_s" in c.usage.model_extra for c in chunks if c.usage)

    engine = Engine(models[0], None, max_context=256)
    exposed = start_server(create_app(engine, "lookup", MODEL, expose_timings=True), engine)
    try:
        body = {"model": MODEL, "prompt": CODE_PROMPT, "max_tokens": 4, "temperature": 0}
        answer = httpx.post(exposed.api_url + "/completions", json=body, timeout=60).json()
        assert answer["specdecode"]["stats"]["time"]["prefill"] > 0 and "tokens_per_s" in answer["usage"]
    finally:
        exposed.stop()


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_a_stream_carries_its_usage_once_and_only_when_asked(client, kind, include_usage):
    """The last text chunk carried `usage` even without stream_options.include_usage, and with it the usage came
    twice: LangChain's ChatOpenAI(stream_usage=True) adds up every chunk's usage and reported double the tokens.
    OpenAI sends it once, in a last chunk with no choices, and only when asked."""
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    if kind == "chat":
        stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                                stream=True, **options, **GREEDY)
    else:
        stream = client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=5, stream=True, **options, **GREEDY)
    chunks = list(stream)
    with_usage = [chunk for chunk in chunks if chunk.usage is not None]
    if not include_usage:
        assert with_usage == []
    else:
        assert len(with_usage) == 1 and with_usage[0] is chunks[-1] and with_usage[0].choices == []
        assert with_usage[0].usage.completion_tokens == 5


def test_every_answer_names_its_request_id(client, live_server):
    """OpenAI's answers carry x-request-id (the SDK's `_request_id`, what a bug report quotes); ours carried none."""
    response = client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=1, **GREEDY)
    assert response._request_id and response._request_id.startswith("req_")
    ids = {httpx.get(live_server.base_url + "/health").headers["x-request-id"] for _ in range(2)}
    assert len(ids) == 2  # one per request, errors and pages alike


def test_cached_tokens_counts_the_reused_prefix_where_timings_are_exposed(client, models):
    """usage.prompt_tokens_details.cached_tokens was always 0 though the prefix was reused. It tells whether the
    client's own earlier prefix is still in a slot, which other clients' traffic decides: the figure goes out with
    the timings (--expose-timings), and the field, 0, otherwise."""
    import openai

    from specdecode.engine import Engine
    from specdecode.server.app import create_app

    from .conftest import start_server

    messages = [{"role": "system", "content": "You are a terse assistant. " * 8}, {"role": "user", "content": "Hi"}]
    default = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, **GREEDY)
    assert default.usage.prompt_tokens_details.cached_tokens == 0
    engine = Engine(models[0], None, max_context=256)
    exposed = start_server(create_app(engine, "lookup", MODEL, expose_timings=True), engine)
    try:
        own = openai.OpenAI(base_url=exposed.api_url, api_key="unused", max_retries=0, timeout=60)
        first, second = (own.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, **GREEDY) for _ in range(2))
        # the first finds what the chat template's opening shares with its prompt (read at load, the same for everyone)
        opening = engine.opening.covers(engine.encode_prompt(messages)[:-1])
        assert first.usage.prompt_tokens_details.cached_tokens == opening
        assert opening < second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    finally:
        exposed.stop()


def test_answers_carry_the_configurations_fingerprint(client, live_server):
    """system_fingerprint was always null; it names what decides the bits (model file, precision, kernel path)."""
    from specdecode.server.shaping import fingerprint

    expected = fingerprint(live_server.engine)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, **GREEDY)
    stream = client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=2, stream=True, **GREEDY)
    assert expected.startswith("fp_") and chat.system_fingerprint == expected
    assert {chunk.system_fingerprint for chunk in stream} == {expected}
