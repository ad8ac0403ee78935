"""LongTermGraph's eviction and scan copies on a seeded graph: the same tables, maps, CSRs and answers as
the list-based eviction they replaced (a digest recorded from it), and the same answers whichever scan
copy the indexes keep."""
import hashlib
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from streammem.recipes.memverse import Extraction, LongTermGraph, MemoryChunk

DIM, PREDICATES = 24, ("likes", "near", "owns", "visited")
# sha256 of history() for the seeded stream below, recorded with the eviction that rebuilt the texts,
# predicates and chunk lists (itertools.compress) and without scan copies.
RECORDED = "dec297bddeef0f336c9591075036781077692f50e8c0da9a03ce8f6b9ebd72c4"


def batch(first: int, count: int, rng: np.random.Generator, g: torch.Generator):
    """Chunks first.. mentioning two new entities and two older ones, with two relations each."""
    chunks, exts = [], []
    emb = F.normalize(torch.randn(count, DIM, generator=g), dim=1)
    for row, c in enumerate(range(first, first + count)):
        old = rng.integers(0, max(1, 2 * c), 2)
        names = [f"entity {e}" for e in (2 * c, 2 * c + 1, int(old[0]), int(old[1]))]
        pred = rng.integers(len(PREDICATES), size=2)
        chunks.append(MemoryChunk(c, 0, float(c), float(c), "text", f"chunk {c} " + " ".join(names), (),
                                  embedding=emb[row]))
        exts.append(Extraction(tuple(names), ((names[0], PREDICATES[pred[0]], names[2]),
                                              (names[1], PREDICATES[pred[1]], names[3]))))
    return chunks, exts


def history(scan_copy: str) -> dict:
    """Consolidations, retrievals, evictions and searches of one seeded stream, as plain data."""
    rng, g = np.random.default_rng(7), torch.Generator().manual_seed(7)
    graph = LongTermGraph(DIM, scan_copy=scan_copy)
    embed = lambda texts: torch.randn(len(texts), DIM, generator=g)  # noqa: E731
    out, first = {"reports": [], "searches": []}, 0
    queries = F.normalize(torch.randn(3, DIM, generator=g), dim=1)
    for step in range(6):
        count = 150 if step == 0 else 20
        chunks, exts = batch(first, count, rng, g)
        graph.consolidate(chunks, exts, embed, now=float(first + count))
        first += count
        hits = graph.search(queries, seeds=4, hops=2, capacity=64, chunks=6)
        graph.touch(hits.nodes[:, :8], hits.chunks, now=float(first))
        out["searches"].append([hits.seeds.tolist(), hits.seed_scores.tolist(), hits.nodes.tolist(),
                                hits.chunks.tolist(), graph.search_flat(queries, 5)[0].tolist()])
        report = graph.evict(int(graph.cost() * (0.7 if step % 2 else 0.95)), float(first), low_water=0.9)
        out["reports"].append(None if report is None else [report.chunks, report.relations, report.entities,
                                                           report.cost_before, report.cost_after])
    state = graph.state_dict()
    out["texts"], out["predicates"] = list(graph.texts), list(graph.predicates)
    out["chunks"] = [c.chunk_id for c in graph.chunks]
    for key in ("kind", "head", "tail", "access", "last", "created", "cost", "chunk_access", "chunk_last"):
        out[key] = state[key].tolist()
    out["adjacency"] = [t.tolist() for t in state["adjacency"]]
    out["chunk_links"] = [t.tolist() for t in state["chunk_links"]]
    out["entity_ids"] = [graph.entity_id(t) for t in graph.texts]
    out["relation_ids"] = [graph.relation_id(graph.texts[h], p, graph.texts[t]) if k else None
                           for k, h, t, p in zip(out["kind"], out["head"], out["tail"], out["predicates"])]
    out["embedding"] = hashlib.sha256(state["embedding"].numpy().tobytes()).hexdigest()
    return out


def digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def plain():
    return history("none")


def test_eviction_matches_the_recorded_list_based_eviction(plain):
    assert sum(r is not None for r in plain["reports"]) >= 3  # the stream does evict
    assert digest(plain) == RECORDED


@pytest.mark.parametrize("scan_copy", ["int8", "float16"])
def test_scan_copies_change_nothing(plain, scan_copy):
    assert history(scan_copy) == plain


def test_texts_are_a_sequence_by_node_id():
    graph = LongTermGraph(DIM)
    rng, g = np.random.default_rng(1), torch.Generator().manual_seed(1)
    chunks, exts = batch(0, 30, rng, g)
    graph.consolidate(chunks, exts, lambda texts: torch.randn(len(texts), DIM, generator=g), now=30.0)
    texts = list(graph.texts)
    assert graph.texts == texts and texts == graph.texts and graph.texts != texts[:-1]
    assert graph.texts[-1] == texts[-1] and graph.texts[2:5] == texts[2:5] and len(graph.texts) == graph.num_nodes
    with pytest.raises(IndexError):
        graph.texts[len(texts)]
    assert graph.evict(int(graph.cost() * 0.5), 31.0) is not None
    kept = iter(texts)  # the survivors, in their order
    assert all(any(t == s for s in kept) for t in graph.texts) and len(graph.texts) < len(texts)
    assert len(graph.chunks) == graph.num_chunks == len(list(graph.chunks))
