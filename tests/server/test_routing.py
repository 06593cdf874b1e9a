"""The prefix-aware replica choice, alone: no Ray, no model."""
from __future__ import annotations

import pytest

from specdecode.server.routing import PrefixRouter, prefix_chain, prompt_text

SYSTEM = "You are a careful assistant who answers questions about Python code in detail. " * 3


def chat(*turns):
    return [{"role": "system", "content": SYSTEM}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text} for i, text in enumerate(turns)]


def test_prompt_text_grows_by_appending_as_the_prompt_does():
    first, second = chat("What is a list?"), chat("What is a list?", "An ordered sequence.", "And a tuple?")
    assert prompt_text(second).startswith(prompt_text(first))
    assert prompt_text([1, 2, 3, 4]).startswith(prompt_text([1, 2, 3]))
    assert not prompt_text([1, 2, 34]).startswith(prompt_text([1, 2, 3]))
    assert prompt_text("abc") == "abc" and prompt_text(None) == ""


def test_chained_hashes_identify_whole_prefixes():
    a, b = prefix_chain("x" * 64 + "y" * 64, 64), prefix_chain("z" * 64 + "y" * 64, 64)
    assert len(a) == 2 and a[1] != b[1]  # the same second block after different first blocks
    assert prefix_chain("short", 64) == []
    assert prefix_chain("x" * 64 + "tail", 64) == a[:1]


def test_the_next_chat_turn_goes_to_the_replica_that_served_the_first():
    router = PrefixRouter(block_chars=16, min_prefix_chars=32)
    loads = {"a": 0, "b": 0}
    first = router.chain(chat("Explain decorators."))
    route = router.choose(first, loads)
    assert route.reason == "least_loaded"
    router.record(first, route.replica)
    other = router.chain([{"role": "user", "content": "Something else entirely, unrelated to the first one."}])
    elsewhere = router.choose(other, loads)
    assert elsewhere.replica != route.replica  # the least recently used idle replica: keep the first one's cache
    router.record(other, elsewhere.replica)
    second = router.chain(chat("Explain decorators.", "They wrap functions.", "Show an example."))
    again = router.choose(second, loads)
    assert again.replica == route.replica and again.reason == "prefix"
    assert again.matched_chars >= len(prompt_text(chat("Explain decorators."))) - 16


def test_a_much_busier_replica_loses_its_prefix_request_to_the_least_loaded():
    router = PrefixRouter(block_chars=16, min_prefix_chars=32, max_imbalance=2)
    chain = router.chain(chat("Explain generators."))
    router.record(chain, "a")
    assert router.choose(chain, {"a": 2, "b": 0}).replica == "a"  # within the allowed imbalance
    route = router.choose(chain, {"a": 3, "b": 0, "c": 1})
    assert (route.replica, route.reason) == ("b", "prefix_too_busy")


def test_a_short_shared_prefix_is_not_worth_following():
    router = PrefixRouter(block_chars=16, min_prefix_chars=64)
    router.record(router.chain("0123456789abcdef0123456789abcdefTAIL-ONE"), "a")
    route = router.choose(router.chain("0123456789abcdef0123456789abcdefTAIL-TWO-DIFFERENT"), {"a": 1, "b": 0})
    assert (route.replica, route.reason) == ("b", "least_loaded")


def test_a_replica_holds_only_what_it_ran_last():
    router = PrefixRouter(block_chars=16, min_prefix_chars=16)
    first, second = router.chain("A" * 64), router.chain("B" * 64)
    router.record(first, "a")
    router.record(second, "a")  # the engine's cache now holds the second sequence only
    assert router.matched_blocks(first, "a") == 0 and router.matched_blocks(second, "a") == 4
    keeps_two = PrefixRouter(block_chars=16, min_prefix_chars=16, sequences_per_replica=2)
    keeps_two.record(first, "a")
    keeps_two.record(second, "a")
    assert keeps_two.matched_blocks(first, "a") == 4


def test_a_departed_replica_is_forgotten_and_never_chosen():
    router = PrefixRouter(block_chars=16, min_prefix_chars=16)
    chain = router.chain("C" * 64)
    router.record(chain, "dead")
    router.keep_only({"b"})
    assert router.matched_blocks(chain, "dead") == 0
    assert router.choose(chain, {"b": 5}).replica == "b"
    with pytest.raises(ValueError):
        router.choose(chain, {})


def test_idle_replicas_take_turns():
    router = PrefixRouter()
    chosen = []
    for index in range(4):
        chain = router.chain(f"request {index}")
        route = router.choose(chain, {"a": 0, "b": 0})
        router.record(chain, route.replica)
        chosen.append(route.replica)
    assert chosen in (["a", "b", "a", "b"], ["b", "a", "b", "a"])


def test_two_clients_identical_prompts_are_not_a_shared_prefix():
    """The chain starts from the client's namespace: routing by another client's prefix (and the response's
    `replica` field) would tell a client what someone else sent. The same client's next turn still follows."""
    router = PrefixRouter(block_chars=16, min_prefix_chars=32)
    loads = {"a": 0, "b": 0}
    prompt = chat("Explain decorators.")
    alice = router.chain(prompt, "alice")
    assert alice != router.chain(prompt, "bob") and alice == router.chain(prompt, "alice")
    router.record(alice, "a")
    bob = router.chain(prompt, "bob")
    assert router.matched_blocks(bob, "a") == 0
    assert router.choose(bob, loads) == router.choose([], loads)  # as if nobody had sent it: the least loaded
    assert router.choose(bob, loads).reason == "least_loaded"
    later = router.chain(chat("Explain decorators.", "They wrap functions.", "Show an example."), "alice")
    assert router.choose(later, loads).replica == "a" and router.choose(later, loads).reason == "prefix"


def test_the_entry_point_chains_each_request_in_its_own_namespace():
    pytest.importorskip("ray", reason="the 'cluster' extra (ray[serve]) is not installed")
    from types import SimpleNamespace

    from specdecode.server.cluster_entry import ClusterTicket
    from specdecode.server.protocol import GenerationRequest

    backend = SimpleNamespace(router=PrefixRouter(block_chars=16))
    request = GenerationRequest(kind="chat", model="m", prompt=chat("Explain decorators."))
    alice, bob = ClusterTicket(backend, request, "lane", "alice"), ClusterTicket(backend, request, "lane", "bob")
    assert alice.chain == backend.router.chain(request.prompt, "alice") and alice.chain != bob.chain
