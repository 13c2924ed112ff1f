"""A GGUF file's metadata and tensors, read in a fraction of a second.

gguf-py's GGUFReader makes two numpy views of every string of the file (the target's 151,936 tokens and 151,387
merges): 11-12 s on a loaded 2-core Xeon before a conversion could start, for a header a plain parse reads in 0.5 s. This
reads the header with struct, keeps the values as Python values and maps each tensor's bytes as a numpy view of the
file, as gguf-py does (its layout: github.com/ggml-org/ggml docs/gguf.md). gguf-py still owns the quantization types
(GGML_QUANT_SIZES) and dequantizes (specdemo/models/gguf_import.py).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
ALIGNMENT = 32  # where the tensors' data starts, unless general.alignment says otherwise
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_FLOATS = {"F32": np.float32, "F16": np.float16}  # kept as values; every other type as raw bytes (BF16 too)


class GGUFFormatError(ValueError):
    """Not a GGUF file this reader knows (another magic or version, a truncated header)."""


@dataclass(frozen=True)
class Tensor:
    """One tensor of the file, its bytes mapped from it."""

    name: str
    kind: str  # ggml type name: "Q4_K", "Q6_K", "F32", …
    shape: tuple[int, ...]  # numpy order: (rows, columns) for a matrix (ggml lists the columns first)
    data: np.ndarray  # float types: the values in `shape`; quantized: (rows, bytes per row) uint8, as gguf-py maps it

    @property
    def quantized(self) -> bool:
        return self.kind not in _FLOATS


class GGUFFile:
    """The metadata (`fields`: key → int, float, bool, str or list) and `tensors` (name → Tensor) of one GGUF file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as file:
            # Copy-on-write: the tensors are the file's own pages (nothing writes them), and as writeable arrays a graph's
            # Constants share them instead of copying them (block_matmul: 1 GB of the target's blocks).
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
        self._at = 0
        if self._read(4) != MAGIC:
            raise GGUFFormatError(f"{self.path.name} is not a GGUF file")
        version, tensor_count, field_count = self._unpack("<IQQ")
        if version < 2:
            raise GGUFFormatError(f"{self.path.name} is GGUF version {version}; versions 2 and 3 are read")
        self.fields = {}
        for _ in range(field_count):
            key = self._string()
            self.fields[key] = self._value(self._unpack("<I")[0])
        infos = [self._tensor_info() for _ in range(tensor_count)]
        alignment = int(self.fields.get("general.alignment", ALIGNMENT))
        start = -(-self._at // alignment) * alignment
        raw = np.frombuffer(self._map, dtype=np.uint8)
        self.tensors = {name: self._tensor(raw, start, name, dims, kind, offset) for name, dims, kind, offset in infos}

    @property
    def architecture(self) -> str:
        return self.fields.get("general.architecture", "")

    def field(self, key: str, default=None):
        """A field of the architecture's namespace ("block_count" → "qwen2.block_count"), or `default`."""
        return self.fields.get(f"{self.architecture}.{key}", default)

    # ---- the header, read from self._at on

    def _read(self, size: int) -> bytes:
        if self._at + size > len(self._map):
            raise GGUFFormatError(f"{self.path.name}: its header ends early (truncated file?)")
        data = self._map[self._at:self._at + size]
        self._at += size
        return data

    def _unpack(self, layout: str) -> tuple:
        return struct.unpack(layout, self._read(struct.calcsize(layout)))

    def _string(self) -> str:
        return self._read(self._unpack("<Q")[0]).decode("utf-8", errors="replace")

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item, count = self._unpack("<IQ")
            if item in _SCALARS and item != 7:  # numbers in one read
                layout = _SCALARS[item]
                return np.frombuffer(self._read(count * struct.calcsize(layout)), dtype=np.dtype(layout)).tolist()
            return [self._value(item) for _ in range(count)]
        if kind not in _SCALARS:
            raise GGUFFormatError(f"{self.path.name}: unknown metadata value type {kind}")
        return self._unpack(_SCALARS[kind])[0]

    def _tensor_info(self) -> tuple:
        name = self._string()
        dims = self._unpack(f"<{self._unpack('<I')[0]}Q")
        kind, offset = self._unpack("<IQ")
        return name, dims, kind, offset

    def _tensor(self, raw: np.ndarray, start: int, name: str, dims: tuple, kind: int, offset: int) -> Tensor:
        kind_name = GGMLQuantizationType(kind).name
        shape = tuple(reversed(dims))  # ggml: the fastest-varying dimension (columns) first
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        count = int(np.prod(dims))
        data = raw[start + offset:start + offset + count // block * size]
        if kind_name in _FLOATS:
            data = data.view(_FLOATS[kind_name]).reshape(shape)
        else:
            data = data.reshape(*shape[:-1], shape[-1] // block * size)
        return Tensor(name, kind_name, shape, data)
