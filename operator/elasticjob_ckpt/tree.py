"""The state dict in the metadata: JSON in which every value keeps its type and nothing a file holds runs code.

    None, bool, int, str, a finite float  itself
    list                                  a JSON array
    tensor                                {"t": "tensor", "i": its index in the record's entries}
    tuple, torch.Size                     {"t": "tuple" | "size", "items": [...]}
    named tuple                           {"t": "namedtuple", "module", "name", "fields", "items"}
    dict, OrderedDict, defaultdict        {"t": "dict", "type", "items": [[key, value], ...]}, with "factory" for
                                          a defaultdict and "attrs" for an OrderedDict's attributes (a module's
                                          state_dict() carries its versions as `_metadata`)
    nan, inf, -inf                        {"t": "float", "v": "nan"}
    bytes                                 {"t": "bytes", "b64": ...}
    torch.dtype, torch.device             {"t": "dtype" | "device", "name": ...}

Keys keep their type too (an optimizer's state is keyed by int): a key is a plain value or a tuple of them. Any
other value is refused at save, by its place in the tree, and never pickled. Not torch's weights-only unpickler
for the rest either: it still runs the reducers of the globals it allows, which has needed security fixes
(torch < 2.6: CVE-2025-32434); JSON runs nothing and holds what state dicts hold.
"""

from __future__ import annotations

import base64
import collections
import inspect
import math
import sys
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .layout import DTYPE_NAMES, check_tensor, dtype_name

MAX_DEPTH = 100  # far deeper than a state dict; a file cannot exhaust the stack
DICTS: dict[str, type[dict[Any, Any]]] = {"dict": dict, "OrderedDict": OrderedDict, "defaultdict": defaultdict}
FACTORIES: dict[str, Callable[[], Any]] = {"list": list, "dict": dict, "int": int, "float": float, "str": str,
                                           "OrderedDict": OrderedDict}
PLAIN = (type(None), bool, int, float, str, bytes)
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def plain_key(key: Any) -> bool:
    """A key both sides take: a value of PLAIN or a tuple of them (hashable, and hashing it runs no code of ours)."""
    return type(key) in PLAIN or (type(key) is tuple and all(plain_key(item) for item in key))


# -- save


def encode(obj: Any, tensors: list[torch.Tensor], path: str = "state", depth: int = 0) -> Any:
    """`obj` as JSON; each tensor is checked, appended to `tensors` and written as its index. TypeError naming
    the place in the tree (`path`) for a value a checkpoint does not hold."""
    if depth > MAX_DEPTH:
        raise TypeError(f"elasticjob_ckpt: {path} is nested more than {MAX_DEPTH} deep")
    kind = type(obj)
    if isinstance(obj, torch.Tensor):
        check_tensor(obj, path)
        tensors.append(obj)
        return {"t": "tensor", "i": len(tensors) - 1}
    if obj is None or kind in (bool, int, str):
        return obj
    if kind is float:
        return obj if math.isfinite(obj) else {"t": "float", "v": repr(obj)}
    if kind is list:
        return [encode(item, tensors, f"{path}[{index}]", depth + 1) for index, item in enumerate(obj)]
    if kind is tuple or kind is torch.Size:
        return {"t": "tuple" if kind is tuple else "size", "items": _encode_items(obj, tensors, path, depth)}
    fields = getattr(kind, "_fields", None)
    if issubclass(kind, tuple) and isinstance(fields, tuple) and all(type(field) is str for field in fields):
        return {"t": "namedtuple", "module": kind.__module__, "name": kind.__qualname__, "fields": list(fields),
                "items": _encode_items(obj, tensors, path, depth)}
    if kind in (dict, OrderedDict, defaultdict):
        return _encode_dict(obj, tensors, path, depth)
    if kind is bytes:
        return {"t": "bytes", "b64": base64.b64encode(obj).decode("ascii")}
    if kind is torch.dtype:
        return {"t": "dtype", "name": dtype_name(obj)}
    if kind is torch.device:
        return {"t": "device", "name": str(obj)}
    raise TypeError(f"elasticjob_ckpt: {path} is a {type_name(obj)}, which a checkpoint does not hold: it holds "
                    "tensors, None, bool, int, float, str, bytes, torch.dtype, torch.device, and lists, tuples, "
                    "named tuples and dicts of them (convert the value, e.g. with .item() or int(), or keep it out "
                    "of the state)")


