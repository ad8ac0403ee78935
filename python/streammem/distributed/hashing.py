"""Consistent hashing of stream ids to shards (a ring of virtual nodes, stable across processes)."""
from __future__ import annotations

import bisect
import hashlib
from typing import Hashable, Sequence

__all__ = ["HashRing", "stable_hash"]


def stable_hash(key) -> int:
    """64-bit hash of ``str(key)`` that is the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(str(key).encode(), digest_size=8).digest(), "big")


class HashRing:
    """Maps keys to node names so that adding or removing a node moves only ~1/n of the keys.

    Parameters
    ----------
    nodes : sequence of hashable names
    replicas : int
        Virtual nodes per node; more evens out the load (64: within about ±20 %).
    """

    def __init__(self, nodes: Sequence[Hashable] = (), *, replicas: int = 64):
        if isinstance(replicas, bool) or int(replicas) != replicas or replicas < 1:
            raise ValueError(f"replicas must be an int >= 1, got {replicas!r}")
        self.replicas = int(replicas)
        self._points: list[int] = []
        self._owners: list = []
        self._nodes: list = []
        for node in nodes:
            self.add(node)

    @property
    def nodes(self) -> list:
        return list(self._nodes)

    def add(self, node: Hashable) -> None:
        if node in self._nodes:
            raise ValueError(f"node {node!r} is already on the ring")
        self._nodes.append(node)
        for i in range(self.replicas):
            point = stable_hash(f"{node}#{i}")
            at = bisect.bisect(self._points, point)
            self._points.insert(at, point)
            self._owners.insert(at, node)

    def remove(self, node: Hashable) -> None:
        if node not in self._nodes:
            raise ValueError(f"node {node!r} is not on the ring")
        self._nodes.remove(node)
        keep = [(p, o) for p, o in zip(self._points, self._owners) if o != node]
        self._points = [p for p, _ in keep]
        self._owners = [o for _, o in keep]

    def lookup(self, key) -> Hashable:
        """The node owning ``key``: the first virtual node clockwise from the key's hash."""
        if not self._points:
            raise ValueError("the ring has no nodes")
        at = bisect.bisect(self._points, stable_hash(key)) % len(self._points)
        return self._owners[at]
