"""One checkpoint as one file: a fixed header, the tensors' bytes, then a metadata record.

    [0, 4096)             header: magic, format version, committed flag, step, sequence, where the metadata is,
                          total length
    [4096, meta_offset)   each tensor's bytes, contiguous, at an offset aligned to 64 (4096 from 1 MiB up)
    [meta_offset, total)  the metadata, JSON (record.py): per tensor its offset, dtype name, shape and length;
                          the state dict with each tensor replaced by its index and every other value tagged
                          with its type (tree.py); the step and the volume directory

The memory copy and the volume copy are the same bytes, so persisting is a plain file copy. The header is
written last: a file whose header does not say committed is never read.

Trust: the files sit where others may write (a volume several jobs mount, a /dev/shm every container of the pod
shares), so nothing in a file can run code or size a write into memory. The metadata is JSON, whose decoder
builds only plain values and the few types tree.py names; every offset, length, dtype and shape is checked
against the file before a byte is read (record.py). Version 1 files kept the metadata as a pickle, which runs
code when loaded: they are refused, never read. Files are created 0600 and directories 0700 (files.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

import torch

MAGIC = b"EJCKPT01"
HEADER = struct.Struct("<8sIIQQQQQ")  # magic, version, committed, step, seq, meta_offset, meta_len, total
HEADER_SIZE = 4096  # the data starts on a page of its own
ALIGN = 64
PAGE = 4096
MAP_MIN = 1 << 20  # tensors this big start on a page of their own: a load from memory maps them, copying nothing
VERSION = 2  # 2: JSON metadata
PICKLED = 1  # the version whose metadata is a pickle: refused

# The dtypes a tensor's bytes may be stored as, by name: every dense one torch has (the quantized and bit-packed
# ones are not: a quantized tensor is refused at save, and a bits/intN tensor has no element size to check).
TENSOR_DTYPES = ("float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32", "int64",
                 "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool", "float8_e4m3fn",
                 "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
# Every torch.dtype by its name, read from torch's namespace (not getattr: a name from a file selects nothing else).
DTYPE_NAMES = {str(dtype).replace("torch.", "", 1): dtype for dtype in vars(torch).values()
               if isinstance(dtype, torch.dtype)}
DTYPES = {name: DTYPE_NAMES[name] for name in TENSOR_DTYPES if name in DTYPE_NAMES}  # older torch lacks some


class CheckpointError(ValueError):
    """A checkpoint file that is not loaded: an old format, or metadata that does not match its file."""


class Entry(NamedTuple):
    offset: int
    dtype: str  # torch.float32 -> "float32", a key of DTYPES
    shape: tuple[int, ...]
    nbytes: int
    parameter: bool  # an nn.Parameter comes back as one (requires_grad kept)
    requires_grad: bool


@dataclass(frozen=True)
class Header:
    committed: bool
    step: int
    seq: int
    meta_offset: int
    meta_len: int
    total: int
    version: int = VERSION

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, VERSION, int(self.committed), self.step, self.seq, self.meta_offset,
                           self.meta_len, self.total)

    @staticmethod
    def unpack(raw: bytes) -> Header | None:
        """None for anything that is not a header of ours (an empty or foreign file). A version 1 header comes
        back as one, so that the reader can refuse it by name."""
        if len(raw) < HEADER.size:
            return None
        magic, version, committed, step, seq, meta_offset, meta_len, total = HEADER.unpack_from(raw)
        if magic != MAGIC or version not in (PICKLED, VERSION):
            return None
        return Header(bool(committed), step, seq, meta_offset, meta_len, total, version)


@dataclass
class Plan:
    """A state dict laid out: what goes where, and the encoded metadata."""

    tensors: list[torch.Tensor]
    entries: list[Entry]
    meta: bytes
    meta_offset: int

    @property
    def total(self) -> int:
        return self.meta_offset + len(self.meta)


def check_tensor(tensor: torch.Tensor, path: str) -> None:
    """A tensor a checkpoint can hold: dense, with data, of a dtype in DTYPES."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        raise TypeError(f"elasticjob_ckpt: {path} is a {type(tensor).__name__}, which is not supported (DTensor, "
                        "ShardedTensor and other tensor subclasses are out of scope: use torch.distributed.checkpoint "
                        "for them)")
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.device.type == "meta":
        raise TypeError(f"elasticjob_ckpt: {path}: only dense tensors with data are supported, not {tensor.layout} "
                        f"{tensor.dtype} on {tensor.device}")
    if dtype_name(tensor.dtype) not in DTYPES:
        raise TypeError(f"elasticjob_ckpt: {path}: tensors of {tensor.dtype} are not supported")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "", 1)


def dtype_of(entry: Entry) -> torch.dtype:
    return DTYPES[entry.dtype]
