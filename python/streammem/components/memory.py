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

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch
import torch.nn.functional as F

from ..checks import check_int, check_real
from ..config import MAX_KMEANS_ITERS, MAX_SEED
from ..models.encoders import encode_texts

__all__ = [
    "check_query_embedding",
    "FrameRecord",
    "records_state",
    "records_from_state",
    "ShortTermMemory",
    "Captioner",
    "LabelCaptioner",
    "caption_text",
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


def records_state(records: Sequence[FrameRecord]) -> dict:
    """Frame records as plain columns (tensors, lists), loadable with ``torch.load(weights_only=True)``."""
    return {
        "index": [int(r.index) for r in records],
        "timestamp": [float(r.timestamp) for r in records],
        "feature": torch.stack([r.feature for r in records]) if records else None,
        "labels": [list(r.labels) for r in records],
    }


def records_from_state(state: dict) -> list[FrameRecord]:
    """Inverse of ``records_state``."""
    if not state["index"]:
        return []
    feats = state["feature"]
    return [FrameRecord(i, t, feats[row].clone(), tuple(labels))
            for row, (i, t, labels) in enumerate(zip(state["index"], state["timestamp"], state["labels"]))]


def check_query_embedding(query_embedding, dim: int | None, name: str = "query_embedding") -> torch.Tensor:
    """``query_embedding`` as a finite float32 (E,) tensor (E == ``dim`` unless None); ValueError otherwise."""
    try:
        q = torch.as_tensor(query_embedding)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} must be a 1-d float tensor, got {type(query_embedding).__name__}") from exc
    q = q.reshape(-1) if q.dim() == 2 and q.shape[0] == 1 else q
    if q.dim() != 1 or not (q.is_floating_point() or q.dtype in (torch.int32, torch.int64)) or q.numel() == 0:
        raise ValueError(f"{name} must be a 1-d float tensor of shape (E,), got {q.dtype} {tuple(q.shape)}")
    if dim is not None and q.shape[0] != dim:
        raise ValueError(f"{name} must have {dim} entries (the text encoder's dim), got {q.shape[0]}")
    q = q.float()
    if not bool(torch.isfinite(q).all()):
        raise ValueError(f"{name} must be finite")
    return q


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

    Not thread-safe: one caller at a time (``sample`` advances the generator).
    """

    def __init__(self, candidates: int = 20, keep: int = 5, tau: float = 5.0, seed: int = 0):
        self.candidates = check_int(candidates, "candidates", 1)
        self.keep = check_int(keep, "keep", 1)
        self.tau = check_real(tau, "tau", 0.0, open_low=True)
        self._buffer: list[FrameRecord] = []
        self._generator = torch.Generator().manual_seed(check_int(seed, "seed", 0, MAX_SEED))

    def __len__(self) -> int:
        return len(self._buffer)

    def add(self, record: FrameRecord) -> None:
        self._buffer.append(record)
        if len(self._buffer) > self.candidates:
            del self._buffer[0]

    @property
    def feature_dim(self) -> int | None:
        """Feature columns of the buffered frames (None when empty)."""
        return int(self._buffer[-1].feature.shape[0]) if self._buffer else None

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

    def state_dict(self) -> dict:
        """The candidate frames and the sampler's generator state (so later samples repeat exactly)."""
        return {"buffer": records_state(self._buffer), "generator": self._generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self._buffer = records_from_state(state["buffer"])
        self._generator.set_state(state["generator"])


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


_SPAN_PREFIX = re.compile(r"^\s*\d+(?:\.\d+)?-\d+(?:\.\d+)?\s*s:\s*")


def caption_text(caption: str) -> str:
    """A caption without the leading time span that ``LabelCaptioner`` writes (``"3.0-4.0s: "``),
    for places that show the span already."""
    return _SPAN_PREFIX.sub("", caption, count=1)


class LabelCaptioner:
    """Names the most frequent frame labels (ImageNet classes) and the time span.

    ``"3.2-7.9s: taxicab, minivan, car mirror"``; a chunk without labels gets
    ``"3.2-7.9s: scene"``.  Deterministic and free, so it is the default.
    Thread-safe: no state.
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

    The memory owns its ``CosineTree`` index and keeps it equal to the node
    table: the table is only changed through this class (``add``, ``flush``,
    ``merge_leaves``, ``remove``), each of which updates the index in the same
    call.  ``BoundedMemory`` decides *what* to merge and remove; this class does it.

    Not thread-safe: one caller at a time, ``search`` included (it updates the
    retrieved nodes' access statistics).  ``StreamMemory`` and its schedulers
    serialise every call.
    """

    def __init__(self, text_encoder, captioner=None, *, chunk: int = 25, group: int = 10, centres: int = 5,
                 kmeans_iters: int = 10, seed: int = 0, backend: str = "auto"):
        self.text_encoder = text_encoder
        self.captioner = captioner if captioner is not None else LabelCaptioner()
        self.chunk = check_int(chunk, "chunk", 1)
        self.group = check_int(group, "group", 2)
        self.centres = check_int(centres, "centres", 1)
        self.kmeans_iters = check_int(kmeans_iters, "kmeans_iters", 1, MAX_KMEANS_ITERS)
        self.seed = check_int(seed, "seed", 0, MAX_SEED)
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
        # Optional callable(embedding, frames) -> bool (True: skip the new leaf), installed by BoundedMemory.
        self.novelty_filter = None

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

    def compress(self, points: torch.Tensor, k: int) -> torch.Tensor:
        """(min(k, n), D) k-means centres of (n, D) points (``batched_kmeans`` with this memory's seed)."""
        from streammem_kernels import batched_kmeans

        k = min(k, points.shape[0])
        t0 = time.perf_counter()
        res = batched_kmeans(points, k, iters=self.kmeans_iters, random_state=self.seed, backend=self.backend)
        self.timings["kmeans"] += time.perf_counter() - t0
        return res.centroids

    def _embed(self, caption: str) -> torch.Tensor:
        t0 = time.perf_counter()
        emb = encode_texts(self.text_encoder, [caption])[0]
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
            centres=self.compress(feats, self.centres),
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
            centres=self.compress(torch.cat([c.centres for c in children]), self.centres),
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
        """Rebuild the tree index from the node table (after nodes were edited by hand).

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
        """The ``CosineTree`` index (read it; change the memory through its methods), None when empty."""
        return self._tree

    def row_of(self, node_id: int) -> int:
        """Tree row of a node (rows change when removals compact the tree)."""
        return self._row_of[node_id]

    def node_at(self, row: int) -> MemoryNode:
        """The node stored at a tree row."""
        return self.nodes[self._node_of_row[row]]

    # ---- edits (used by BoundedMemory) -----------------------------------
    def nearest_leaf(self, embedding: torch.Tensor) -> tuple[float, MemoryNode] | None:
        """The live leaf whose caption embedding has the highest cosine with ``embedding`` (``cosine_topk``)."""
        tree = self._tree
        if tree is None or tree.num_nodes == 0:
            return None
        from streammem_kernels import cosine_topk

        leaf_rows = ((tree.level == 0) & tree.alive).nonzero()[:, 0]
        if leaf_rows.numel() == 0:
            return None
        res = cosine_topk(embedding.reshape(1, -1).float(), tree.embeddings[leaf_rows], 1)
        return float(res.scores[0, 0]), self.node_at(int(leaf_rows[int(res.ids[0, 0])]))

    def set_utility(self, utility: Callable[[MemoryNode], float]) -> None:
        """Write ``utility(node)`` of every node into the tree (used by utility-aware beam search)."""
        tree = self._tree
        if tree is None or tree.num_nodes == 0:
            return
        values = torch.tensor([utility(self.nodes[i]) for i in self._node_of_row], dtype=torch.float32)
        tree.set_utility(torch.arange(tree.num_nodes), values)

    def merge_leaves(self, pairs: Sequence[tuple[int, int]]) -> int:
        """Fold leaf b into leaf a for each (a, b); a keeps its id and its place among its siblings.

        The kept node's embedding becomes the normalised mean of both, its centres
        k-means over both nodes' centres, its span, counts and access statistics
        the union, and its caption the captioner's summary of it.  The pairs must
        be disjoint.  Table and index are updated together; returns the pairs merged.
        """
        seen: set[int] = set()
        for a_id, b_id in pairs:
            for i in (a_id, b_id):
                if i in seen or i not in self.nodes or self.nodes[i].level != 0:
                    raise ValueError(f"pairs must be disjoint pairs of live leaf ids, got {i!r} twice or not a leaf")
                seen.add(i)
        folded = []
        for a_id, b_id in pairs:
            a, b = self.nodes[a_id], self.nodes[b_id]
            a.embedding = F.normalize(a.embedding + b.embedding, dim=0)
            a.centres = self.compress(torch.cat([a.centres, b.centres]), self.centres)
            a.label_counts = a.label_counts + b.label_counts
            a.t_start, a.t_end = min(a.t_start, b.t_start), max(a.t_end, b.t_end)
            a.first_frame, a.last_frame = min(a.first_frame, b.first_frame), max(a.last_frame, b.last_frame)
            a.access_count += b.access_count
            a.last_access = max(a.last_access, b.last_access)
            a.merged += b.merged
            a.caption = self.captioner.summarize([a]) if hasattr(self.captioner, "summarize") else a.caption
            folded.append(b_id)
        if pairs and self._tree is not None:
            kept = [a for a, _ in pairs]
            t0 = time.perf_counter()
            self._tree.set_embeddings([self._row_of[i] for i in kept], torch.stack([self.nodes[i].embedding for i in kept]))
            self.timings["tree_remove"] += time.perf_counter() - t0
        self.remove(folded)
        return len(pairs)

    def remove(self, node_ids: Sequence[int]) -> list[int]:
        """Remove nodes, then every parent left without children (up the tree), from table and index.

        Children of a removed parent become parentless (and are not re-queued for
        grouping).  The index is updated in place: the rows are tombstoned
        (``CosineTree.remove``) and the tree compacted; surviving rows keep their
        relative (creation) order.  Returns the removed ids: ``node_ids`` first,
        then the emptied parents.
        """
        node_ids = [int(i) for i in node_ids]
        if len(set(node_ids)) != len(node_ids) or any(i not in self.nodes for i in node_ids):
            raise ValueError(f"node_ids must be distinct live node ids, got {node_ids}")
        removed = list(node_ids)
        frontier = {self._unlink(i) for i in node_ids}
        while frontier - {None}:
            emptied = sorted(p for p in frontier if p is not None and p in self.nodes and not self.nodes[p].children)
            frontier = {self._unlink(p) for p in emptied}
            removed.extend(emptied)
        tree = self._tree
        rows = sorted(self._row_of[i] for i in removed if i in self._row_of)
        if tree is not None and rows:
            t0 = time.perf_counter()
            gone = tree.remove(rows).tolist()
            if gone != rows:
                # The table removes emptied parents itself; the tree must agree row for row.
                raise RuntimeError(f"CosineTree removed rows {gone}, the node table removed rows {rows}")
            mapping = tree.compact().tolist()
            self._node_of_row = [node for row, node in enumerate(self._node_of_row) if mapping[row] >= 0]
            self._row_of = {node: row for row, node in enumerate(self._node_of_row)}
            self.timings["tree_remove"] += time.perf_counter() - t0
        return removed

    def _unlink(self, node_id: int) -> int | None:
        """Take a node out of the table; returns its parent id (where the removal cascade continues)."""
        node = self.nodes.pop(node_id)
        if node.parent is not None and node.parent in self.nodes:
            self.nodes[node.parent].children.remove(node_id)
        queue = self.roots_by_level.get(node.level)
        if queue is not None and node_id in queue:
            queue.remove(node_id)
        for c in node.children:
            if c in self.nodes:
                self.nodes[c].parent = None
        return node.parent

    # ---- queries -------------------------------------------------------
    def search(self, query_embedding: torch.Tensor, *, now: float | None = None) -> tuple[list[MemoryNode], MemoryNode | None, list[float]]:
        """Greedy descent from the roots (Algorithm 1).

        Returns (path nodes root->leaf, best node seen, path scores).  Retrieved
        nodes have their access count and recency updated (for BoundedMemory).
        """
        from streammem_kernels import tree_search

        dim = None if self._tree is None else int(self._tree.embeddings.shape[1])
        q = check_query_embedding(query_embedding, dim)
        if self._tree is None or not self.nodes:
            return [], None, []
        q = F.normalize(q[None], dim=1)
        res = tree_search(self._tree, q)
        path_rows = [int(r) for r in res.path[0].tolist() if int(r) >= 0]
        scores = [float(s) for s, r in zip(res.path_scores[0].tolist(), res.path[0].tolist()) if int(r) >= 0]
        path = [self.node_at(r) for r in path_rows]
        best = self.node_at(int(res.best_node[0]))
        for node in {id(n): n for n in path + [best]}.values():
            node.access_count += 1
            if now is not None:
                node.last_access = max(node.last_access, now)
        return path, best, scores

    def levels(self) -> dict[int, int]:
        """Number of nodes per level."""
        return dict(sorted(Counter(n.level for n in self.nodes.values()).items()))

    # ---- checkpoints ---------------------------------------------------
    def state_dict(self) -> dict:
        """Node table (in table order), open chunk, grouping queue, the tree index and its row map.

        Only tensors, numbers, strings, lists and dicts: ``torch.load(weights_only=True)`` reads it.
        """
        nodes = list(self.nodes.values())
        return {
            "next_id": self._next_id,
            "nodes": _nodes_state(nodes),
            "pending": records_state(self._pending),
            "roots_by_level": [[level, list(ids)] for level, ids in self.roots_by_level.items()],
            "tree": None if self._tree is None else self._tree.state_dict(),
            "node_of_row": list(self._node_of_row),
            "timings": dict(self.timings),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()`` output; the tree is restored row for row (not rebuilt)."""
        nodes = _nodes_from_state(state["nodes"])
        self.nodes = {n.node_id: n for n in nodes}
        self._next_id = int(state["next_id"])
        self._pending = records_from_state(state["pending"])
        self.roots_by_level = {int(level): list(ids) for level, ids in state["roots_by_level"]}
        self._tree = None if state["tree"] is None else _tree_from_state(state["tree"])
        self._node_of_row = list(state["node_of_row"])
        self._row_of = {node: row for row, node in enumerate(self._node_of_row)}
        if set(self._node_of_row) != set(self.nodes) or (self._tree is not None
                                                         and self._tree.num_nodes != len(self._node_of_row)):
            raise ValueError("state holds a tree index that does not match its node table")
        self.timings = Counter(state.get("timings", {}))


_NODE_SCALARS = ("node_id", "level", "t_start", "t_end", "first_frame", "last_frame", "caption", "parent",
                 "created_at", "last_access", "access_count", "merged")


def _nodes_state(nodes: Sequence[MemoryNode]) -> dict:
    state = {name: [getattr(n, name) for n in nodes] for name in _NODE_SCALARS}
    state["children"] = [list(n.children) for n in nodes]
    state["label_counts"] = [dict(n.label_counts) for n in nodes]
    state["embedding"] = torch.stack([n.embedding for n in nodes]) if nodes else None
    state["centres_count"] = [int(n.centres.shape[0]) for n in nodes]
    state["centres"] = torch.cat([n.centres for n in nodes]) if nodes else None
    return state


def _nodes_from_state(state: dict) -> list[MemoryNode]:
    n = len(state["node_id"])
    if n == 0:
        return []
    centres = torch.split(state["centres"], state["centres_count"])
    nodes = []
    for i in range(n):
        kwargs = {name: state[name][i] for name in _NODE_SCALARS}
        nodes.append(MemoryNode(**kwargs, embedding=state["embedding"][i].clone(), centres=centres[i].clone(),
                                label_counts=Counter(state["label_counts"][i]), children=list(state["children"][i])))
    return nodes


def _tree_from_state(state):
    """A ``CosineTree`` from its ``state_dict()`` (or a reader of one), through its own validation."""
    from streammem_kernels import CosineTree

    return CosineTree.from_state_dict(state)
