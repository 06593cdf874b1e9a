"""SPECDECODE_ISA=auto on a CPU with AMX: the tiles or the VNNI lanes, whichever measured faster here, measured once.

The two paths give the same bits (tests/models/test_quant_dot.py compares them); this checks only that the choice is
the faster one, that it is measured once per kernel build and CPU model and then read, and that a damaged record or
one made on another CPU is measured again rather than trusted.
"""
from __future__ import annotations

import json

import pytest

from specdecode import kernels
from specdecode.kernels import isa_choice


def never(*_):
    raise AssertionError("measured again: the kept choice should have been read")


def test_the_faster_path_is_kept_and_read_by_later_processes(tmp_path):
    record = isa_choice.measured_choice(tmp_path, lambda: {"amx": 0.09, "avx512-vnni": 0.07})
    assert record["isa"] == "avx512-vnni" and record["cpu"] == isa_choice.cpu_model()
    assert isa_choice.measured_choice(tmp_path, never) == record
    assert json.loads((tmp_path / isa_choice.CHOICE_FILE).read_text()) == record
    # the other way round, in a fresh folder
    assert isa_choice.measured_choice(tmp_path / "b", lambda: {"amx": 0.05, "avx512-vnni": 0.07})["isa"] == "amx"


@pytest.mark.parametrize("kept", ["{not json", json.dumps({"isa": "sse2", "cpu": "x"}), "cpu of another machine"])
def test_a_damaged_or_foreign_record_is_measured_again(tmp_path, kept):
    if kept == "cpu of another machine":
        kept = json.dumps({"isa": "amx", "cpu": isa_choice.cpu_model() + " (another)", "seconds": {}})
    (tmp_path / isa_choice.CHOICE_FILE).write_text(kept)
    record = isa_choice.measured_choice(tmp_path, lambda: {"amx": 0.09, "avx512-vnni": 0.07})
    assert record["isa"] == "avx512-vnni"
    assert isa_choice.measured_choice(tmp_path, never) == record


def test_without_amx_auto_is_the_kernels_best_path_and_nothing_is_measured(monkeypatch, tmp_path):
    class VnniOnly:  # what the kernel reports on an AVX-512 VNNI CPU without AMX
        quant_isa_paths = staticmethod(lambda: ["avx2", "avx512-vnni"])
        quant_isa = staticmethod(lambda: "avx512-vnni")

    monkeypatch.setattr(isa_choice.native, "load_kernel", lambda: VnniOnly)
    monkeypatch.setattr(isa_choice, "measured_choice", never)
    assert isa_choice.auto_isa.__wrapped__() == "avx512-vnni"


def test_the_measurement_times_both_paths_on_this_cpu():
    if kernels.load_kernel() is None or "amx" not in kernels.quant_isa_paths():
        pytest.skip("no AMX here: auto has nothing to choose")
    seconds = isa_choice.time_paths(repeats=1)
    assert set(seconds) == set(isa_choice.CANDIDATES) and all(s > 0 for s in seconds.values())
    assert kernels.quant_isa() in isa_choice.CANDIDATES
