"""What one client sends cannot reach another's answer: a request the engine refuses fails alone, over a real
server and the real `openai` SDK, while another client's generation runs beside it."""
from __future__ import annotations

import openai
import pytest

from .conftest import MODEL

VICTIM_PROMPT = "def fibonacci(n):"
VICTIM_TOKENS = 200


@pytest.fixture(scope="module")
def victim_alone(reference_engine):
    """The victim's answer when it runs alone (plain greedy decoding)."""
    return reference_engine.generate(VICTIM_PROMPT, drafter="none", max_new_tokens=VICTIM_TOKENS, chat=False)


def run_beside_victim(client, attack):
    """Start the victim's stream, run `attack` once its first tokens arrived, then read the victim to its end:
    (the victim's text, what `attack` returned or raised)."""
    stream = client.completions.create(model=MODEL, prompt=VICTIM_PROMPT, max_tokens=VICTIM_TOKENS, temperature=0,
                                       stream=True, extra_body={"speculative": {"drafter": "none"}})
    chunks = iter(stream)
    text = [next(chunks).choices[0].text]
    try:
        outcome = attack()
    except openai.APIError as exc:
        outcome = exc
    text += [chunk.choices[0].text for chunk in chunks if chunk.choices]
    return "".join(text), outcome


def test_a_schema_the_grammar_engine_refuses_fails_only_its_own_request(client, victim_alone):
    """An integer past 64 bits in a schema made llguidance raise ValueError on the engine thread: every running
    request got a 500 quoting the attacker's value, and the batch was abandoned."""
    schema = {"type": "string", "maxLength": 10**20}
    victim, refused = run_beside_victim(client, lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}))
    assert isinstance(refused, openai.BadRequestError), refused
    assert victim_alone.stats.generated_tokens > 20 and victim == victim_alone.text


@pytest.mark.parametrize("same_client", [False, True], ids=["another client", "the same client"])
def test_a_slots_draft_model_keeps_nothing_of_another_clients_prompt(same_client):
    """Slot.forget cleared the target cache on a change of client but not the draft model's: the next client's
    draft prefill found the previous client's prompt already read up to their common prefix, so its latency (and
    the adaptive K) told that prefix. The same client still reuses it."""
    import random

    from specdecode.batch import BatchEngine
    from specdecode.engine import Engine
    from testlib import as_loaded, fake_tokenizer, make_tiny_model, perturbed_copy

    model = make_tiny_model(seed=0, vocab_size=256, context_length=256)
    tokenizer = fake_tokenizer(256)
    engine = Engine(as_loaded(model, tokenizer), as_loaded(perturbed_copy(model, 0.05, seed=1), tokenizer, "draft"),
                    max_context=256)
    batch = BatchEngine(engine, max_batch=1)
    rng = random.Random(7)
    secret = [rng.randrange(256) for _ in range(100)]
    batch.submit(secret, drafter="draft", k=4, max_new_tokens=2, namespace="A")
    batch.run()
    guess = secret[:90] + [5, 6, 7]
    ticket = batch.submit(guess, drafter="draft", k=4, max_new_tokens=2, namespace="A" if same_client else "B")
    batch._admit()  # started: its drafter has begun on the prompt
    unread = ticket.generation.unread
    assert unread < 10 if same_client else unread == len(guess) - 1


COUNTERS = {"completed", "queue_depth", "running", "tokenizing"}


@pytest.fixture(scope="module")
def tenants_server(models):
    """Two tenants' keys and no operator key for /metrics."""
    from specdecode.engine import Engine
    from specdecode.server.app import create_app
    from specdecode.server.exposure import ApiKeys

    from .conftest import start_server

    engine = Engine(models[0], None, max_context=256)
    server = start_server(create_app(engine, "lookup", MODEL, api_key=ApiKeys((("alice", "ka"), ("bob", "kb")))), engine)
    yield server
    server.stop()


