"""The metadata record (layout.py): laid out at save; at load, checked against its file before a byte of a tensor
is read, because every offset, length, dtype and shape in it comes from a file others may have written.

    {"step": 7, "directory": "/ckpt",
     "entries": [{"offset": 4096, "dtype": "float32", "shape": [600, 512], "nbytes": 1228800,
                  "parameter": false, "requires_grad": false}, ...],
     "tree": {"t": "dict", "type": "dict", "items": [["model", {"t": "tensor", "i": 0}], ...]}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from . import tree
from .layout import ALIGN, DTYPES, HEADER_SIZE, MAP_MIN, PAGE, PICKLED, CheckpointError, Entry, Header, Plan, dtype_name

RECORD_KEYS = {"step", "directory", "entries", "tree"}
MAX_DIMS = 64
MAX_META = 1 << 30  # a state's metadata is some bytes per tensor; a header saying more is not believed


# -- save


def _aligned(offset: int, align: int) -> int:
    return (offset + align - 1) // align * align


def plan(state: Mapping[str, Any] | Any, step: int, directory: str) -> Plan:
    """Lay a state dict out; the tensors' bytes are not touched here. TypeError for a value it cannot hold."""
    tensors: list[torch.Tensor] = []
    encoded = tree.encode(state, tensors)
    entries = []
    offset = HEADER_SIZE
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        offset = _aligned(offset, PAGE if nbytes >= MAP_MIN else ALIGN)
        entries.append(Entry(offset, dtype_name(tensor.dtype), tuple(tensor.shape), nbytes,
                             isinstance(tensor, torch.nn.Parameter), tensor.requires_grad))
        offset += nbytes
    offset = _aligned(offset, ALIGN)
    record = {"step": step, "directory": directory, "entries": [entry._asdict() for entry in entries],
              "tree": encoded}
    meta = json.dumps(record, allow_nan=False, separators=(",", ":")).encode()
    return Plan(tensors, entries, meta, offset)


# -- load


def check_header(header: Header, path: Path) -> None:
    """A committed header that can be believed: the current format, its metadata after the data and inside the
    file (which the caller checked to hold `total` bytes)."""
    if header.version == PICKLED:
        raise CheckpointError(
            f"elasticjob_ckpt: {path} is an old-format checkpoint (version 1, metadata pickled): it is not read, "
            "because loading its metadata could run code. Delete it, or, where it is trusted, load it with the "
            "elasticjob_ckpt that wrote it and save that state with this one")
    if (header.meta_offset < HEADER_SIZE or header.meta_len > MAX_META
            or header.meta_offset + header.meta_len != header.total):
        raise CheckpointError(f"elasticjob_ckpt: {path}: the header puts {header.meta_len} bytes of metadata at "
                              f"{header.meta_offset} in a file of {header.total}; the file is not loaded")


def decode(meta: bytes, header: Header, path: Path) -> dict[str, Any]:
    """The record in `meta`, each entry checked against the file (its header) and the tree against the entries:
    CheckpointError naming the file, and the entry or the place in the tree. No tensor is read here; the tree is
    built by rebuild, once the tensors are."""
    try:
        record = json.loads(meta, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"elasticjob_ckpt: {path}: the metadata is not a checkpoint's JSON ({error}); the "
                              "file is not loaded") from error
    if type(record) is not dict or set(record) != RECORD_KEYS:
        raise CheckpointError(f"elasticjob_ckpt: {path}: the metadata is not a checkpoint's record; the file is "
                              "not loaded")
    if type(record["step"]) is not int or record["step"] != header.step or type(record["directory"]) is not str:
        raise CheckpointError(f"elasticjob_ckpt: {path}: the metadata's step {str(record['step'])[:40]} or "
                              "directory does not match the header; the file is not loaded")
    if type(record["entries"]) is not list:
        raise CheckpointError(f"elasticjob_ckpt: {path}: the metadata's entries are not a list; the file is not "
                              "loaded")
    record["entries"] = [_entry(raw, index, header.meta_offset, path) for index, raw in enumerate(record["entries"])]
    try:
        tree.decode(record["tree"], record["entries"])
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"elasticjob_ckpt: {path}: the metadata's state: {error}; the file is not "
                              "loaded") from error
    return record


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: json.loads takes them unless told


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _entry(raw: Any, index: int, data_end: int, path: Path) -> Entry:
    """One tensor's entry, every field checked: the dtype in the allow-list, the shape non-negative ints whose
    product torch can hold, the length that shape's, the bytes inside the data, before the metadata."""

    def refuse(problem: str) -> CheckpointError:
        return CheckpointError(f"elasticjob_ckpt: {path}: tensor entry {index} {problem}; the file is not loaded")

    if type(raw) is not dict or set(raw) != set(Entry._fields):
        raise refuse(f"is not an entry ({str(raw)[:200]})")
    offset, dtype, shape, nbytes = raw["offset"], raw["dtype"], raw["shape"], raw["nbytes"]
    if type(dtype) is not str or dtype not in DTYPES:
        raise refuse(f"has dtype {str(dtype)[:40]!r}, not one of {', '.join(DTYPES)}")
    if (type(shape) is not list or len(shape) > MAX_DIMS or not all(_count(size) for size in shape)
            or math.prod(max(size, 1) for size in shape) >= 2**63):
        raise refuse(f"has shape {str(shape)[:200]}: not at most {MAX_DIMS} sizes >= 0 whose product is an int64")
    if not _count(offset) or not _count(nbytes):
        raise refuse(f"has offset {str(offset)[:40]} and length {str(nbytes)[:40]}: not counts of bytes")
    wanted = math.prod(shape) * DTYPES[dtype].itemsize
    if nbytes != wanted:
        raise refuse(f"says {nbytes} bytes where a {dtype} tensor of shape {shape} has {wanted}")
    if offset < HEADER_SIZE or offset % ALIGN or offset + nbytes > data_end:
        raise refuse(f"has bytes [{offset}, {offset + nbytes}), not {ALIGN}-aligned inside the data, "
                     f"[{HEADER_SIZE}, {data_end})")
    if nbytes >= MAP_MIN and offset % PAGE:
        raise refuse(f"has {nbytes} bytes at {offset}, not on a page of their own")
    entry = Entry(offset, dtype, tuple(shape), nbytes, raw["parameter"], raw["requires_grad"])
    if type(entry.parameter) is not bool or type(entry.requires_grad) is not bool:
        raise refuse("has a parameter or requires_grad flag that is not a bool")
    if entry.parameter and entry.requires_grad and not (DTYPES[dtype].is_floating_point or DTYPES[dtype].is_complex):
        raise refuse(f"is a {dtype} parameter that requires grad, which torch refuses")
    return entry


def rebuild(record: dict[str, Any], tensors: list[torch.Tensor]) -> Any:
    """The state dict of a decoded record, with the tensors read back in place of their indices."""
    for index, entry in enumerate(record["entries"]):
        if entry.parameter:
            tensors[index] = torch.nn.Parameter(tensors[index], requires_grad=entry.requires_grad)
    return tree.decode(record["tree"], tensors)