def _encode_items(obj: tuple[Any, ...], tensors: list[torch.Tensor], path: str, depth: int) -> list[Any]:
    return [encode(item, tensors, f"{path}[{index}]", depth + 1) for index, item in enumerate(obj)]


def _encode_dict(obj: dict[Any, Any], tensors: list[torch.Tensor], path: str, depth: int) -> dict[str, Any]:
    items = []
    for key, value in obj.items():
        if not plain_key(key):
            raise TypeError(f"elasticjob_ckpt: {path} has a key of type {type_name(key)}; a checkpoint's keys are "
                            "None, bool, int, float, str, bytes or tuples of them")
        items.append([encode(key, tensors, path, depth + 1), encode(value, tensors, f"{path}[{key!r}]", depth + 1)])
    node: dict[str, Any] = {"t": "dict", "type": type(obj).__name__, "items": items}
    if isinstance(obj, defaultdict):
        node["factory"] = _factory_name(obj.default_factory, path)
    attrs = getattr(obj, "__dict__", None)
    if attrs:
        node["attrs"] = encode(dict(attrs), tensors, f"{path}.__dict__", depth + 1)
    return node


def _factory_name(factory: Any, path: str) -> str | None:
    for name, known in FACTORIES.items():
        if factory is known:
            return name
    if factory is None:
        return None
    raise TypeError(f"elasticjob_ckpt: {path} is a defaultdict of {factory!r}; a checkpoint holds those of "
                    f"{', '.join(FACTORIES)} or None")


# -- load


