"""The checks on the fields of the store's control requests (protocol.py): each takes the field's name and its
JSON value, and returns the value or raises Invalid naming the field. Standard library only, and no other module
of ours: the operator imports it through protocol.py (the contracts in pyproject.toml)."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable, Mapping
from typing import Any

MAX_INT = 2**31 - 1
# Unix seconds up to the year 5138: enough for any heartbeat, small enough to stay a valid datetime.
MAX_UNIX = 1e11
# The most addresses one job's pods may have: every worker (the operator's own cap on replicas) and then some.
MAX_PEERS = 4096

Check = Callable[[str, Any], Any]
Query = Mapping[str, list[str]]  # a URL's query, as parse_qs reads it


class Invalid(ValueError):
    """A body or a query that is not this protocol's; the message says which field and why."""


def integer(low: int, high: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if type(value) is not int or not low <= value <= high:  # JSON true is not a count
            raise Invalid(f"{name} must be an integer from {low} to {high}")
        return value
    return check


def unix_time(name: str, value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_UNIX:
        raise Invalid(f"{name} must be unix seconds (a number from 0 to {MAX_UNIX:.0f})")
    return float(value)


def ip(name: str, value: Any) -> str:
    if not isinstance(value, str) or len(value) > 64:
        raise Invalid(f"{name} must be an IPv4 or IPv6 address")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise Invalid(f"{name} must be an IPv4 or IPv6 address, not {value!r}") from None


def fields(body: Any, required: dict[str, Check]) -> dict[str, Any]:
    """A request body: a JSON object with exactly these fields, each checked."""
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object")
    unknown = sorted(set(body) - set(required))
    if unknown:
        raise Invalid(f"unknown field(s): {', '.join(unknown)}")
    missing = sorted(set(required) - set(body))
    if missing:
        raise Invalid(f"missing field(s): {', '.join(missing)}")
    return {name: check(name, body[name]) for name, check in required.items()}


def seconds(high: float) -> Callable[[str, Any], float]:
    def check(name: str, value: Any) -> float:
        if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= high:
            raise Invalid(f"{name} must be a number of seconds from 0 to {high:g}")
        return float(value)
    return check


def optional(check: Check) -> Check:
    """`check`, or JSON null as None."""
    def either(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)
    return either


def addresses(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_PEERS:
        raise Invalid(f"{name} must be a list of at most {MAX_PEERS} addresses")
    return tuple(sorted({ip(name, item) for item in value}))


# The state's long-poll (protocol.StateQuery).

def query_int(query: Query, name: str, default: int) -> int:
    value = query.get(name, [None])[0]
    if value is None:
        return default
    if not value.lstrip("-").isdigit() or not -1 <= int(value) <= MAX_INT:
        raise Invalid(f"{name} must be an integer from -1 to {MAX_INT}")
    return int(value)


def query_float(query: Query, name: str, default: float, high: float) -> float:
    value = query.get(name, [None])[0]
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise Invalid(f"{name} must be a number of seconds") from None
    if not math.isfinite(number) or not 0 <= number <= high:
        raise Invalid(f"{name} must be from 0 to {high:.0f} seconds")
    return number


# Replies (protocol.py): read leniently (fields added later are skipped), each known field checked for its type.

REQUIRED = object()


def reply_field(body: Any, name: str, kinds: tuple[type, ...], default: Any) -> Any:
    if not isinstance(body, dict):
        raise Invalid("a reply must be a JSON object")
    if name not in body:
        if default is REQUIRED:
            raise Invalid(f"the reply has no {name}")
        return default
    value = body[name]
    if type(value) not in kinds:  # type(), not isinstance: JSON true is not a count
        raise Invalid(f"the reply's {name} is a {type(value).__name__}")
    return value
