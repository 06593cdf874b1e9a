"""Stopper: where the answer ends (EOS, budget, stop strings) and which text is safe to show."""
import random

import pytest

from specdecode.text import IncrementalDetokenizer, Stopper


class ByteTokenizer:
    """Token i is byte i (UTF-8 with replacement characters); 0 is EOS."""

    eos_ids = frozenset({0})

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def push_text(stopper, text, origin="plain"):
    tokens = list(text.encode())
    return stopper.push(tokens, [origin] * len(tokens))


def test_incremental_detokenizer_keeps_multibyte_characters_whole():
    decoder = IncrementalDetokenizer(ByteTokenizer())
    pieces = [decoder.push(b) for b in "aé€b".encode()]
    assert "".join(pieces) == "aé€b"
    assert pieces == ["a", "", "é", "", "", "€", "b"]


def test_eos_ends_the_answer_and_is_not_part_of_it():
    stopper = Stopper(ByteTokenizer(), 100)
    step = stopper.push([104, 105, 0, 33], ["accepted", "accepted", "bonus", "plain"])
    assert (step.text, step.tokens, step.finish) == ("hi", [104, 105], "stop")
    assert stopper.origin_counts == {"accepted": 2}


def test_the_budget_ends_the_answer_inside_a_step():
    stopper = Stopper(ByteTokenizer(), 3)
    step = push_text(stopper, "abcdef")
    assert (step.text, step.finish, stopper.tokens) == ("abc", "length", [97, 98, 99])


def test_text_that_may_start_a_stop_string_is_held_back_until_ruled_out():
    stopper = Stopper(ByteTokenizer(), 100, stops=["END"])
    # The last len("END") - 1 characters stay held: they could be the start of "END".
    assert push_text(stopper, "abcE").text == "ab"
    assert push_text(stopper, "x").text == "c"
    step = push_text(stopper, "yz")
    assert step.text == "Ex" and step.finish is None


def test_a_stop_string_across_steps_cuts_text_and_tokens_where_it_starts():
    stopper = Stopper(ByteTokenizer(), 100, stops=["END"])
    first = push_text(stopper, "hello E", origin="accepted")
    second = push_text(stopper, "ND more")
    assert first.text + second.text == "hello " and second.finish == "stop"
    assert stopper.text == "hello " and bytes(stopper.tokens) == b"hello "
    assert stopper.origin_counts == {"accepted": 6} and second.tokens == []


def test_pieces_add_up_to_the_text_and_cancel_flushes_held_text():
    stopper = Stopper(ByteTokenizer(), 100, stops=["STOP"])
    step = stopper.push(list("né".encode()), ["plain"] * 3, cancel=True)
    assert step.pieces == ["n", "", "é"] and "".join(step.pieces) == step.text == "né"
    assert step.finish == "cancelled"


def test_end_hands_out_what_was_held_back():
    stopper = Stopper(ByteTokenizer(), 100, stops=["STOP"])
    assert push_text(stopper, "abcdef").text == "abc"
    assert stopper.end("length").text == "def" and stopper.finish == "length"


def test_sources_follow_their_tokens_and_are_cut_with_them():
    stopper = Stopper(ByteTokenizer(), 100, stops=["END"])
    first = stopper.push(list(b"ab E"), ["accepted", "accepted", "accepted", "bonus"], sources=["lookup", "draft", "store", ""])
    assert first.sources == ["lookup", "draft", "store", ""]
    stopper.push(list(b"ND"), ["plain", "plain"])  # a drafter without sources: "" per token
    assert stopper.sources == ["lookup", "draft", "store"]  # cut where the stop string starts, like the tokens


class PieceTokenizer:
    """Token i is the string PIECES[i] (several characters each); 0 is EOS."""

    PIECES = ["", "a", "b", "c", "bc", " hi", "\n", "User", ":", "\nUser", "ab", "x", "é", "User:"]
    eos_ids = frozenset({0})

    def decode(self, ids):
        return "".join(self.PIECES[i] for i in ids)


def run_in_steps(tokenizer, tokens, stops, per_step, max_new_tokens=100):
    """Push tokens per_step at a time, as a step of speculation hands them over, until the answer ends."""
    stopper, released = Stopper(tokenizer, max_new_tokens, stops=stops), ""
    for start in range(0, len(tokens), per_step):
        step = stopper.push(tokens[start : start + per_step], ["accepted"] * len(tokens[start : start + per_step]))
        released += step.text
        if step.finish is not None:
            break
    else:
        released += stopper.end("length").text
    return released, stopper.text, stopper.tokens, stopper.finish, dict(stopper.origin_counts)