def test_no_tenant_and_no_stranger_reads_the_servers_counts(tenants_server):
    """/health (open to all) reported completed, queued and running requests; every tenant's key read /metrics,
    which sums up all tenants' prompt and answer tokens: anyone could count the others' traffic."""
    import httpx

    base = tenants_server.base_url
    before = {who: httpx.get(base + "/health", headers=headers).json() for who, headers in
              [("stranger", {}), ("bob", {"Authorization": "Bearer kb"})]}
    alice = openai.OpenAI(base_url=tenants_server.api_url, api_key="ka", max_retries=0, timeout=60)
    alice.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=3, temperature=0)
    for who, headers in [("stranger", {}), ("bob", {"Authorization": "Bearer kb"})]:
        health = httpx.get(base + "/health", headers=headers).json()
        assert health["status"] == "ok" and not COUNTERS & set(health), (who, health)
        assert health == before[who], who
    metrics = httpx.get(base + "/metrics", headers={"Authorization": "Bearer kb"})
    assert metrics.status_code == 401 and "--metrics-key" in metrics.json()["error"]["message"]


def test_the_operators_metrics_key_reads_the_counts(models):
    from starlette.testclient import TestClient

    from specdecode.engine import Engine
    from specdecode.server.app import create_app
    from specdecode.server.exposure import ApiKeys

    app = create_app(Engine(models[0], None, max_context=256), "lookup", MODEL,
                     api_key=ApiKeys((("alice", "ka"), ("bob", "kb"))), metrics_key="ops")
    http = TestClient(app, base_url="http://127.0.0.1")
    operator = {"Authorization": "Bearer ops"}
    assert http.get("/metrics", headers=operator).status_code == 200
    assert COUNTERS <= set(http.get("/health", headers=operator).json())
    assert not COUNTERS & set(http.get("/health", headers={"Authorization": "Bearer ka"}).json())


@pytest.fixture(scope="module")
def proxied_server(models):
    """A keyless server behind a proxy (X-Forwarded-For names the client): each test client its own address."""
    from specdecode.engine import Engine
    from specdecode.server.app import create_app

    from .conftest import start_server

    engine = Engine(models[0], None, max_context=256)
    server = start_server(create_app(engine, "lookup", MODEL), engine, forwarded_allow_ips="127.0.0.1")
    yield server
    server.stop()


def client_at(server, address: str, token: str = "unused"):
    return openai.OpenAI(base_url=server.api_url, api_key=token, max_retries=0, timeout=60,
                         default_headers={"X-Forwarded-For": address})


def test_a_client_minting_tokens_cannot_evict_another_clients_stored_responses(proxied_server):
    """On a keyless server the bearer token is part of the namespace, and the store's cap was per namespace with a
    global total dropping anyone's oldest: one client cycling tokens pushed out every other client's conversations
    (their previous_response_id then 404s). Bounds scaled down: 2 per client, 4 in all."""
    store = proxied_server.app.state.responses
    store.per_client, store.total = 2, 4
    ask = {"model": MODEL, "input": "hello", "max_output_tokens": 1, "temperature": 0}
    victim = client_at(proxied_server, "10.0.0.1")
    kept = victim.responses.create(**ask)
    for token in range(4):
        client_at(proxied_server, "10.0.0.2", f"attacker-{token}").responses.create(**ask)
    assert victim.responses.retrieve(kept.id).id == kept.id
    assert victim.responses.create(**ask, previous_response_id=kept.id).previous_response_id == kept.id


def test_bad_bodies_beside_a_running_generation_leave_it_its_solo_tokens(client, live_server, victim_alone):
    """Each body that once crashed a request (or, through the engine thread, everyone's) answered beside a running
    stream: each a 4xx, and the stream ends with the tokens it gets alone."""
    import httpx

    from .test_fuzz import BASES, SHAPED, encode

    def attack():
        statuses = []
        for route, base in BASES.items():
            for shape in SHAPED:
                raw = encode({**base, **shape})
                statuses.append(httpx.post(f"{live_server.api_url}/{route}", content=raw, timeout=60,
                                           headers={"Content-Type": "application/json"}).status_code)
        return statuses

    victim, statuses = run_beside_victim(client, attack)
    assert max(statuses) < 500, statuses
    assert victim == victim_alone.text