def decode(node: Any, tensors: Sequence[Any], path: str = "state", depth: int = 0) -> Any:
    """The value `node` encodes, each tensor index replaced by tensors[index]. ValueError naming the place in the
    tree for anything encode does not write."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{path} is nested more than {MAX_DEPTH} deep")
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is list:
        return [decode(item, tensors, f"{path}[{index}]", depth + 1) for index, item in enumerate(node)]
    tag = node.get("t") if type(node) is dict else None
    decoder = _DECODERS.get(tag) if type(tag) is str else None
    if decoder is None:
        raise ValueError(f"{path} is not a value of a checkpoint ({str(node)[:80]})")
    return decoder(node, tensors, path, depth)


def _field(node: dict[str, Any], name: str, kind: type, path: str) -> Any:
    value = node.get(name)
    if type(value) is not kind:
        raise ValueError(f"{path}: a {node['t']} whose {name!r} is not a {kind.__name__} ({str(value)[:80]})")
    return value


def _items(node: dict[str, Any], tensors: Sequence[Any], path: str, depth: int) -> list[Any]:
    items = _field(node, "items", list, path)
    return [decode(item, tensors, f"{path}[{index}]", depth + 1) for index, item in enumerate(items)]


def _tensor(node: dict[str, Any], tensors: Sequence[Any], path: str, depth: int) -> Any:
    index = _field(node, "i", int, path)
    if not 0 <= index < len(tensors):
        raise ValueError(f"{path}: tensor {index} is not one of the file's {len(tensors)}")
    return tensors[index]


def _tuple(node: dict[str, Any], tensors: Sequence[Any], path: str, depth: int) -> Any:
    return tuple(_items(node, tensors, path, depth))


def _size(node: dict[str, Any], tensors: Sequence[Any], path: str, depth: int) -> Any:
    items = _field(node, "items", list, path)
    if not all(type(item) is int and -(2**63) <= item < 2**63 for item in items):  # -1 in a view's shape
        raise ValueError(f"{path}: a torch.Size of {str(items)[:80]}")
    return torch.Size(items)


def _namedtuple(node: dict[str, Any], tensors: Sequence[Any], path: str, depth: int) -> Any:
    module, name = _field(node, "module", str, path), _field(node, "name", str, path)
    fields = tuple(_field(node, "fields", list, path))
    items = _items(node, tensors, path, depth)
    if len(items) != len(fields) or not all(type(field) is str for field in fields):
        raise ValueError(f"{path}: a named tuple of {len(items)} items whose fields are {str(fields)[:80]}")
    try:
        # tuple.__new__, as namedtuple's own _make: neither the class's __new__ nor its __init__ runs.
        return tuple.__new__(_namedtuple_class(module, name, fields), items)
    except TypeError as error:
        raise ValueError(f"{path}: named tuple {module}.{name}: {error}") from None


def _namedtuple_class(module: str, name: str, fields: tuple[str, ...]) -> type[tuple[Any, ...]]:
    """The class saved, when its module is imported already (a name in a file imports nothing), looked up without
    getattr (no module __getattr__ or descriptor runs), and only when it is a tuple of the same fields; else a new
    named tuple of that name and fields (no isinstance with the original, the same fields and values)."""
    found: Any = sys.modules.get(module)
    for part in name.split("."):
        found = None if found is None else inspect.getattr_static(found, part, None)
    if (issubclass(type(found), type) and tuple in found.__mro__
            and inspect.getattr_static(found, "_fields", None) == fields):
        return found  # type: ignore[no-any-return]
    return collections.namedtuple(name.rpartition(".")[2], fields, rename=True)  # checks the names


def _dict(node: dict[str, Any], tensors: Sequence[Any], path: str, depth: int) -> Any:
    kind = DICTS.get(_field(node, "type", str, path))
    if kind is None:
        raise ValueError(f"{path}: a dict of type {node['type']!r:.40}")
    out = defaultdict(_factory(node, path)) if kind is defaultdict else kind()
    for pair in _field(node, "items", list, path):
        if type(pair) is not list or len(pair) != 2:
            raise ValueError(f"{path}: a dict item that is not a [key, value] pair ({str(pair)[:80]})")
        key = decode(pair[0], (), path, depth + 1)
        if not plain_key(key):
            raise ValueError(f"{path}: a key of type {type_name(key)}")
        out[key] = decode(pair[1], tensors, f"{path}[{key!r}]", depth + 1)
    if "attrs" in node:
        attrs = decode(node["attrs"], tensors, f"{path}.__dict__", depth + 1)
        if kind is not OrderedDict or type(attrs) is not dict or not all(type(name) is str for name in attrs):
            raise ValueError(f"{path}: attributes a {kind.__name__} does not take")
        out.__dict__.update(attrs)
    return out


def _factory(node: dict[str, Any], path: str) -> Callable[[], Any] | None:
    name = node.get("factory")
    if name is None:
        return None
    if type(name) is not str or name not in FACTORIES:
        raise ValueError(f"{path}: a defaultdict of {str(name)[:40]!r}")
    return FACTORIES[name]


def _float(node: dict[str, Any], tensors: Sequence[Any], path: str, depth: int) -> Any:
    value = NON_FINITE.get(_field(node, "v", str, path))
    if value is None:
        raise ValueError(f"{path}: a float {node['v']!r:.40}")
    return value


def _bytes(node: dict[str, Any], tensors: Sequence[Any], path: str, depth: int) -> Any:
    try:
        return base64.b64decode(_field(node, "b64", str, path), validate=True)
    except ValueError as error:  # binascii.Error is one
        raise ValueError(f"{path}: bytes that are not base64 ({error})") from None


def _dtype(node: dict[str, Any], tensors: Sequence[Any], path: str, depth: int) -> Any:
    dtype = DTYPE_NAMES.get(_field(node, "name", str, path))
    if dtype is None:
        raise ValueError(f"{path}: no torch dtype is named {node['name']!r:.40}")
    return dtype


def _device(node: dict[str, Any], tensors: Sequence[Any], path: str, depth: int) -> Any:
    name = _field(node, "name", str, path)
    try:
        return torch.device(name)  # parses the string, nothing else
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"{path}: a device {name!r:.40} ({error})") from None


_DECODERS: dict[str, Callable[[dict[str, Any], Sequence[Any], str, int], Any]] = {
    "tensor": _tensor, "tuple": _tuple, "size": _size, "namedtuple": _namedtuple, "dict": _dict, "float": _float,
    "bytes": _bytes, "dtype": _dtype, "device": _device,
}
