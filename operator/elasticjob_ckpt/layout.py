"""One checkpoint as one file: a fixed header, the tensors' bytes, then a metadata record.

    [0, 4096)             header: magic, committed flag, step, sequence, where the metadata is, total length
    [4096, data_end)      each tensor's bytes, contiguous, at an offset aligned to 64
    [meta_offset, total)  the metadata: the state dict with every tensor replaced by a TensorRef, and per tensor
                          its offset, dtype and shape (pickle)

The memory copy and the volume copy are the same bytes, so persisting is a plain file copy. The header is
written last: a file whose header does not say committed is never read.

The metadata is a pickle, and pickle runs code when loaded. It is written by the training script itself into
the pod's own memory or the job's own volume, the same trust domain as the script: whoever can write there
can already change the script. Do not load checkpoints from a source the job does not own.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

MAGIC = b"EJCKPT01"
HEADER = struct.Struct("<8sIIQQQQQ")  # magic, version, committed, step, seq, meta_offset, meta_len, total
HEADER_SIZE = 4096  # the data starts on a page of its own
ALIGN = 64
PAGE = 4096
MAP_MIN = 1 << 20  # tensors this big start on a page of their own: a load from memory maps them, copying nothing
VERSION = 1


class TensorRef:
    """Where a tensor stood in the state dict: its index in the metadata's tensor list."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[type[TensorRef], tuple[int]]:
        return (TensorRef, (self.index,))


class Entry(NamedTuple):
    offset: int
    dtype: str  # torch.float32 -> "float32"
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

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, VERSION, int(self.committed), self.step, self.seq, self.meta_offset,
                           self.meta_len, self.total)

    @staticmethod
    def unpack(raw: bytes) -> Header | None:
        """None for anything that is not a header of ours (an empty or foreign file)."""
        if len(raw) < HEADER.size:
            return None
        magic, version, committed, step, seq, meta_offset, meta_len, total = HEADER.unpack_from(raw)
        if magic != MAGIC or version != VERSION:
            return None
        return Header(bool(committed), step, seq, meta_offset, meta_len, total)


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


def _check(tensor: torch.Tensor) -> None:
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        raise TypeError(f"elasticjob_ckpt: a {type(tensor).__name__} is not supported (DTensor, ShardedTensor and "
                        "other tensor subclasses are out of scope: use torch.distributed.checkpoint for them)")
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.device.type == "meta":
        raise TypeError(f"elasticjob_ckpt: only dense tensors with data are supported, not {tensor.layout} "
                        f"{tensor.dtype} on {tensor.device}")


def _strip(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """The same structure with each tensor replaced by a TensorRef; containers are copied, leaves kept."""
    if isinstance(obj, torch.Tensor):
        _check(obj)
        tensors.append(obj)
        return TensorRef(len(tensors) - 1)
    if isinstance(obj, dict):
        out = obj.copy()  # keeps the type: an OrderedDict, a defaultdict with its factory
        if hasattr(obj, "__dict__"):  # a module's state_dict() carries _metadata (versions) as an attribute
            out.__dict__.update(vars(obj))
        for key, value in obj.items():
            out[key] = _strip(value, tensors)
        return out
    if isinstance(obj, list):
        return [_strip(item, tensors) for item in obj]
    if isinstance(obj, tuple):
        items = [_strip(item, tensors) for item in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj


def _fill(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, TensorRef):
        return tensors[obj.index]
    if isinstance(obj, dict):
        for key, value in obj.items():
            obj[key] = _fill(value, tensors)
        return obj
    if isinstance(obj, list):
        return [_fill(item, tensors) for item in obj]
    if isinstance(obj, tuple):
        items = [_fill(item, tensors) for item in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj


def _aligned(offset: int, align: int) -> int:
    return (offset + align - 1) // align * align


def plan(state: Mapping[str, Any] | Any, step: int, directory: str) -> Plan:
    """Lay a state dict out; the tensors' bytes are not touched here."""
    tensors: list[torch.Tensor] = []
    tree = _strip(state, tensors)
    entries = []
    offset = HEADER_SIZE
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        offset = _aligned(offset, PAGE if nbytes >= MAP_MIN else ALIGN)
        entries.append(Entry(offset, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), nbytes,
                             isinstance(tensor, torch.nn.Parameter), tensor.requires_grad))
        offset += nbytes
    offset = _aligned(offset, ALIGN)
    meta = pickle.dumps({"tree": tree, "entries": entries, "step": step, "directory": directory},
                        protocol=pickle.HIGHEST_PROTOCOL)
    return Plan(tensors, entries, meta, offset)


def decode(meta: bytes) -> dict[str, Any]:
    """The metadata record; see the module's note on trust."""
    record: dict[str, Any] = pickle.loads(meta)  # noqa: S301 - the pod's own file, see above
    record["entries"] = [Entry(*entry) for entry in record["entries"]]
    return record


def rebuild(record: dict[str, Any], tensors: list[torch.Tensor]) -> Any:
    """The state dict of a decoded record, its TensorRefs replaced by the tensors read back."""
    for index, entry in enumerate(record["entries"]):
        if entry.parameter:
            tensors[index] = torch.nn.Parameter(tensors[index], requires_grad=entry.requires_grad)
    return _fill(record["tree"], tensors)


def dtype_of(entry: Entry) -> torch.dtype:
    dtype = getattr(torch, entry.dtype)
    assert isinstance(dtype, torch.dtype), entry.dtype
    return dtype
