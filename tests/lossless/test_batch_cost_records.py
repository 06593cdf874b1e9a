"""What a batched pass teaches the cost model: a pass whose rows ran as one block is a block of that many rows;
one whose sequences ran alone or in groups (rows not exact on that path, or more rows than stay exact) cost about
the sum of its parts and must not be recorded as one block (the cost model would read it as the machine slowing
down, ba399d0). Twin: recording every pass."""
import pytest

from specdecode import batch as batch_module
from specdecode.batch import BatchEngine
from specdecode.models.transformer import Transformer

PROMPTS = ["List five fruits and their colours.", "Write a haiku about the sea.", "Explain recursion to a child."]


@pytest.fixture(scope="module")
def engine():
    from specdecode.engine import Engine
    from specdecode.models.loader import load_model
    from testlib import SMOLLM2

    return Engine(load_model(SMOLLM2, device="cpu", dtype="int8", max_context=256), max_context=256)


def recorded_rows(engine, monkeypatch) -> list[int]:
    rows = []
    monkeypatch.setattr(engine.tuner.costs, "record_target", lambda n, seconds: rows.append(n))
    batch = BatchEngine(engine, max_batch=3, prefill_rows=64)
    for prompt in PROMPTS:
        batch.submit(prompt, drafter="none", max_new_tokens=6)
    batch.run()
    return rows


def test_a_pass_of_several_sequences_is_recorded_where_its_rows_ran_together(engine, monkeypatch):
    assert 3 in recorded_rows(engine, monkeypatch)  # three decode rows in one block


def test_a_pass_whose_sequences_ran_alone_is_not_recorded_as_one_block(engine, monkeypatch):
    monkeypatch.setattr(Transformer, "batch_rows", property(lambda self: 0))  # as without the kernel
    assert all(n == 1 for n in recorded_rows(engine, monkeypatch))


def test_the_check_catches_a_batch_that_records_every_pass(engine, monkeypatch):
    monkeypatch.setattr(Transformer, "batch_rows", property(lambda self: 0))
    monkeypatch.setattr(batch_module, "ran_as_one_block", lambda model, segments, rows: True)
    assert any(n > 1 for n in recorded_rows(engine, monkeypatch))
