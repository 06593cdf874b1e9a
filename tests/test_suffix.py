"""SuffixStore and the suffix drafter: matches across requests, namespaces kept apart, memory capped."""
from specdecode.drafters.base import StopRule
from specdecode.drafters.suffix import SuffixDrafter
from specdecode.drafters.suffix_store import SuffixStore, owner_of
from specdecode.server.http_parts import request_namespace
from specdecode.sampling import SamplingParams

GREEDY = SamplingParams()


def test_the_store_finds_what_followed_the_longest_earlier_match():
    store = SuffixStore()
    store.add("a", [1, 2, 3, 4, 5, 6])
    store.add("a", [9, 9, 2, 3, 4, 7, 8])
    match = store.best_match("a", [0, 1, 2, 3, 4], max_match=32)
    assert match.tokens[match.end + 1 :] == [5, 6] and match.length == 4  # 1 2 3 4 beats 2 3 4
    match = store.best_match("a", [5, 9, 2, 3, 4], max_match=32)
    assert match.tokens[match.end + 1 :] == [7, 8]
    assert store.best_match("a", [7, 7, 7], max_match=32) is None


def test_namespaces_never_see_each_others_text():
    store = SuffixStore()
    store.add("alice", [1, 2, 3, 4, 5])
    assert store.best_match("bob", [1, 2, 3], max_match=32) is None
    assert store.best_match("alice", [1, 2, 3], max_match=32) is not None


def test_a_chat_continuation_replaces_its_earlier_turn():
    store = SuffixStore()
    store.add("a", [1, 2, 3, 4])
    store.add("a", [1, 2, 3, 4, 5, 6, 7])
    assert len(store) == 1 and store.tokens == 7


def test_the_store_stays_under_its_cap_evicting_the_oldest():
    store = SuffixStore(max_tokens=100)
    for i in range(50):
        store.add("a", [i * 1000 + j for j in range(30)])
        assert store.tokens <= 100
    assert len(store) == 3
    assert store.best_match("a", [0, 1, 2], max_match=32) is None  # the first sequence is gone
    assert store.best_match("a", [49000, 49001, 49002], max_match=32) is not None
    assert len(store._index) == sum(len(tokens) - 2 for _, tokens in store._docs.values())  # no stale keys
    store.add("a", list(range(500)))  # longer than the cap: its last 100 tokens are kept
    assert store.tokens == 100


def test_another_clients_traffic_pushes_out_its_own_text_not_a_smaller_clients():
    """Past the cap the namespace holding the most gives up its oldest sequence: b's volume cannot evict a's text
    (which would tell a, through its repeats' drafting, how much b sent). Fails where the oldest overall goes."""
    store = SuffixStore(max_tokens=100)
    store.add("a", list(range(30)))
    for i in range(20):
        store.add("b", [10_000 + 100 * i + j for j in range(30)])
        assert store.tokens <= 100
    assert store.best_match("a", [0, 1, 2], max_match=32) is not None
    assert store.best_match("b", [10_000, 10_001, 10_002], max_match=32) is None  # b's own oldest went
    assert store.best_match("b", [11_900, 11_901, 11_902], max_match=32) is not None
    store.add("a", list(range(500, 540)))  # now a would hold the most: its own oldest goes, b keeps what it had
    assert store.best_match("a", [0, 1, 2], max_match=32) is None
    assert store.best_match("b", [11_900, 11_901, 11_902], max_match=32) is not None
    assert store.tokens <= 100


def test_namespaces_a_client_mints_share_one_owners_holding():
    """A client that sends each request under a new namespace (a new `user` or bearer token) holds little in each:
    were each its own holder, the victim would hold the most and lose its text to the flood. One owner ("lane/")
    counts them together, so the flood evicts its own. Fails where each namespace is its own owner."""
    store = SuffixStore(max_tokens=100)
    store.add("victim/x", list(range(40)))
    for i in range(20):
        store.add(f"flood/{i}", [10_000 + 100 * i + j for j in range(30)])
        assert store.tokens <= 100
    assert store.best_match("victim/x", [0, 1, 2], max_match=32) is not None
    assert store.best_match("flood/0", [10_000, 10_001, 10_002], max_match=32) is None
    assert store.best_match("flood/19", [11_900, 11_901, 11_902], max_match=32) is not None


