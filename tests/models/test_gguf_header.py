"""specdecode's one-pass GGUF header reader gives what gguf's GGUFReader gives: every metadata value, every tensor's
type, dimensions and bytes, on the real smollm2 file (a 49k vocabulary) and on tiny files of every block type the
tests write. Bad files are refused with a reason."""
from __future__ import annotations

import numpy as np
import pytest

from specdecode.errors import ModelError
from specdecode.models.gguf_header import GGUFHeader
from specdecode.models.gguf_loader import open_gguf
from test_loader import tiny_gguf


def assert_same_as_gguf(path):
    import gguf

    ours, theirs = GGUFHeader(path), gguf.GGUFReader(str(path))
    fields = {key: field.contents() for key, field in theirs.fields.items() if not key.startswith("GGUF.")}
    assert ours.metadata == fields
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors):
        assert (mine.tensor_type, mine.n_elements, mine.n_bytes) == (reference.tensor_type, reference.n_elements,
                                                                     reference.n_bytes), mine.name
        assert mine.shape.tolist() == reference.shape.tolist() and mine.data.dtype == reference.data.dtype
        assert mine.data.shape == reference.data.shape and np.array_equal(mine.data, reference.data), mine.name


def test_the_real_smollm2_file_reads_as_gguf_reads_it(smollm2):
    assert_same_as_gguf(smollm2.path)


@pytest.mark.parametrize("quant", [None, "Q8_0", "Q4_1"])
def test_tiny_files_read_as_gguf_reads_them(tmp_path, quant):
    import gguf

    from test_loader import write_gguf
    from testlib import make_tiny_model

    path = tmp_path / "tiny.gguf"
    write_gguf(path, make_tiny_model(seed=3), quant=quant and gguf.GGMLQuantizationType[quant], tokenizer=True)
    assert_same_as_gguf(path)


def test_broken_files_are_refused_with_a_reason(tmp_path):
    path, _ = tiny_gguf(tmp_path)
    whole = path.read_bytes()
    for name, content, reason in [("magic.gguf", b"GGML" + whole[4:], "no GGUF magic"),
                                  ("cut.gguf", whole[: len(whole) // 2], "truncated|unpack"),
                                  ("empty.gguf", b"", "")]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ModelError, match=f"not a readable GGUF file.*{reason}"):
            open_gguf(tmp_path / name)
