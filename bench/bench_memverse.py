"""MemVerse recipe at 10^3..10^6 entities: question latency, consolidation (CSR extension vs rebuild), eviction.

Run:  OMP_NUM_THREADS=1 .venv/bin/python -m pytest bench/bench_memverse.py -q -p no:cacheprovider \
          --benchmark-json bench/results/memverse.json
      (``STREAMMEM_BENCH_QUICK=1``: N in {10^3, 10^4} only)

Data, per N (entities) in {10^3, 10^4, 10^5, 10^6}: a ``LongTermGraph`` built
through the recipe's own consolidation (one bulk batch) from N/2 chunks, each
mentioning 4 entities -- two new ones and two within 16 chunks of it in time
(10 %: anywhere in the stream) -- and stating 2 relations among them (8
predicates): N entities, ~N relations, ~8N adjacency entries, ~3.5N chunk
links; D = 384 unit-norm random embeddings (MiniLM's width) for nodes and
chunks; questions = embeddings of random relation nodes plus noise.

Measured, side by side at each N:

* ``memverse graph search`` -- ``LongTermGraph.search`` with the default
  ``MemVerseConfig`` (4 seeds by cosine over 2N node embeddings, read first
  from the default int8 scan copy and rescored exactly, 2 hops,
  fan-out 16, capacity 512, seed round-robin ranking, 8 chunks, 2 per node):
  what ``MemVerse.ask`` runs after encoding the question (Q = 1 and 16);
  ``extra_info`` splits it into top-k + expansion, ranking, chunk gather;
* ``flat cosine top-k over chunks`` -- the baseline, ``cosine_topk`` over N/2 chunk embeddings;
* ``consolidate 4 chunks`` -- one default consolidation batch into the graph
  (tables, embeddings of the new nodes, ``extend_csr`` of both CSRs, the
  ``CSRGraph`` checks), next to ``rebuild both CSRs (from_edges)`` -- the
  alternative: sorting every entry again (weight = insertion order, so both
  give the same CSR);
* ``evict 1 %`` -- a budget round removing 1 % of the words (``compact_csr`` of
  both CSRs, tables, name keys); last, since it shrinks the graph.

Retrieval quality (``test_planted_fact_hit_rates``, not a timing: no
``benchmark`` fixture; ``-k hit_rates`` runs it alone, ~4 min on a loaded
2-core machine; with ``STREAMMEM_BENCH_QUICK=1`` a 12-person, 4-session memory
and no longer streams): the planted-fact multi-session memory of
``streammem.memverse_synthetic`` (24 people, 8 sessions, 40 distractors per
session, 168 questions: single facts, two-hop facts through a kin relation,
cross-modal facts whose answer is in a clip that never names the person),
all-MiniLM-L6-v2 embeddings, hit rates of the graph search, the flat
baseline and the hybrid with the recipe's default extractor
(``CooccurrenceExtractor``, not a model) and with the generator's own triples
(``GroundTruthExtractor``, a perfect extractor's upper bound); then
``MemVerse.ask`` latency per mode (question encoding included) and the word
budget: hit rate and cost under budgets of 1/2 and 1/4 of the unbounded
cost, and a fixed budget while the stream grows from 8 to 32 sessions.
Written to ``bench/results/memverse_quality.md``.
"""
import os
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from streammem.recipes.memverse import Extraction, LongTermGraph, MemoryChunk, MemVerse, MemVerseConfig
from streammem.recipes.memverse import PlantedFactMemory, hit_rates
from streammem_kernels import CSRGraph

# One intra-op thread by default (STREAMMEM_BENCH_THREADS to change; run with OMP_NUM_THREADS=1 too): on the
# shared, loaded 2-core machine a second thread makes every small op wait on a descheduled pool thread
# (measured: the ranking step of one question 1 ms with one thread, 26 ms with two), for every method alike.
THREADS = int(os.environ.get("STREAMMEM_BENCH_THREADS", "1"))
torch.set_num_threads(THREADS)
QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
SIZES = (1_000, 10_000) if QUICK else (1_000, 10_000, 100_000, 1_000_000)
QUERY_COUNTS = (1, 16)
DIM, NEAR, PREDICATES = 384, 16, ("likes", "near", "owns", "visited", "works at", "sees", "met", "uses")
CONFIG = MemVerseConfig()
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SUMMARY = []


def _random_rows(n: int, g: torch.Generator) -> torch.Tensor:
    return F.normalize(torch.randn(n, DIM, generator=g), dim=1)


