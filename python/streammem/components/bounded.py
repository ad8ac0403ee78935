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

This class only decides what to merge and what to remove; ``LongTermMemory``
does it (``merge_leaves``, ``remove``), keeping its node table and its
``CosineTree`` index equal in the same call: merged nodes get their new
embedding (``set_embeddings``), the removed nodes' rows are tombstoned
(``CosineTree.remove``, which also drops the parents left without a live child
-- exactly the parents of step 3, checked) and the tree is compacted, never
rebuilt.  Surviving rows keep their relative (creation) order, so the tree
stays chronological.

Novelty check on insert: a new leaf whose caption embedding has cosine
>= theta_concept with an existing leaf (``cosine_topk``) is skipped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..checks import check_int, check_real
from .memory import LongTermMemory, MemoryNode

__all__ = ["BoundedMemory", "EvictionReport", "TreeEvictionReport", "utility"]


def utility(access_count, last_access, now, *, alpha: float = 0.6, beta: float = 0.4, tau: float = 60.0):
    """The utility rule u = alpha * log(f + 1) + beta * exp(-max(0, now - last_access) / tau).

    ``access_count`` (f) and ``last_access`` are numbers or tensors of one
    shape (then ``u`` is a float64 tensor); ``BoundedMemory`` scores tree nodes
    with it, and ``streammem.recipes.memverse`` the chunks and relations of its graph.
    """
    if isinstance(access_count, torch.Tensor) or isinstance(last_access, torch.Tensor):
        f = torch.as_tensor(access_count, dtype=torch.float64)
        dt = (float(now) - torch.as_tensor(last_access, dtype=torch.float64)).clamp_min(0.0)
        return alpha * torch.log1p(f) + beta * torch.exp(-dt / tau)
    dt = max(0.0, float(now) - float(last_access))
    return alpha * math.log(access_count + 1) + beta * math.exp(-dt / tau)


@dataclass
class EvictionReport:
    """One budget round of a bounded memory: its cost before and after the round, in the memory's own
    unit (tokens for ``BoundedMemory``, words for MemVerse's graph).  Each memory reports what the
    round removed in a subclass named for what it holds."""

    cost_before: int = 0
    cost_after: int = 0


@dataclass
class TreeEvictionReport(EvictionReport):
    """A ``BoundedMemory`` round: sibling leaves merged, leaves removed, parents emptied and removed."""

    merged: int = 0
    removed_leaves: int = 0
    removed_parents: int = 0


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

    Every parameter is validated (finite, in range; ``ValueError`` naming it).
    Not thread-safe: ``enforce`` edits the memory it manages, so it runs in
    the thread that forms that memory (``StreamMemory.form`` calls it).
    """

    def __init__(self, memory: LongTermMemory, budget: int, *, alpha: float = 0.6, beta: float = 0.4,
                 tau: float = 60.0, theta_sim: float = 0.85, theta_concept: float | None = 0.95,
                 tokens_per_centre: int = 1, low_water: float = 0.8):
        self.memory = memory
        self.budget = check_int(budget, "budget", 1)
        self.alpha = check_real(alpha, "alpha", 0.0)
        self.beta = check_real(beta, "beta", 0.0)
        self.tau = check_real(tau, "tau", 0.0, open_low=True)
        self.theta_sim = check_real(theta_sim, "theta_sim", -1.0, 1.0)
        self.theta_concept = None if theta_concept is None else check_real(theta_concept, "theta_concept", -1.0, 1.0)
        self.tokens_per_centre = check_int(tokens_per_centre, "tokens_per_centre", 1)
        self.low_water = check_real(low_water, "low_water", 0.0, 1.0, open_low=True)
        self.stats = BoundedStats()
        self.now = 0.0
        if self.theta_concept is not None:
            memory.novelty_filter = self._is_redundant

    # ---- scores --------------------------------------------------------
    def cost(self, node: MemoryNode) -> int:
        return int(node.centres.shape[0]) * self.tokens_per_centre + len(node.caption.split())

    def utility(self, node: MemoryNode, now: float | None = None) -> float:
        now = self.now if now is None else now
        return utility(node.access_count, node.last_access, now, alpha=self.alpha, beta=self.beta, tau=self.tau)

    def total_cost(self) -> int:
        return sum(self.cost(n) for n in self.memory.nodes.values())

    # ---- novelty -------------------------------------------------------
    def _is_redundant(self, embedding: torch.Tensor, frames) -> bool:
        nearest = self.memory.nearest_leaf(embedding)
        if nearest is None or nearest[0] < self.theta_concept:
            return False
        self.stats.skipped_redundant += 1
        matched = nearest[1]
        matched.last_access = max(matched.last_access, frames[-1].timestamp)
        return True

    # ---- enforcement ---------------------------------------------------
    def enforce(self, now: float) -> TreeEvictionReport | None:
        """Bring the memory within budget if it is over; returns what was done (None: nothing)."""
        self.now = check_real(now, "now")
        total = self.total_cost()
        self.stats.peak_cost = max(self.stats.peak_cost, total)
        if total <= self.budget:
            return None
        report = TreeEvictionReport(cost_before=total)
        target = self.low_water * self.budget
        report.merged = self._merge_similar_leaves()
        total = self.total_cost()
        doomed = []
        if total > target:
            leaves = [n for n in self.memory.nodes.values() if n.level == 0]
            # Least utility per token first; older first among equals.
            leaves.sort(key=lambda n: (self.utility(n) / max(1, self.cost(n)), n.node_id))
            for leaf in leaves:
                if total <= target:
                    break
                total -= self.cost(leaf)
                doomed.append(leaf.node_id)
        removed = self.memory.remove(doomed)
        report.removed_leaves = len(doomed)
        report.removed_parents = len(removed) - len(doomed)
        self.memory.set_utility(self.utility)
        report.cost_after = self.total_cost()
        self.stats.rounds += 1
        self.stats.merged += report.merged
        self.stats.removed_leaves += report.removed_leaves
        self.stats.removed_parents += report.removed_parents
        return report

    def _siblings(self) -> list[list[MemoryNode]]:
        groups: dict[int | None, list[MemoryNode]] = {}
        for n in self.memory.nodes.values():
            if n.level == 0:
                groups.setdefault(n.parent, []).append(n)
        return [sorted(g, key=lambda n: n.t_start) for g in groups.values()]

    def _merge_similar_leaves(self) -> int:
        """Merge time-adjacent sibling leaves whose caption embeddings have cosine > theta_sim."""
        pairs = []
        for group in self._siblings():
            i = 0
            while i + 1 < len(group):
                a, b = group[i], group[i + 1]
                if float(a.embedding @ b.embedding) > self.theta_sim:
                    pairs.append((a.node_id, b.node_id))  # b folds into a (a is earlier)
                    i += 2
                else:
                    i += 1
        return self.memory.merge_leaves(pairs)

    # ---- checkpoints ---------------------------------------------------
    def state_dict(self) -> dict:
        s = self.stats
        return {"now": self.now, "stats": {k: getattr(s, k) for k in s.__dataclass_fields__}}

    def load_state_dict(self, state: dict) -> None:
        self.now = float(state["now"])
        self.stats = BoundedStats(**state["stats"])
