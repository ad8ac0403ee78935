"""MemVerse's answer@8 on the planted-fact memory: flat, graph and hybrid retrieval per question kind.

Run:  OMP_NUM_THREADS=1 .venv/bin/python -m bench.memverse_answers [--seed 0 1 2]
      (``python -m bench.quality run memverse`` saves the rows for the record, bench/quality.py)

The figures of docs/recipes/memverse.md ("Figures"): ``PlantedFactMemory(people=24, sessions=8,
fillers=40)`` fed to a default ``MemVerse`` with all-MiniLM-L6-v2, scored by ``hit_rates`` at K = 8
(answer@8: the chunk holding the answer is among the first 8 long-term chunks returned), with the
config's possessive hops (``resolve_possessives``) as they are by default and switched the other way.
The memory and its extractor are the recipe's defaults, whatever they are when this runs, so rerunning
the command after a change to the recipe regenerates the figures.  About 20 s per seed after the model
is loaded.
"""
from __future__ import annotations

import argparse
import time

import torch

from bench import quality
from streammem.models.encoders import load_text_encoder
from streammem.recipes.memverse import MemVerse, MemVerseConfig, PlantedFactMemory, hit_rates

SIZE = dict(people=24, sessions=8, fillers=40)
KINDS = ("single", "two-hop", "cross-modal", "all")
METHODS = ("flat", "graph", "hybrid")
K = 8
ABOUT = ("PlantedFactMemory(people=24, sessions=8, fillers=40, seed={seeds}): single facts, two-hop facts through "
         "a kin relation, cross-modal facts whose answer is in a clip that never names the person; a default MemVerse "
         "(the recipe's default extractor and config) with all-MiniLM-L6-v2, one intra-op thread. answer@8: the "
         "chunk holding the answer is among the first 8 long-term chunks returned (hit_rates); hybrid interleaves "
         "flat and graph; possessive hops: a question's \"X's R\" resolved through the graph before the graph and "
         "hybrid searches (MemVerseConfig.resolve_possessives; flat never resolves). The figures of "
         "docs/recipes/memverse.md.")


def answer_rows(seed: int, encoder) -> list[dict]:
    """One row per possessive-hops setting (the default first) and retrieval method: answer@8 as [right, of]."""
    data = PlantedFactMemory(**SIZE, seed=seed)
    memory = MemVerse(encoder)
    chunks = data.feed(memory)
    default = MemVerseConfig().resolve_possessives
    rows = []
    for resolve in (default, not default):
        rates = hit_rates(memory, data, chunks, ks=(K,), resolve_possessives=resolve)
        for method in METHODS:
            row = {"seed": seed, "hops": ("on" if resolve else "off") + (" (default)" if resolve == default else ""),
                   "method": method}
            for kind in KINDS:
                r = rates.get((method, kind, K))
                row[kind] = None if r is None else quality.share(round(r["answer"] * r["n"]), r["n"])
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, nargs="+", default=[0, 1, 2], help="PlantedFactMemory seeds")
    args = parser.parse_args(argv)
    started, load_before = time.time(), quality.load_average()
    torch.set_num_threads(1)
    encoder = load_text_encoder("minilm")
    rows = [row for seed in args.seed for row in answer_rows(seed, encoder)]
    for row in rows:
        print(f"seed {row['seed']} hops {row['hops']:12s} {row['method']:6s} " + "  ".join(
            f"{kind} {row[kind][0] / row[kind][1]:.3f} ({row[kind][0]}/{row[kind][1]})" for kind in KINDS
            if row[kind]), flush=True)
    if quality.saving():
        col = quality.column
        columns = [col("seed", "seed", "int"), col("hops", "possessive hops"), col("method", "method"),
                   *(col(kind, f"answer@{K} {kind}", "share") for kind in KINDS)]
        quality.save("memverse", [{"title": f"MemVerse answer@{K} per retrieval mode and question kind",
                                   "columns": columns, "rows": rows}],
                     about=ABOUT.format(seeds=", ".join(map(str, args.seed))), started=started,
                     load_before=load_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
