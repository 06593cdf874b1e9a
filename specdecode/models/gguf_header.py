"""A GGUF file's header (metadata and tensor table) read in one pass, with memory-mapped views of the tensors.

gguf's own GGUFReader builds a numpy view per array element, which takes seconds for a tokenizer's vocabulary
(~5 s for 49k tokens, longer for Qwen's 151k or Gemma's 262k) on every open. This reader walks the same layout
(the GGUF specification: magic, version, counts, key/value pairs, tensor infos, aligned data) with struct and
gives tensors the shapes and dtypes GGUFReader gives them, so gguf's dequantizers read them unchanged. Little-endian
files only, as llama.cpp writes them.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

_SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
            GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
            GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
# tensors stored as values: their numpy type (every other type is blocks, viewed as bytes)
_VALUE_TYPES = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
                GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
                GGMLQuantizationType.I64: np.int64}


class GGUFTensor(NamedTuple):
    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # dimensions innermost first, as the file lists them
    n_elements: int
    n_bytes: int
    data: np.ndarray  # numpy order (outermost first); blocks as uint8 rows


class GGUFHeader:
    """metadata: key -> Python value (str, number, bool, or a list of them); tensors in file order."""

    def __init__(self, path: str | Path):
        self.data = np.memmap(path, mode="r")
        self._buf = memoryview(self.data)  # slices of a memoryview cost far less than slices of a memmap
        self._pos = 0
        magic, version = self._unpack("<II")
        if magic != GGUF_MAGIC:
            raise ValueError("not a GGUF file (no GGUF magic)")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (this reader handles 2 and 3, little-endian)")
        n_tensors, n_fields = self._unpack("<QQ")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._string()
            self.metadata[key] = self._value(GGUFValueType(self._unpack("<I")[0]))
        infos = [self._tensor_info() for _ in range(n_tensors)]
        alignment = int(self.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"invalid alignment {alignment}: not a power of two")
        start = -(-self._pos // alignment) * alignment
        self.tensors = [self._tensor(start, *info) for info in infos]

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def _unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (length,) = self._unpack("<Q")
        raw = bytes(self._buf[self._pos : self._pos + length])
        self._pos += length
        return raw.decode("utf-8", errors="replace")

    def _value(self, kind: GGUFValueType):
        if kind == GGUFValueType.STRING:
            return self._string()
        if kind in _SCALARS:
            return self._unpack("<" + _SCALARS[kind])[0]
        if kind != GGUFValueType.ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        item, count = GGUFValueType(self._unpack("<I")[0]), self._unpack("<Q")[0]
        if item in _SCALARS:  # one unpack for the whole array
            return list(self._unpack(f"<{count}{_SCALARS[item]}"))
        return [self._value(item) for _ in range(count)]

    def _tensor_info(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self._string()
        (n_dims,) = self._unpack("<I")
        dims = self._unpack(f"<{n_dims}Q")
        kind, offset = self._unpack("<IQ")
        return name, dims, GGMLQuantizationType(kind), offset

    def _tensor(self, start: int, name: str, dims: tuple[int, ...], kind: GGMLQuantizationType, offset: int):
        n_elements = int(np.prod(dims, dtype=np.int64))
        block, size = GGML_QUANT_SIZES[kind]
        n_bytes = n_elements * size // block
        begin = start + offset
        if begin + n_bytes > len(self.data):
            raise ValueError(f"tensor '{name}' runs past the end of the file (truncated?)")
        shape = tuple(reversed(dims))
        raw = self.data[begin : begin + n_bytes]
        if kind in _VALUE_TYPES:
            data = raw.view(_VALUE_TYPES[kind]).reshape(shape)
        else:
            data = raw.reshape(quant_shape_to_byte_shape(shape, kind))
        return GGUFTensor(name, kind, np.array(dims, dtype=np.uint64), n_elements, n_bytes, data)
