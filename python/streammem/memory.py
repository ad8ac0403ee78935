"""StreamChat's memories: short-term frame sampling and the long-term memory tree.

``ShortTermMemory`` is Eq. 2: from the newest N candidate frames keep S,
sampled without replacement with probability proportional to exp(-age / tau),
so the newest frames are the most likely kept.  (The released StreamChat code
weights the *oldest* frames highest, contrary to the forgetting curve it
cites; we follow the paper.)

``LongTermMemory`` is Eq. 3-5: every L kept frames form a chunk whose features
are compressed to C centres with ``batched_kmeans``, captioned by a
``Captioner``, embedded once with the ``TextEncoder`` and added as a leaf of a
``CosineTree``; whenever a level holds g parentless nodes, the oldest g get a
parent (k-means over the children's centres, a summary caption and its
embedding), exactly the chronological grouping of StreamChat.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import torch
import torch.nn.functional as F

__all__ = [
    "FrameRecord",
    "ShortTermMemory",
    "Captioner",
    "LabelCaptioner",
    "MemoryNode",
    "LongTermMemory",
]


@dataclass
class FrameRecord:
    """One kept frame: its position in the decoded stream, time, features and labels."""

    index: int
    timestamp: float
    feature: torch.Tensor  # (D,) float32
    labels: tuple[str, ...] = ()


# --------------------------------------------------------------------------
# Short-term memory (StreamChat Eq. 2)
# --------------------------------------------------------------------------
class ShortTermMemory:
    """Recent-frame buffer with forgetting-curve sampling.

    Parameters
    ----------
    candidates : int
        N, the newest frames considered (20).
    keep : int
        S, frames returned by ``sample`` (5), or all candidates when fewer.
    tau : float
        Forgetting constant in frames: weight exp(-age / tau), age 0 = newest.
    seed : int
        Seeds the sampler's generator, so a run is reproducible.
    """

    def __init__(self, candidates: int = 20, keep: int = 5, tau: float = 5.0, seed: int = 0):
        if isinstance(candidates, bool) or int(candidates) != candidates or candidates < 1:
            raise ValueError(f"candidates must be an int >= 1, got {candidates!r}")
        if isinstance(keep, bool) or int(keep) != keep or not 1 <= keep:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        if not float(tau) > 0:
            raise ValueError(f"tau must be > 0, got {tau!r}")
        self.candidates = int(candidates)
        self.keep = int(keep)
        self.tau = float(tau)
        self._buffer: list[FrameRecord] = []
        self._generator = torch.Generator().manual_seed(int(seed))

    def __len__(self) -> int:
        return len(self._buffer)

    def add(self, record: FrameRecord) -> None:
        self._buffer.append(record)
        if len(self._buffer) > self.candidates:
            del self._buffer[0]

    def weights(self) -> torch.Tensor:
        """Sampling weights of the current candidates, oldest first (unnormalised)."""
        n = len(self._buffer)
        age = torch.arange(n - 1, -1, -1, dtype=torch.float64)
        return torch.exp(-age / self.tau)

    def sample(self) -> list[FrameRecord]:
        """S candidates drawn without replacement, returned in time order."""
        n = len(self._buffer)
        if n <= self.keep:
            return list(self._buffer)
        picked = torch.multinomial(self.weights(), self.keep, replacement=False, generator=self._generator)
        return [self._buffer[i] for i in sorted(picked.tolist())]


# --------------------------------------------------------------------------
# Captioners
# --------------------------------------------------------------------------
@runtime_checkable
class Captioner(Protocol):
    """Turns frames into a caption, and child nodes into a summary caption.

    ``caption_frames(frames, previous)`` receives the chunk's or event's frame
    records and the previous caption of the same stream of captions (None at
    first), so a language-model captioner can reuse the previous caption's
    prefix (``streammem.update_caption``).  ``summarize(nodes)`` captions a
    parent from its children.
    """

    def caption_frames(self, frames: Sequence[FrameRecord], previous: str | None = None) -> str: ...

    def summarize(self, nodes: Sequence["MemoryNode"]) -> str: ...


def _span(t0: float, t1: float) -> str:
    return f"{t0:.1f}-{t1:.1f}s"


class LabelCaptioner:
    """Names the most frequent frame labels (ImageNet classes) and the time span.

    ``"3.2-7.9s: taxicab, minivan, car mirror"``; a chunk without labels gets
    ``"3.2-7.9s: scene"``.  Deterministic and free, so it is the default.
    """

    def __init__(self, top: int = 3):
        self.top = int(top)

    def _names(self, counts: Counter) -> str:
        # Most frequent first; ties broken alphabetically so captions are stable.
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: self.top]
        return ", ".join(name for name, _ in ranked) if ranked else "scene"

    def caption_frames(self, frames: Sequence[FrameRecord], previous: str | None = None) -> str:
        counts = Counter(label for f in frames for label in f.labels)
        return f"{_span(frames[0].timestamp, frames[-1].timestamp)}: {self._names(counts)}"

    def summarize(self, nodes: Sequence["MemoryNode"]) -> str:
        counts: Counter = Counter()
        for node in nodes:
            counts.update(node.label_counts)
        return f"{_span(nodes[0].t_start, nodes[-1].t_end)}: {self._names(counts)}"


# --------------------------------------------------------------------------
# Long-term memory (StreamChat Eq. 3-5)
# --------------------------------------------------------------------------
@dataclass
class MemoryNode:
    """One node of the long-term memory (a leaf chunk or a parent).

    ``node_id`` is the caller-side id (stable; the tree's row may change when
    the tree is compacted).  ``centres`` are the C compressed frame features.
    """

    node_id: int
    level: int
    t_start: float
    t_end: float
    first_frame: int
    last_frame: int
    caption: str
    embedding: torch.Tensor  # (E,) L2-normalised caption embedding
    centres: torch.Tensor  # (C, D)
    label_counts: Counter = field(default_factory=Counter)
    children: list[int] = field(default_factory=list)
    parent: int | None = None
    created_at: float = 0.0  # stream time of creation
    last_access: float = 0.0  # stream time of the last retrieval
    access_count: int = 0
    merged: int = 1  # how many original units this node stands for


class LongTermMemory:
    """Chunked, compressed, captioned memory tree over kept frames.

    Parameters
    ----------
    text_encoder : TextEncoder
        Embeds captions (once per node).
    captioner : Captioner, optional
        Default ``LabelCaptioner()``.
    chunk : int
        L, kept frames per leaf.
    group : int
        g, nodes per parent.
    centres : int
        C, k-means centres per node.
    kmeans_iters, seed, backend
        Passed to ``batched_kmeans``.

    ``add(record)`` returns the nodes created by that frame (a leaf when a chunk
    closes, plus any parents); ``flush()`` closes a partial chunk.  ``search``
    walks the tree greedily from the roots (StreamChat Algorithm 1) and returns
    the path's nodes and the best node seen.
    """

    def __init__(self, text_encoder, captioner=None, *, chunk: int = 25, group: int = 10, centres: int = 5,
                 kmeans_iters: int = 10, seed: int = 0, backend: str = "auto"):
        for name, value, low in (("chunk", chunk, 1), ("group", group, 2), ("centres", centres, 1),
                                 ("kmeans_iters", kmeans_iters, 1)):
            if isinstance(value, bool) or int(value) != value or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.text_encoder = text_encoder
        self.captioner = captioner if captioner is not None else LabelCaptioner()
        self.chunk = int(chunk)
        self.group = int(group)
        self.centres = int(centres)
        self.kmeans_iters = int(kmeans_iters)
        self.seed = int(seed)
        self.backend = backend
        self.nodes: dict[int, MemoryNode] = {}
        self._next_id = 0
        self._pending: list[FrameRecord] = []
        # Parentless nodes per level in creation order: the grouping queue.
        self.roots_by_level: dict[int, list[int]] = {}
        self._tree = None
        self._row_of: dict[int, int] = {}  # node_id -> tree row
        self._node_of_row: list[int] = []  # tree row -> node_id
        self.timings: Counter = Counter()
        self.novelty_filter = None  # optional callable(embedding) -> bool (True: skip), set by BoundedMemory

    # ---- formation -----------------------------------------------------
    def add(self, record: FrameRecord) -> list[MemoryNode]:
        self._pending.append(record)
        if len(self._pending) < self.chunk:
            return []
        frames, self._pending = self._pending, []
        return self._form_leaf(frames)

    def flush(self) -> list[MemoryNode]:
        if not self._pending:
            return []
        frames, self._pending = self._pending, []
        return self._form_leaf(frames)

    @property
    def pending_frames(self) -> int:
        return len(self._pending)

    def _compress(self, points: torch.Tensor, k: int) -> torch.Tensor:
        from streammem_kernels import batched_kmeans

        k = min(k, points.shape[0])
        t0 = time.perf_counter()
        res = batched_kmeans(points, k, iters=self.kmeans_iters, seed=self.seed, backend=self.backend)
        self.timings["kmeans"] += time.perf_counter() - t0
        return res.centroids[0]

    def _embed(self, caption: str) -> torch.Tensor:
        t0 = time.perf_counter()
        emb = self.text_encoder.encode([caption])[0]
        self.timings["text_encode"] += time.perf_counter() - t0
        return F.normalize(emb.float(), dim=0)

    def _caption(self, fn, *args) -> str:
        t0 = time.perf_counter()
        text = fn(*args)
        self.timings["caption"] += time.perf_counter() - t0
        return text

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _form_leaf(self, frames: list[FrameRecord]) -> list[MemoryNode]:
        feats = torch.stack([f.feature.float() for f in frames])
        previous = self._last_leaf_caption()
        caption = self._caption(self.captioner.caption_frames, frames, previous)
        emb = self._embed(caption)
        if self.novelty_filter is not None and self.novelty_filter(emb, frames):
            return []
        node = MemoryNode(
            node_id=self._new_id(), level=0, t_start=frames[0].timestamp, t_end=frames[-1].timestamp,
            first_frame=frames[0].index, last_frame=frames[-1].index, caption=caption, embedding=emb,
            centres=self._compress(feats, self.centres),
            label_counts=Counter(label for f in frames for label in f.labels),
            created_at=frames[-1].timestamp, last_access=frames[-1].timestamp,
        )
        self._insert(node)
        created = [node]
        created.extend(self._grow())
        return created

    def _last_leaf_caption(self) -> str | None:
        leaves = self.roots_by_level.get(0)
        if leaves:
            return self.nodes[leaves[-1]].caption
        for node_id in sorted(self.nodes, reverse=True):
            if self.nodes[node_id].level == 0:
                return self.nodes[node_id].caption
        return None

    def _grow(self) -> list[MemoryNode]:
        """While some level holds g parentless nodes, the oldest g of the lowest such level get a parent."""
        created = []
        while True:
            full = sorted(level for level, ids in self.roots_by_level.items() if len(ids) >= self.group)
            if not full:
                return created
            level = full[0]
            child_ids = self.roots_by_level[level][: self.group]
            created.append(self._form_parent(child_ids))

    def _form_parent(self, child_ids: list[int]) -> MemoryNode:
        children = [self.nodes[i] for i in child_ids]
        caption = self._caption(self.captioner.summarize, children)
        counts: Counter = Counter()
        for c in children:
            counts.update(c.label_counts)
        node = MemoryNode(
            node_id=self._new_id(), level=children[0].level + 1, t_start=children[0].t_start,
            t_end=children[-1].t_end, first_frame=children[0].first_frame, last_frame=children[-1].last_frame,
            caption=caption, embedding=self._embed(caption),
            centres=self._compress(torch.cat([c.centres for c in children]), self.centres),
            label_counts=counts, children=list(child_ids), created_at=children[-1].created_at,
            last_access=max(c.last_access for c in children),
            merged=sum(c.merged for c in children),
        )
        self._insert(node)
        return node

    # ---- tree index ----------------------------------------------------
    def _insert(self, node: MemoryNode) -> None:
        """Add a node to the table, the grouping queue and the tree index."""
        self.nodes[node.node_id] = node
        for c in node.children:
            self.nodes[c].parent = node.node_id
            self.roots_by_level[node.level - 1].remove(c)
        self.roots_by_level.setdefault(node.level, []).append(node.node_id)
        t0 = time.perf_counter()
        self._index(node)
        self.timings["tree_insert"] += time.perf_counter() - t0

    def _index(self, node: MemoryNode) -> None:
        from streammem_kernels import CosineTree

        if self._tree is None:
            self._tree = CosineTree(node.embedding.shape[0])
        emb = node.embedding[None]
        if node.children:
            rows = [self._row_of[c] for c in node.children]
            row = int(self._tree.add_parent(torch.tensor(rows, dtype=torch.int64), emb[0],
                                            payload=node.node_id))
        else:
            row = int(torch.as_tensor(self._tree.add_leaves(emb, payload=torch.tensor([node.node_id]))).reshape(-1)[0])
        self._row_of[node.node_id] = row
        if row != len(self._node_of_row):
            raise RuntimeError(f"CosineTree assigned row {row}, expected {len(self._node_of_row)}")
        self._node_of_row.append(node.node_id)

    def rebuild_index(self) -> None:
        """Rebuild the tree index from the node table (after nodes were removed or merged).

        Nodes are re-added level by level in creation order, so the rebuilt tree
        has the same structure as the table and stays chronological.
        """
        t0 = time.perf_counter()
        self._tree = None
        self._row_of = {}
        self._node_of_row = []
        for node in sorted(self.nodes.values(), key=lambda n: (n.level, n.node_id)):
            self._index(node)
        self.timings["tree_rebuild"] += time.perf_counter() - t0

    @property
    def tree(self):
        return self._tree

    # ---- queries -------------------------------------------------------
    def search(self, query_embedding: torch.Tensor, *, now: float | None = None) -> tuple[list[MemoryNode], MemoryNode | None, list[float]]:
        """Greedy descent from the roots (Algorithm 1).

        Returns (path nodes root->leaf, best node seen, path scores).  Retrieved
        nodes have their access count and recency updated (for BoundedMemory).
        """
        from streammem_kernels import tree_search

        if self._tree is None or not self.nodes:
            return [], None, []
        q = F.normalize(torch.as_tensor(query_embedding, dtype=torch.float32).reshape(1, -1), dim=1)
        res = tree_search(self._tree, q)
        path_rows = [int(r) for r in res.path[0].tolist() if int(r) >= 0]
        scores = [float(s) for s, r in zip(res.path_scores[0].tolist(), res.path[0].tolist()) if int(r) >= 0]
        path = [self.nodes[self._node_of_row[r]] for r in path_rows]
        best = self.nodes[self._node_of_row[int(res.best_node[0])]]
        for node in {id(n): n for n in path + [best]}.values():
            node.access_count += 1
            if now is not None:
                node.last_access = max(node.last_access, now)
        return path, best, scores

    def levels(self) -> dict[int, int]:
        """Number of nodes per level."""
        return dict(sorted(Counter(n.level for n in self.nodes.values()).items()))
