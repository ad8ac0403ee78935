"""Bounded memory growth (ProStream sec. 5.3, MemVerse): utility, eviction, merging, novelty.

Node utility u = alpha * log(f + 1) + beta * exp(-dt / tau) from the node's
access count f (times retrieved by a question) and the stream time dt since it
was last retrieved (or created).  A node's token cost c is what it would put in
a prompt: its C centre features (``tokens_per_centre`` tokens each) plus its
caption's words.  When the total cost exceeds the budget:

1. leaf pairs that are siblings, adjacent in time and whose caption embeddings
   have cosine > theta_sim are merged into one node (embedding: the normalised
   mean; centres: k-means over both; counts and spans combined);
2. leaves are removed by least u / c first until the total is at most
   ``low_water`` x budget (hysteresis, so the index is not rebuilt per frame);
3. parents left without any leaf below them are removed.

The memory's ``CosineTree`` index is updated in place at the end of a round,
never rebuilt: merged nodes get their new embedding (``set_embeddings``), the
removed nodes' rows are tombstoned (``CosineTree.remove``, which also drops
the parents left without a live child -- exactly the parents of step 3, checked)
and the tree is compacted (``CosineTree.compact``), whose old -> new row map
updates the memory's row <-> node tables.  Surviving rows keep their relative
order (creation order), so the tree stays chronological.

Novelty check on insert: a new leaf whose caption embedding has cosine
>= theta_concept with an existing leaf (``cosine_topk``) is skipped.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .memory import LongTermMemory, MemoryNode

__all__ = ["BoundedMemory", "EvictionReport"]


@dataclass
class EvictionReport:
    merged: int = 0
    removed_leaves: int = 0
    removed_parents: int = 0
    cost_before: int = 0
    cost_after: int = 0


@dataclass
class BoundedStats:
    rounds: int = 0
    merged: int = 0
    removed_leaves: int = 0
    removed_parents: int = 0
    skipped_redundant: int = 0
    peak_cost: int = 0


class BoundedMemory:
    """Keeps a ``LongTermMemory`` within a token budget.

    Parameters
    ----------
    memory : LongTermMemory
        Managed in place; its novelty filter is installed here.
    budget : int
        Token budget for all nodes together.
    alpha, beta : float
        Utility weights (0.6, 0.4).
    tau : float
        Recency constant in stream seconds.
    theta_sim : float
        Merge threshold on caption-embedding cosine (0.85).
    theta_concept : float or None
        Novelty threshold on insert; None disables the check.
    tokens_per_centre : int
        Prompt tokens one centre feature costs.
    low_water : float in (0, 1]
        After an eviction round the total cost is at most low_water x budget.
    """

    def __init__(self, memory: LongTermMemory, budget: int, *, alpha: float = 0.6, beta: float = 0.4,
                 tau: float = 60.0, theta_sim: float = 0.85, theta_concept: float | None = 0.95,
                 tokens_per_centre: int = 1, low_water: float = 0.8):
        if isinstance(budget, bool) or int(budget) != budget or budget < 1:
            raise ValueError(f"budget must be an int >= 1, got {budget!r}")
        if not float(tau) > 0:
            raise ValueError(f"tau must be > 0, got {tau!r}")
        if not 0.0 < float(low_water) <= 1.0:
            raise ValueError(f"low_water must be in (0, 1], got {low_water!r}")
        if not -1.0 <= float(theta_sim) <= 1.0:
            raise ValueError(f"theta_sim must be in [-1, 1], got {theta_sim!r}")
        self.memory = memory
        self.budget = int(budget)
        self.alpha, self.beta, self.tau = float(alpha), float(beta), float(tau)
        self.theta_sim = float(theta_sim)
        self.theta_concept = None if theta_concept is None else float(theta_concept)
        self.tokens_per_centre = int(tokens_per_centre)
        self.low_water = float(low_water)
        self.stats = BoundedStats()
        self.now = 0.0
        # Table changes of the current round, applied to the tree index at its end.
        self._removed_nodes: list[int] = []
        self._reembedded_nodes: set[int] = set()
        if self.theta_concept is not None:
            memory.novelty_filter = self._is_redundant

    # ---- scores --------------------------------------------------------
    def cost(self, node: MemoryNode) -> int:
        return int(node.centres.shape[0]) * self.tokens_per_centre + len(node.caption.split())

    def utility(self, node: MemoryNode, now: float | None = None) -> float:
        now = self.now if now is None else now
        dt = max(0.0, now - node.last_access)
        return self.alpha * math.log(node.access_count + 1) + self.beta * math.exp(-dt / self.tau)

    def total_cost(self) -> int:
        return sum(self.cost(n) for n in self.memory.nodes.values())

    # ---- novelty -------------------------------------------------------
    def _is_redundant(self, embedding: torch.Tensor, frames) -> bool:
        tree = self.memory.tree
        if tree is None or tree.num_nodes == 0:
            return False
        from streammem_kernels import cosine_topk

        leaf_rows = ((tree.level == 0) & tree.alive).nonzero()[:, 0]
        if leaf_rows.numel() == 0:
            return False
        keys = tree.embeddings[leaf_rows]
        res = cosine_topk(embedding.reshape(1, -1).float(), keys, 1)
        best = float(res.scores[0, 0])
        if best >= self.theta_concept:
            self.stats.skipped_redundant += 1
            matched = self.memory.nodes[self.memory._node_of_row[int(leaf_rows[int(res.ids[0, 0])])]]
            matched.last_access = max(matched.last_access, frames[-1].timestamp)
            return True
        return False

    # ---- enforcement ---------------------------------------------------
    def enforce(self, now: float) -> EvictionReport | None:
        """Bring the memory within budget if it is over; returns what was done (None: nothing)."""
        self.now = float(now)
        total = self.total_cost()
        self.stats.peak_cost = max(self.stats.peak_cost, total)
        if total <= self.budget:
            return None
        report = EvictionReport(cost_before=total)
        target = self.low_water * self.budget
        report.merged = self._merge_similar_leaves()
        total = self.total_cost()
        if total > target:
            leaves = [n for n in self.memory.nodes.values() if n.level == 0]
            # Least utility per token first; older first among equals.
            leaves.sort(key=lambda n: (self.utility(n) / max(1, self.cost(n)), n.node_id))
            for leaf in leaves:
                if total <= target:
                    break
                total -= self.cost(leaf)
                self._remove(leaf.node_id)
                report.removed_leaves += 1
        report.removed_parents = self._remove_empty_parents()
        self._update_index()
        tree = self.memory.tree
        if tree is not None and tree.num_nodes:
            util = torch.tensor([self.utility(self.memory.nodes[i]) for i in self.memory._node_of_row])
            tree.set_utility(torch.arange(tree.num_nodes), util)
        report.cost_after = self.total_cost()
        self.stats.rounds += 1
        self.stats.merged += report.merged
        self.stats.removed_leaves += report.removed_leaves
        self.stats.removed_parents += report.removed_parents
        return report

    def _update_index(self) -> None:
        """Apply this round's merges and removals to the memory's tree index."""
        mem = self.memory
        removed, self._removed_nodes = self._removed_nodes, []
        reembedded = sorted(i for i in self._reembedded_nodes if i in mem.nodes)
        self._reembedded_nodes = set()
        tree = mem.tree
        if tree is None:
            return
        t0 = time.perf_counter()
        if reembedded:
            tree.set_embeddings([mem._row_of[i] for i in reembedded],
                                torch.stack([mem.nodes[i].embedding for i in reembedded]))
        if removed:
            rows = sorted(mem._row_of[i] for i in removed)
            gone = tree.remove(rows).tolist()
            if gone != rows:
                # The table removes emptied parents itself; the tree must agree row for row.
                raise RuntimeError(f"CosineTree removed rows {gone}, the node table removed rows {rows}")
            mapping = tree.compact().tolist()
            mem._node_of_row = [node for row, node in enumerate(mem._node_of_row) if mapping[row] >= 0]
            mem._row_of = {node: row for row, node in enumerate(mem._node_of_row)}
        mem.timings["tree_remove"] += time.perf_counter() - t0

    def _siblings(self) -> list[list[MemoryNode]]:
        groups: dict[int | None, list[MemoryNode]] = {}
        for n in self.memory.nodes.values():
            if n.level == 0:
                groups.setdefault(n.parent, []).append(n)
        return [sorted(g, key=lambda n: n.t_start) for g in groups.values()]

    def _merge_similar_leaves(self) -> int:
        merged = 0
        for group in self._siblings():
            i = 0
            while i + 1 < len(group):
                a, b = group[i], group[i + 1]
                if float(a.embedding @ b.embedding) > self.theta_sim:
                    self._merge(a, b)
                    merged += 1
                    i += 2
                else:
                    i += 1
        return merged

    def _merge(self, a: MemoryNode, b: MemoryNode) -> None:
        """Fold b into a (a is earlier): a keeps its id and its place among its siblings."""
        mem = self.memory
        a.embedding = F.normalize(a.embedding + b.embedding, dim=0)
        a.centres = mem._compress(torch.cat([a.centres, b.centres]), mem.centres)
        a.label_counts = a.label_counts + b.label_counts
        a.t_start, a.t_end = min(a.t_start, b.t_start), max(a.t_end, b.t_end)
        a.first_frame, a.last_frame = min(a.first_frame, b.first_frame), max(a.last_frame, b.last_frame)
        a.access_count += b.access_count
        a.last_access = max(a.last_access, b.last_access)
        a.merged += b.merged
        a.caption = mem.captioner.summarize([a]) if hasattr(mem.captioner, "summarize") else a.caption
        self._reembedded_nodes.add(a.node_id)
        self._remove(b.node_id)

    def _remove(self, node_id: int) -> None:
        mem = self.memory
        node = mem.nodes.pop(node_id)
        if node_id in mem._row_of:
            self._removed_nodes.append(node_id)
        if node.parent is not None and node.parent in mem.nodes:
            mem.nodes[node.parent].children.remove(node_id)
        queue = mem.roots_by_level.get(node.level)
        if queue is not None and node_id in queue:
            queue.remove(node_id)
        for c in node.children:
            if c in mem.nodes:
                mem.nodes[c].parent = None

    def _remove_empty_parents(self) -> int:
        removed = 0
        mem = self.memory
        for level in sorted({n.level for n in mem.nodes.values() if n.level > 0}):
            for node in [n for n in mem.nodes.values() if n.level == level and not n.children]:
                self._remove(node.node_id)
                removed += 1
        return removed