def test_the_server_namespaces_name_their_lane_as_owner():
    same_lane = {request_namespace("key", "10.0.0.1", user, token) for user, token in [("", ""), ("u", ""), ("", "Bearer t")]}
    assert len(same_lane) == 3 and len({owner_of(ns) for ns in same_lane}) == 1
    assert owner_of(request_namespace("key", "10.0.0.2", "", "")) not in {owner_of(ns) for ns in same_lane}
    assert owner_of(request_namespace("other", "10.0.0.1", "", "")) not in {owner_of(ns) for ns in same_lane}


def test_the_drafter_copies_from_the_store_or_the_context_whichever_matches_further():
    store = SuffixStore()
    store.add("a", [10, 11, 12, 13, 14, 15, 16])
    drafter = SuffixDrafter(store)
    drafter.begin([], "a")
    assert drafter.propose([5, 11, 12, 13], 3, GREEDY, GREEDY.noise()).tokens == [14, 15, 16]
    # the context's own earlier text matches further back than the store
    context = [9, 10, 11, 12, 13, 20, 21, 9, 10, 11, 12, 13]
    assert drafter.propose(context, 2, GREEDY, GREEDY.noise()).tokens == [20, 21]
    drafter.begin([], "b")
    assert drafter.propose([5, 11, 12, 13], 3, GREEDY, GREEDY.noise()).tokens == []
    drafter.end([1, 2, 3, 4, 5])
    assert store.best_match("b", [1, 2, 3], max_match=32) is not None


def test_a_request_without_a_namespace_neither_copies_from_the_store_nor_joins_it():
    store = SuffixStore()
    store.add("", [10, 11, 12, 13, 14, 15, 16])
    drafter = SuffixDrafter(store)
    drafter.begin([], None)
    assert drafter.propose([5, 11, 12, 13], 3, GREEDY, GREEDY.noise()).tokens == []
    context = [9, 10, 11, 12, 13, 20, 21, 9, 10, 11, 12, 13]  # its own text it still copies
    assert drafter.propose(context, 2, GREEDY, GREEDY.noise()).tokens == [20, 21]
    drafter.end([1, 2, 3, 4, 5])
    assert len(store) == 1 and store.tokens == 7  # the store kept nothing of it


class _Calibrated(StopRule):
    """Each source's acceptance per token, whatever the confidence."""

    def __init__(self, acceptance: dict[str, float], source: str = ""):
        self.rates, self.source = acceptance, source

    def for_source(self, source: str) -> StopRule:
        return _Calibrated(self.rates, source)

    def acceptance(self, confidence: float) -> float:
        return self.rates[self.source]


def test_the_drafter_takes_the_copy_its_calibration_expects_more_of():
    store = SuffixStore()
    store.add("a", [7, 8, 9, 10, 11, 12, 13, 30, 31, 32])  # matches the context 5 tokens back
    drafter = SuffixDrafter(store)
    drafter.begin([], "a")
    context = [12, 13, 20, 21, 22, 9, 10, 11, 12, 13]  # its own text matches 2 tokens back
    noise = GREEDY.noise()
    assert drafter.propose(context, 3, GREEDY, noise).tokens == [30, 31, 32]  # uncalibrated: the longer match
    trusted = drafter.propose(context, 3, GREEDY, noise, _Calibrated({"lookup": 0.5, "store": 0.9}))
    assert (trusted.source, trusted.tokens) == ("store", [30, 31, 32])
    doubted = drafter.propose(context, 3, GREEDY, noise, _Calibrated({"lookup": 0.5, "store": 0.2}))
    assert (doubted.source, doubted.tokens) == ("lookup", [20, 21, 22])