NESTED_STOPS = [
    (ByteTokenizer(), list(b" hi\nUser: more"), ["\nUser:", "User"], " hi\n"),
    (ByteTokenizer(), list(b"abc"), ["abc", "b"], "a"),
    (ByteTokenizer(), list(b"xxabcxx"), ["b", "abc"], "xxa"),
    (ByteTokenizer(), list("aébc".encode()), ["ébc", "b"], "aé"),
    (PieceTokenizer(), [5, 6, 7, 8, 11], ["\nUser:", "User"], " hi\n"),
    (PieceTokenizer(), [5, 9, 8, 11], ["\nUser:", "User"], " hi\n"),
    (PieceTokenizer(), [5, 6, 13, 11], ["\nUser:", "User"], " hi"),  # one token completes both: the first to start
    (PieceTokenizer(), [1, 4, 11], ["abc", "b"], ""),  # "bc" completes both
    (PieceTokenizer(), [10, 3, 11], ["abc", "b"], "a"),
    (PieceTokenizer(), [11, 10, 3, 11], ["bc", "abc"], "x"),  # "abc" completes with the same token as "bc"
]


@pytest.mark.parametrize("tokenizer, tokens, stops, answer", NESTED_STOPS)
def test_stop_strings_end_the_answer_where_plain_decoding_would_whatever_the_tokens_per_step(tokenizer, tokens, stops, answer):
    """Plain decoding checks the stop strings after each token: the one that completes first ends the answer.
    A step of many tokens must end it at the same place, even where a longer stop string starts earlier."""
    plain = run_in_steps(tokenizer, tokens, stops, per_step=1)
    assert plain[0] == plain[1] == answer and plain[3] == "stop"
    for per_step in (2, 3, len(tokens)):
        assert run_in_steps(tokenizer, tokens, stops, per_step) == plain, per_step


def test_random_stop_lists_give_the_same_answer_one_token_or_many_per_step():
    rng = random.Random(0)
    tokenizer = PieceTokenizer()
    for _ in range(400):
        tokens = [rng.randrange(1, len(tokenizer.PIECES)) for _ in range(rng.randint(1, 12))]
        text = tokenizer.decode(tokens)
        starts = [rng.randrange(len(text)) for _ in range(rng.randint(1, 3))]  # pieces of the text: they overlap
        stops = [text[start : start + rng.randint(1, 6)] for start in starts]
        budget = rng.randint(1, 12)
        plain = run_in_steps(tokenizer, tokens, stops, 1, budget)
        for per_step in (2, 5, len(tokens)):
            assert run_in_steps(tokenizer, tokens, stops, per_step, budget) == plain, (tokens, stops, per_step)


def test_an_unfinished_character_at_the_end_of_the_answer_is_flushed_as_a_decode_gives_it():
    """A token that ends inside a multi-byte character has its text held back until the character completes;
    when the answer ends first, its bytes must still come out (U+FFFD, as decoding the tokens gives them)."""
    tokenizer = ByteTokenizer()
    unfinished = list(b"a") + list("€".encode())[:2]  # 'a' and two of the euro sign's three bytes
    assert tokenizer.decode(unfinished) == "a\ufffd"

    budget = Stopper(tokenizer, 3)  # the budget ends the answer on the unfinished character
    step = budget.push(unfinished, ["plain"] * 3)
    assert (step.text, step.finish, budget.text) == ("a\ufffd", "length", "a\ufffd")
    assert "".join(step.pieces) == step.text and step.pieces[-1] == "\ufffd"

    eos = Stopper(tokenizer, 100)  # EOS in the next step
    assert push_text(eos, "xy").text == "xy" and eos.push(unfinished, ["plain"] * 3).text == "a"
    assert eos.push([0], ["plain"]).text == "\ufffd" and eos.text == tokenizer.decode(eos.tokens) == "xya\ufffd"

    cancelled = Stopper(tokenizer, 100)
    assert cancelled.push(unfinished, ["plain"] * 3, cancel=True).text == "a\ufffd"

    context_full = Stopper(tokenizer, 100)
    assert context_full.push(unfinished, ["plain"] * 3).text == "a"
    assert context_full.end("length").text == "\ufffd" and context_full.text == "a\ufffd"


def test_the_stopper_keeps_only_the_text_a_stop_string_may_still_cut():
    """Each token costs the same however long the answer: the text already handed out is not kept to be searched
    or copied again, only what a stop string may still cut (the held-back characters and the step's new text)."""
    stopper, released = Stopper(ByteTokenizer(), 10_000, stops=["END!", "x"]), []
    for i in range(3000):
        step = push_text(stopper, "abcdEN"[i % 6])
        released.append(step.text)
        assert len(stopper.window) <= stopper.held_back == 3
    assert "".join(released) + stopper.window == "abcdEN" * 500 == stopper.text
