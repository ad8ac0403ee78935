"""The MemVerse recipe's hit rate on a planted-fact memory: graph, flat and hybrid retrieval against the
ground-truth evidence of every question."""
from __future__ import annotations

from dataclasses import replace

import torch

from .extraction import MemoryChunk
from .graph import interleave
from .hops import Resolution, resolve_possessives
from .memory import MemVerse
from .synthetic import PlantedFactMemory

__all__ = ["hit_rates"]


def hit_rates(memory: MemVerse, data: PlantedFactMemory, chunks: list[MemoryChunk], ks=(4, 8, 16),
              **changes) -> dict:
    """Evidence hit rates of the graph search, the flat baseline and the hybrid, per question kind and K.

    ``hit@K``: every evidence chunk of the question is among the first K
    chunks returned; ``answer@K``: the last evidence chunk (the one holding the
    answer) is.  Each method runs once with ``chunks = max(ks)`` and is read at
    each K (no ranking depends on K).  ``changes`` override fields of the
    memory's config for the graph search (``seeds``, ``ranking``,
    ``resolve_possessives``, ...).  The graph is asked each question as
    ``MemVerse.ask`` asks it (possessives resolved, ``MemVerse.resolve``), and
    so is the hybrid's flat half; the flat baseline as written.
    Keys: ``(method, kind, K)`` with kind in single / two-hop / cross-modal / all.
    """
    questions = data.questions
    q = memory.encode_questions([x.question for x in questions])
    top = max(ks)
    cfg = replace(memory.config, chunks=top, **changes)
    memory.consolidate()
    resolved = [Resolution(x.question) for x in questions]
    if cfg.resolve_possessives:
        resolved = [resolve_possessives(memory.graph, x.question, memory.encode_questions) for x in questions]
    q_graph = memory.encode_questions([r.question for r in resolved])
    width = max(1, max(len(r.bridges) for r in resolved))
    bridges = torch.tensor([list(r.bridges) + [-1] * (width - len(r.bridges)) for r in resolved])
    hits = memory.graph.search(q_graph, seeds=cfg.seeds, hops=cfg.hops, capacity=cfg.capacity,
                               max_fanout=cfg.max_fanout, max_frontier=cfg.max_frontier, min_score=cfg.min_score,
                               chunks=top, chunks_per_node=cfg.chunks_per_node, ranking=cfg.ranking, bridges=bridges)
    flat_rows, _ = memory.graph.search_flat(q, top)
    # The hybrid's flat half is asked the resolved question too (the flat mode never resolves).
    changed = torch.tensor([r.question != x.question for r, x in zip(resolved, questions)])
    resolved_rows = torch.where(changed[:, None], memory.graph.search_flat(q_graph, top)[0], flat_rows)
    ids_of_row = torch.tensor([c.chunk_id for c in memory.graph.chunks] + [-1])  # row -1 -> id -1
    ranked = {"graph": ids_of_row[hits.chunks].tolist(), "flat": ids_of_row[flat_rows].tolist()}
    ranked["hybrid"] = [[c for c, in interleave([(c,) for c in f if c >= 0], [(c,) for c in g if c >= 0], top)]
                        for f, g in zip(ids_of_row[resolved_rows].tolist(), ranked["graph"])]
    out: dict = {}
    for method, lists in ranked.items():
        for kind in ("single", "two-hop", "cross-modal", "all"):
            rows = [i for i, x in enumerate(questions) if kind in ("all", x.kind)]
            if not rows:
                continue
            for k in ks:
                full = answer = 0
                for i in rows:
                    got = set(lists[i][:k])
                    wanted = [chunks[j].chunk_id for j in questions[i].evidence]
                    full += all(w in got for w in wanted)
                    answer += wanted[-1] in got
                out[method, kind, k] = {"hit": full / len(rows), "answer": answer / len(rows), "n": len(rows)}
    return out
