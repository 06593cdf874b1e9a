"""Stopper: where the answer ends (EOS, budget, stop strings) and which text is safe to show."""
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
