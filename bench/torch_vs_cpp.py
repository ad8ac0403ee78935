"""The torch backend beside the C++ one: every op on a realistic input, both backends, one table.

Run:  .venv/bin/python -m bench.torch_vs_cpp [--threads 1] [--seconds 1.0] [--out FILE]
      python -m bench.quality run torch_vs_cpp   # the same, saved for the record (its own section)

The torch backend is the reference (or, where the reference loops, its vectorised form with the same
results); it is what runs without the C++ extension.  Each case alternates single calls of both
backends through the public function (``backend="torch"`` / ``"cpp"``) for ``--seconds``, and
reports wall p20 / p50 / p80 per call in microseconds and the ratio of the medians, with the load
average.  Sizes are those the recipes call with (D = 384 retrieval embeddings, one hour of frames
at 1 frame/s, an LLM head of 32K tokens).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

import streammem_kernels as sk
from bench import quality
from bench.timing import alternate, fmt

DIM = 384


def cases() -> dict:
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(10_000, DIM, generator=g)
    q1, q64 = torch.randn(1, DIM, generator=g), torch.randn(64, DIM, generator=g)
    frames = torch.randn(3600, DIM, generator=g)
    edges = torch.linspace(0, 3600, 11).long()
    segments = torch.stack([edges[:-1], edges[1:]], 1)
    q10 = torch.randn(10, DIM, generator=g)
    tree = sk.CosineTree(DIM)
    tree.add_leaves(keys)
    tree.grow(10)
    pts = torch.randn(8, 500, 64, generator=g)
    logits, targets = torch.randn(64, 32_000, generator=g), torch.randint(0, 32_000, (64,), generator=g)
    lp = -torch.rand(4, 512, generator=g, dtype=torch.float64)
    feats = torch.randn(1, 3600, DIM, generator=g)
    sims = torch.rand(3600, generator=g)
    graph = sk.CSRGraph.from_edges(torch.randint(0, 2000, (8000,), generator=g),
                                   torch.randint(0, 2000, (8000,), generator=g), 2000)
    emb, gq = torch.randn(2000, DIM, generator=g), torch.randn(4, DIM, generator=g)
    base = (torch.rand(178, 232, 3, generator=g) * 255).to(torch.uint8)
    pair = torch.stack([base[:168, :224], base[2:170, 3:227]])
    return {
        "cosine_topk Q=1 N=1e4 k=10": lambda b: sk.cosine_topk(q1, keys, 10, backend=b),
        "cosine_topk Q=64 N=1e4 k=10": lambda b: sk.cosine_topk(q64, keys, 10, backend=b),
        "cosine_topk ranges 10 segments / 3,600 frames k=4": lambda b: sk.cosine_topk(q10, frames, 4, ranges=segments,
                                                                                   backend=b),
        "tree_search greedy Q=1 (1e4 leaves)": lambda b: sk.tree_search(tree, q1, backend=b),
        "tree_search beam (5,10) Q=1 (1e4 leaves)": lambda b: sk.tree_search(tree, q1, beam=(5, 10), k=10,
                                                                             backend=b),
        "batched_kmeans 8x500x64 k=8": lambda b: sk.batched_kmeans(pts, 8, iters=10, backend=b),
        "token_logprobs T=64 V=32000": lambda b: sk.token_logprobs(logits, targets, backend=b),
        "divergence_point 4x512": lambda b: sk.divergence_point(lp, backend=b),
        "detect_boundaries 1x3600x384": lambda b: sk.detect_boundaries(feats, backend=b),
        "depth_scores M=3600": lambda b: sk.depth_scores(sims, backend=b),
        "graph_retrieve Q=4 N=2000 k=8 hops=2": lambda b: sk.graph_retrieve(gq, emb, graph, k=8, hops=2, capacity=256,
                                                                            backend=b),
        "motion_magnitude 224x168 pair": lambda b: sk.motion_magnitude(pair, backend=b),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--cases", default=None, help="comma-separated substrings of case names")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    started, load_before, rows = time.time(), quality.load_average(), []
    lines = [f"threads: {args.threads}, torch {torch.__version__}; wall per call in us, p20 / p50 / p80", "",
             "| op (input) | torch | C++ | torch/C++ p50 | load avg |", "|---|---|---|---:|---|"]
    print("\n".join(lines), flush=True)
    for name, call in cases().items():
        if args.cases and not any(s in name for s in args.cases.split(",")):
            continue
        load0 = os.getloadavg()[0]
        try:
            torch_t, cpp_t = alternate([lambda: call("torch"), lambda: call("cpp")], args.seconds)
        except Exception as exc:  # an op without a backend here: say so, measure the rest
            line = f"| {name} | {type(exc).__name__}: {exc} | | | |"
            rows.append({"case": name, "torch": f"{type(exc).__name__}: {exc}"})
        else:
            load = f"{load0:.1f}-{os.getloadavg()[0]:.1f}"
            line = f"| {name} | {fmt(torch_t)} | {fmt(cpp_t)} | {torch_t[1] / cpp_t[1]:.1f} | {load} |"
            rows.append({"case": name, "torch": fmt(torch_t), "cpp": fmt(cpp_t),
                         "ratio": f"{torch_t[1] / cpp_t[1]:.1f}", "load": load})
        lines.append(line)
        print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    if quality.saving():  # python -m bench.quality run torch_vs_cpp: the table for the record
        columns = [quality.column("case", "op (input)"), quality.column("torch", "torch p20 / p50 / p80 (us)"),
                   quality.column("cpp", "C++ p20 / p50 / p80 (us)"), quality.column("ratio", "torch / C++ (p50)"),
                   quality.column("load", "load average")]
        quality.save("torch_vs_cpp", [{"title": f"{args.threads} thread(s), wall time per call", "columns": columns,
                                       "rows": rows}],
                     about="Each case alternates single calls of both backends through the public function "
                           "(backend=\"torch\" / \"cpp\") for --seconds and reports wall percentiles per call; the "
                           "torch backend is the reference, vectorised where the reference loops (bit for bit the "
                           "same results). Timings: only rows of one run compare.",
                     started=started, load_before=load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