def chunk_batch(first_id: int, n_chunks: int, n_entities: int, rng: np.random.Generator, g: torch.Generator):
    """Chunks first_id.. with 4 entity mentions (2 new, 2 near in time or anywhere) and 2 relations each."""
    ids = np.arange(first_id, first_id + n_chunks)
    near = 2 * ids[:, None] + rng.integers(-2 * NEAR, 2 * NEAR + 1, size=(n_chunks, 2))
    anywhere = rng.random((n_chunks, 2)) < 0.1
    old = np.where(anywhere, rng.integers(0, max(1, 2 * first_id + 2 * n_chunks), (n_chunks, 2)), near)
    mentions = np.concatenate([2 * ids[:, None], 2 * ids[:, None] + 1, np.clip(old, 0, None) % n_entities], 1)
    pred = rng.integers(len(PREDICATES), size=(n_chunks, 2))
    emb = _random_rows(n_chunks, g)
    chunks, exts = [], []
    for row, (c, m) in enumerate(zip(ids.tolist(), mentions.tolist())):
        names = [f"entity {e}" for e in m]
        chunks.append(MemoryChunk(c, 0, float(c), float(c), "text", f"chunk {c} " + " ".join(names), (),
                                  embedding=emb[row]))
        exts.append(Extraction(tuple(names), ((names[0], PREDICATES[pred[row, 0]], names[2]),
                                              (names[1], PREDICATES[pred[row, 1]], names[3]))))
    return chunks, exts


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"N{n}")
def data(request):
    n = request.param
    g = torch.Generator().manual_seed(n)
    rng = np.random.default_rng(n)
    graph = LongTermGraph(DIM)
    chunks, exts = chunk_batch(0, n // 2, n, rng, g)
    t0 = time.perf_counter()
    graph.consolidate(chunks, exts, lambda texts: _random_rows(len(texts), g), now=float(n))
    build_s = time.perf_counter() - t0
    del chunks, exts
    relations = (graph.kinds == 1).nonzero()[:, 0]
    pick = relations[torch.randint(relations.numel(), (max(QUERY_COUNTS),), generator=g)]
    queries = F.normalize(graph.embeddings[pick] + 0.5 * torch.randn(len(pick), DIM, generator=g) / DIM**0.5, dim=1)
    d = dict(n=n, graph=graph, queries=queries, rng=rng, gen=g, next_chunk=n // 2, build_s=build_s,
             entities=graph.num_entities, relations=graph.num_relations, entries=graph.num_edges,
             links=int(graph.chunk_map.num_edges), chunks=graph.num_chunks)
    print(f"\nN={n}: {graph.num_entities} entities, {graph.num_relations} relations, {graph.num_chunks} chunks, "
          f"{graph.num_edges} adjacency entries, {d['links']} chunk links; bulk build {build_s:.1f} s",
          file=sys.stderr)
    yield d
    d.clear()


def _measure(benchmark, d, num_q, kind, method, fn, *, rounds=None, **extra):
    t0 = time.perf_counter()
    fn()  # warm-up (and a first sample of the duration)
    first = time.perf_counter() - t0
    rounds = rounds or int(min(30, max(5, 2.0 / max(first, 1e-6))))
    benchmark.group = f"memverse-{kind}-N{d['n']}" + (f"-Q{num_q}" if num_q else "")
    benchmark.pedantic(fn, rounds=rounds, iterations=1)
    data = np.asarray(benchmark.stats.stats.data)
    p20, p50, p80 = (float(np.percentile(data, p)) for p in (20, 50, 80))
    info = dict(method=method, N=d["n"], Q=num_q, kind=kind, p20_s=p20, p50_s=p50, p80_s=p80,
                entities=d["entities"], relations=d["relations"], chunks=d["chunks"], entries=d["entries"],
                links=d["links"], build_s=d["build_s"], load=os.getloadavg(), threads=torch.get_num_threads(), **extra)
    benchmark.extra_info.update(info)
    SUMMARY.append(info)


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_graph_search(benchmark, data, num_q):
    q, graph, cfg = data["queries"][:num_q].contiguous(), data["graph"], CONFIG
    parts = []

    def search():
        hits = graph.search(q, seeds=cfg.seeds, hops=cfg.hops, capacity=cfg.capacity, max_fanout=cfg.max_fanout,
                            max_frontier=cfg.max_frontier, chunks=cfg.chunks, chunks_per_node=cfg.chunks_per_node,
                            ranking=cfg.ranking)
        parts.append(hits.timings)
        return hits

    hits = search()
    listed = int((hits.nodes >= 0).sum(1).max())
    _measure(benchmark, data, num_q, "search", "memverse graph search", search, max_listed=listed,
             truncated=int(hits.truncated.sum()))
    split = {k: float(np.median([p[k] for p in parts])) for k in parts[0]}
    SUMMARY[-1].update(split_s=split)
    benchmark.extra_info.update(split_s=split)


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_flat_search(benchmark, data, num_q):
    q, graph = data["queries"][:num_q].contiguous(), data["graph"]
    _measure(benchmark, data, num_q, "search", "flat cosine top-k over chunks",
             lambda: graph.search_flat(q, CONFIG.chunks))


def test_consolidate_batch(benchmark, data):
    graph = data["graph"]
    batches = []

    def consolidate():
        start = data["next_chunk"]
        data["next_chunk"] += CONFIG.consolidate_every
        chunks, exts = chunk_batch(start, CONFIG.consolidate_every, 2 * data["next_chunk"], data["rng"], data["gen"])
        before = graph.timings["consolidate_csr"]
        graph.consolidate(chunks, exts, lambda texts: _random_rows(len(texts), data["gen"]), now=float(start))
        batches.append(graph.timings["consolidate_csr"] - before)

    _measure(benchmark, data, 0, "grow", f"consolidate {CONFIG.consolidate_every} chunks (extend_csr)", consolidate)
    SUMMARY[-1].update(csr_s=float(np.median(batches)))


def test_rebuild_csr(benchmark, data):
    graph = data["graph"]

    def rebuild():
        for ptr, col, cols in ((graph.graph.row_ptr, graph.graph.col_idx, graph.num_nodes),
                               (graph.chunk_map.row_ptr, graph.chunk_map.col_idx, graph.num_chunks)):
            src = torch.repeat_interleave(torch.arange(ptr.numel() - 1), ptr[1:] - ptr[:-1])
            CSRGraph.from_edges(src, col, ptr.numel() - 1, num_cols=cols,
                                weight=-torch.arange(col.numel(), dtype=torch.float64))

    _measure(benchmark, data, 0, "grow", "rebuild both CSRs (from_edges)", rebuild)


def test_evict(benchmark, data):
    graph = data["graph"]

    def evict():
        graph.evict(int(graph.cost() * 0.99), float(data["next_chunk"]), low_water=1.0)

    _measure(benchmark, data, 0, "evict", "evict 1 % (compact_csr)", evict, rounds=3)


class _MemoEncoder:
    """A text encoder's rows, cached per text: the same stream is fed several times (budgets), encoded once."""

    def __init__(self, encoder):
        self.encoder, self.dim, self.name, self.cache = encoder, encoder.dim, encoder.name, {}

    def encode(self, texts):
        new = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if new:
            self.cache.update(zip(new, self.encoder.encode(new).float()))
        return torch.stack([self.cache[t] for t in texts]) if texts else torch.zeros(0, self.dim)


def _rates_rows(label, r, ks):
    rows = []
    for method in ("graph", "flat", "hybrid"):
        cells = []
        for kind in ("single", "two-hop", "cross-modal", "all"):
            cells.append(" / ".join(f"{r[method, kind, k]['hit']:.2f}" for k in ks) + " (ans "
                         + " / ".join(f"{r[method, kind, k]['answer']:.2f}" for k in ks) + ")")
        rows.append(f"| {label} | {method} | " + " | ".join(cells) + " |")
    return rows


def test_planted_fact_hit_rates():
    from streammem.models.encoders import load_text_encoder

    ks = (4, 8, 16)
    raw = load_text_encoder("minilm")
    enc = _MemoEncoder(raw)
    # Quick mode (bench/run.py --quick, 3-minute budget): a smaller memory, no longer streams.
    data = PlantedFactMemory(people=12, sessions=4, fillers=16, seed=0) if QUICK else \
        PlantedFactMemory(sessions=8, fillers=40, seed=0)
    kinds = {k: sum(q.kind == k for q in data.questions) for k in ("single", "two-hop", "cross-modal")}
    lines = [f"Planted-fact memory: {len(data.items)} chunks, {len(data.questions)} questions {kinds}; "
             f"text encoder {raw.name}; load at start " + "/".join(f"{x:.1f}" for x in os.getloadavg()), "",
             "hit@K = every evidence chunk among the first K long-term chunks (K = " + " / ".join(map(str, ks))
             + "); ans = the chunk holding the answer is.", "",
             "| extractor | method | single | two-hop | cross-modal | all |", "|---|---|---|---|---|---|"]
    memories = {}
    for label, extractor in (("default (statements + co-occurrence, not a model)", None),
                             ("ground-truth triples (upper bound)", data.ground_truth_extractor())):
        memory = MemVerse(enc, extractor=extractor)
        t0 = time.perf_counter()
        chunks = data.feed(memory)
        feed_s = time.perf_counter() - t0
        g = memory.graph
        lines += _rates_rows(f"{label}: {g.num_entities} entities, {g.num_relations} relations, "
                             f"{g.cost()} words", hit_rates(memory, data, chunks, ks=ks), ks)
        memories[label] = (memory, chunks, feed_s)
    # MemVerse.ask end to end (MiniLM question encoding included), per mode, ground-truth graph.
    memory, chunks, _ = memories["ground-truth triples (upper bound)"]
    lines += ["", "MemVerse.ask latency (one question, MiniLM encoding included; ground-truth graph), p20 / p50 / "
              "p80 (flat and hybrid also run the graph search: its facts and seeds are reported):", "", "| mode | p20 | p50 | p80 | p50 after the question encoding (search, chunks, facts) |", "|---|---|---|---|---|"]
    questions = [q.question for q in data.questions[:40]]
    for mode in ("graph", "flat", "hybrid"):
        m = MemVerse(raw, config=MemVerseConfig(mode=mode), answer_fn=lambda ctx: "")
        m.load_state_dict({**memory.state_dict(), "config": MemVerseConfig(mode=mode).to_dict()})
        m.ask(questions[0])
        total, search = [], []
        for q in questions:
            t0 = time.perf_counter()
            ctx = m.ask(q)
            total.append(time.perf_counter() - t0)
            search.append(ctx.timings["total"] - ctx.timings["question_encode"])
        p = np.percentile(total, (20, 50, 80))
        lines.append(f"| {mode} | {_ms(p[0])} | {_ms(p[1])} | {_ms(p[2])} | {_ms(float(np.median(search)))} |")
    # Word budget: the same stream under 1/2 and 1/4 of the unbounded cost; then a fixed budget, longer streams.
    full_cost = memory.graph.cost()
    lines += ["", "Word budget (ground-truth extractor; cost = words of chunk and node texts; hit@8 / ans@8 "
              "over all questions):", "",
              "| sessions | chunks fed | budget | cost after | rounds | chunks / relations / entities removed | "
              "evict mean | hit@8 graph | ans@8 graph | ans@8 flat | ans@8 hybrid |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    runs = [(data.sessions, None), (data.sessions, full_cost // 2), (data.sessions, full_cost // 4)]
    runs += [] if QUICK else [(s, full_cost // 2) for s in (16, 32)]
    for sessions, budget in runs:
        d = data if sessions == data.sessions else PlantedFactMemory(sessions=sessions, fillers=40, seed=0)
        m = MemVerse(enc, config=MemVerseConfig(budget=budget), extractor=d.ground_truth_extractor())
        fed = d.feed(m)
        r = hit_rates(m, d, fed, ks=(8,))
        ev = m.evictions
        lines.append(
            f"| {sessions} | {len(fed)} | {budget or 'none'} | {m.graph.cost()} | {len(ev)} | "
            f"{sum(e.chunks for e in ev)} / {sum(e.relations for e in ev)} / {sum(e.entities for e in ev)} | "
            + (_ms(m.graph.timings["evict"] / len(ev)) if ev else "-")
            + f" | {r['graph', 'all', 8]['hit']:.2f} | {r['graph', 'all', 8]['answer']:.2f} | "
              f"{r['flat', 'all', 8]['answer']:.2f} | {r['hybrid', 'all', 8]['answer']:.2f} |")
    lines.append("")
    lines.append("load at end " + "/".join(f"{x:.1f}" for x in os.getloadavg()))
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"memverse_quality{'_quick' if QUICK else ''}.md")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines), file=sys.stderr)


@pytest.fixture(scope="session", autouse=True)
def _write_summary():
    yield
    if not SUMMARY:
        return
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"memverse_summary{'_quick' if QUICK else ''}.md")
    lines = ["| task | N entities | Q | method | p20 | p50 | p80 | notes |", "|---|---|---|---|---|---|---|---|"]
    for r in SUMMARY:
        notes = []
        if "split_s" in r:
            notes.append("top-k+expansion / rank / chunks " + " / ".join(_ms(v) for v in r["split_s"].values()))
            notes.append(f"largest neighbourhood {r['max_listed']}, truncated {r['truncated']}")
        if "csr_s" in r:
            notes.append(f"of which extend_csr + CSRGraph {_ms(r['csr_s'])}")
        if r["kind"] == "search" and r["method"].startswith("memverse"):
            notes.append(f"{r['relations']} relations, {r['chunks']} chunks, {r['entries']} entries, "
                         f"{r['links']} links, bulk build {r['build_s']:.1f} s")
        notes.append("load " + "/".join(f"{x:.1f}" for x in r["load"]))
        lines.append(f"| {r['kind']} | {r['N']} | {r['Q'] or '-'} | {r['method']} | {_ms(r['p20_s'])} | "
                     f"{_ms(r['p50_s'])} | {_ms(r['p80_s'])} | {'; '.join(notes)} |")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"\nwrote {path}", file=sys.stderr)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"
