"""The keys of the pure-Python c10d store (c10d_server.py): values, queues, counters and the clients waiting on
them, bounded as a whole. Owned by the server's event loop: nothing here locks. The wire is c10d.py's."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

from elasticjob_store import c10d

# The whole store's bounds. Torch's rendezvous keeps one state key per job (a few hundred bytes per agent); the
# agents add a few small keys per agent per round (its store's address, role infos, the exit barrier), never
# deleted: a 4 Ki-node job restarting 100 times writes under 2 Mi keys. 4 Mi keys and 512 MiB leave room past
# that and keep the pod (~20 MiB without torch) under the 1 GiB memory limit the operator gives it.
# ENTRY_OVERHEAD: what CPython spends on a small key and value in a dict besides their bytes (~118, measured).
MAX_KEYS = 4 * 1024 * 1024
MAX_STORED_BYTES = 512 * 1024 * 1024
ENTRY_OVERHEAD = 128


class StoreFull(Exception):
    """A write past MAX_KEYS or MAX_STORED_BYTES: refused whole, its writer closed, the store unchanged."""


class Waiter:
    """Someone waiting for keys (a client's WAIT or BARRIER, a LocalStore.get); `wake` runs on the loop."""

    __slots__ = ("keys", "wake")

    def __init__(self, keys: Iterable[bytes], wake: Callable[[], None]) -> None:
        self.keys = set(keys)
        self.wake = wake


def _cost(key: bytes, value: bytes) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD


class Table:
    """The keys, the queues and the waiters. Not thread-safe: only the server's loop touches it."""

    def __init__(self, max_keys: int = MAX_KEYS, max_bytes: int = MAX_STORED_BYTES) -> None:
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, collections.deque[bytes]] = {}
        self.waiting: dict[bytes, list[Waiter]] = {}
        self.stored = 0  # every key and value held, ENTRY_OVERHEAD each (a queue's key once per item)
        self.max_keys = max_keys
        self.max_bytes = max_bytes

    def present(self, key: bytes) -> bool:
        """What CHECK and WAIT look for: a key, or a queue with something in it."""
        return key in self.data or bool(self.queues.get(key))

    def check(self, keys: Iterable[bytes]) -> bool:
        return all(self.present(key) for key in keys)

    def get(self, key: bytes) -> bytes:
        return self.data.get(key, b"")  # torch's client WAITs first; a missing key reads empty, as in torch's

    def get_many(self, keys: list[bytes]) -> list[bytes]:
        return [self.get(key) for key in keys]

    def num_keys(self) -> int:
        return len(self.data)  # the queues are not counted, as in torch's

    def list_keys(self) -> list[bytes]:
        return list(self.data)

    def queue_len(self, key: bytes) -> int:
        return len(self.queues.get(key, ()))

    def _reserve(self, keys: int, size: int) -> None:
        if keys and len(self.data) + len(self.queues) + keys > self.max_keys:
            raise StoreFull(f"the store holds {self.max_keys} keys, its most")
        if size > 0 and self.stored + size > self.max_bytes:
            raise StoreFull(f"the store holds {self.stored} bytes; {size} more would pass {self.max_bytes}")

    def _growth(self, key: bytes, value: bytes) -> int:
        old = self.data.get(key)
        return _cost(key, value) - (0 if old is None else _cost(key, old))

    def _store(self, key: bytes, value: bytes) -> None:
        growth = self._growth(key, value)
        self._reserve(int(key not in self.data), growth)
        self.data[key] = value
        self.stored += growth

    def put(self, key: bytes, value: bytes) -> None:
        """SET: the value, and the key's waiters answered."""
        self._store(key, value)
        self._wake(key)

    def put_many(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """MULTI_SET, all or nothing: reserved up front (a key named twice is counted twice)."""
        self._reserve(len({key for key, _ in pairs if key not in self.data}),
                      sum(max(0, self._growth(key, value)) for key, value in pairs))
        for key, value in pairs:
            self.put(key, value)

    def compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        """The value after the call. A missing key is written only where `expected` is empty; otherwise the
        answer is `expected` itself, as torch's server answers it."""
        current = self.data.get(key)
        if current is None:
            if expected:
                return expected
            self.put(key, desired)
            return desired
        if current == expected:
            self._store(key, desired)
        self._wake(key)  # as torch's: a no-op but for a BARRIER's waiters on the key
        return self.data[key]

    def add(self, key: bytes, delta: int) -> int:
        """ADD: a missing key counts from 0; the sum is stored as decimal text."""
        old = self.data.get(key)
        total = c10d.wrap64(delta + (0 if old is None else c10d.counter(old)))
        self.put(key, str(total).encode())
        return total

    def append(self, key: bytes, value: bytes) -> None:
        self.put(key, self.data.get(key, b"") + value)

    def delete(self, key: bytes) -> bool:
        old = self.data.pop(key, None)
        if old is not None:
            self.stored -= _cost(key, old)
        return old is not None

    def wait(self, waiter: Waiter) -> bool:
        """True where every key is there now; otherwise the waiter is registered for the missing ones."""
        waiter.keys = {key for key in waiter.keys if not self.present(key)}
        for key in waiter.keys:
            self.waiting.setdefault(key, []).append(waiter)
        return not waiter.keys

    def forget(self, waiter: Waiter) -> None:
        for key in waiter.keys:
            waiters = self.waiting.get(key, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self.waiting.pop(key, None)
        waiter.keys.clear()

    def _wake(self, key: bytes) -> None:
        for waiter in self.waiting.pop(key, ()):
            waiter.keys.discard(key)
            if not waiter.keys:
                waiter.wake()

    def push(self, key: bytes, value: bytes) -> None:
        """QUEUE_PUSH: one item more, and one waiter for that key alone (a blocking QUEUE_POP) answered."""
        self._reserve(int(key not in self.queues), _cost(key, value))
        self.queues.setdefault(key, collections.deque()).append(value)
        self.stored += _cost(key, value)
        waiters = self.waiting.get(key, [])
        for index, waiter in enumerate(waiters):
            if waiter.keys == {key}:
                del waiters[index]
                if not waiters:
                    del self.waiting[key]
                waiter.keys.clear()
                waiter.wake()
                return

    def pop(self, key: bytes) -> tuple[int, bytes | None]:
        """QUEUE_POP: the queue's length before, and its first item (None where it was empty)."""
        queue = self.queues.get(key)
        if not queue:
            return 0, None
        length, value = len(queue), queue.popleft()
        self.stored -= _cost(key, value)
        if not queue:
            del self.queues[key]
        return length, value

    def barrier(self, key: bytes, world_size: int, waiter: Waiter) -> bool:
        """BARRIER: one more arrival counted under `key`; True for the arrival that completes it (which answers
        those before it), otherwise the waiter is registered on the key."""
        old = self.data.get(key)
        arrived = 1 if old is None else c10d.wrap64(c10d.counter(old) + 1)
        self._store(key, str(arrived).encode())
        if arrived >= world_size:
            self._wake(key)
            return True
        waiter.keys = {key}
        self.waiting.setdefault(key, []).append(waiter)
        return False