def test_a_schema_compiles_off_the_engine_thread(client, monkeypatch):
    """The engine thread compiled a request's schema (Engine.request) for each of its choices while every running
    stream waited: a tenth of a second and more each for a large schema, times n. It compiles now in the threads
    that tokenize the choices (which run side by side: each may compile it), and the engine finds it compiled, with
    a matcher at the answer's start that each choice copies."""
    import threading

    from specdecode import grammar

    threads, compile_ = [], grammar.grammar_text

    def recording(spec):
        threads.append(threading.current_thread().name)
        return compile_(spec)

    monkeypatch.setattr(grammar, "grammar_text", recording)
    matcher_threads, start_matcher = [], grammar.start_matcher
    monkeypatch.setattr(grammar, "start_matcher",
                        lambda *a: matcher_threads.append(threading.current_thread().name) or start_matcher(*a))
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]}
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a cat."}], n=3,
                                            max_tokens=24, temperature=0.8, seed=3, response_format={
                                                "type": "json_schema", "json_schema": {"name": "cat", "schema": schema}})
    assert len(answer.choices) == 3
    assert 1 <= len(threads) <= 3 and not any(name.startswith("specdecode-engine") for name in threads), threads
    # nor does it build the choices' matchers from the grammar's text: each copies the one compiled beside it
    assert 1 <= len(matcher_threads) <= 3 and not any(name.startswith("specdecode-engine") for name in matcher_threads)


def drafting_counts(monkeypatch, others_first: bool) -> tuple:
    """(drafted, accepted, target passes) of one request in namespace "me" on a fresh engine with pinned costs, run
    alone or after four other clients' requests."""
    import random

    from specdecode.batch import BatchEngine
    from specdecode.engine import Engine
    from testlib import as_loaded, fake_tokenizer, make_tiny_model, perturbed_copy

    model = make_tiny_model(seed=0, vocab_size=256, context_length=512)
    tokenizer = fake_tokenizer(256)
    engine = Engine(as_loaded(model, tokenizer), as_loaded(perturbed_copy(model, 0.05, seed=1), tokenizer, "draft"),
                    max_context=512)
    costs = engine.tuner.costs  # pinned: only what the tuner learns from generations may differ
    for size in range(1, 80):
        costs.set_measured(size, 0.010 + 0.0005 * size)
    costs.draft["draft"] = 0.004
    monkeypatch.setattr(costs, "record_target", lambda *a, **k: None)
    monkeypatch.setattr(costs, "record_draft", lambda *a, **k: None)
    monkeypatch.setattr(engine, "measure_costs", lambda *a, **k: None)
    monkeypatch.setattr(engine, "measure_batch_costs", lambda *a, **k: None)
    rng = random.Random(3)
    base = [rng.randrange(256) for _ in range(60)]
    others = [[rng.randrange(256) for _ in range(40)] * 2 for _ in range(4)]
    batch = BatchEngine(engine, max_batch=8)
    if others_first:
        for index, prompt in enumerate(others):
            batch.submit(prompt, drafter="auto", max_new_tokens=48, namespace=f"other{index}")
        batch.run()
    mine = batch.submit(base + base[:30], drafter="auto", max_new_tokens=48, namespace="me")
    batch.run()
    stats = mine.result().stats
    return stats.drafted, stats.accepted, stats.target_passes


def test_a_clients_drafting_counts_do_not_depend_on_what_others_ran(monkeypatch):
    """The engine-wide Tuner's calibrations and remembered speedups, learned from every client's generations, chose
    how much a request drafted: with the costs pinned, the same request in the same namespace drafted 76 tokens on a
    fresh engine and 58 after four other clients' requests (its usage told it about their traffic). What a
    namespace's generations teach now stays with that namespace."""
    alone = drafting_counts(monkeypatch, others_first=False)
    assert alone[0] > 0, "nothing drafted: nothing compared"
    assert drafting_counts(monkeypatch, others_first=True) == alone
