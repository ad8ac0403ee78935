"""Turn the newest benchmark results into the generated block of a results page.

    python bench/report.py                # full runs -> bench/RESULTS.md and bench/plots/ (the committed record)
    python bench/report.py --mode quick   # quick runs -> bench/results/quick/RESULTS.md and plots/ (git-ignored)

bench/run.py calls this after the suites, with the mode it ran in.  Each mode
reads only its own runs (``bench/results/<machine>-<mode>-<date>.json``; the
CPU run, and the GPU run of bench/gpu.sh when one exists) and writes only its
own files, so a quick smoke run never touches the committed full report or its
plots.  Only the text between ``<!-- report:begin -->`` and
``<!-- report:end -->`` is rewritten; the hand-written sections around it are
never touched.  Suites that no local run of the machine measured are taken
from its committed baseline, so ``run.py --only motion`` on a fresh clone
replaces the motion tables and keeps the others.

The block holds, per benchmark group, a table of providers (mean, median and
p20-p80 time, throughput when ``extra_info`` counts units, the ratio of every
provider to our fastest row, quality columns when ``extra_info`` carries them),
scaling plots (time per unit, or per call, against a size; peak extra memory
against a size where cases record ``peak_extra_bytes``) and a regression check
against the last *committed* results of the same machine and mode
(``bench/baseline/<machine>-<mode>.json`` as of git HEAD, written by
``bench/run.py --save-baseline``; without one, the newest earlier local run).
A ``REGRESSION:`` line names a row of ours (peers are measured, not ours to
regress) whose median grew by more than 10 % *and* whose p20-p80 range lies
entirely above the earlier one: on a shared machine a shift inside the noise
band is not a regression.  Regressions are report lines, never failures.
"""
from __future__ import annotations

import argparse
import ast
import functools
import glob
import json
import math
import os
import re
import subprocess
import sys
from collections import OrderedDict

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
BASELINE_DIR = os.path.join(BENCH_DIR, "baseline")
# Where each mode's report goes: (results page, plots folder).  Quick output is git-ignored.
OUTPUTS = {
    "full": (os.path.join(BENCH_DIR, "RESULTS.md"), os.path.join(BENCH_DIR, "plots")),
    "quick": (os.path.join(BENCH_DIR, "results", "quick", "RESULTS.md"),
              os.path.join(BENCH_DIR, "results", "quick", "plots")),
}
QUICK_HEADER = """# Quick benchmark run (smoke test, not the record)

Written by `make bench-quick` (`python -m bench.run --quick`): small sizes and
few rounds, to check that every suite runs. This file and its plots are
git-ignored; the committed record is `bench/RESULTS.md`, written by full runs
only.
"""
BEGIN, END = "<!-- report:begin -->", "<!-- report:end -->"
RESULT_NAME = re.compile(r"^(?P<machine>.+)-(?P<mode>quick|full)-(?P<stamp>\d{4}-\d{2}-\d{2}T\d{6}Z)\.json$")
REGRESSION_THRESHOLD = 0.10

# extra_info keys counting the units one benchmarked call processes, first match wins.
UNIT_KEYS = [("pairs", "pairs"), ("problems", "problems"), ("queries", "queries"), ("Q", "queries"),
             ("tokens", "tokens"), ("rows", "tokens"), ("frames", "frames")]
# extra_info keys holding a quality measure, shown as columns when a group has them.
QUALITY_KEYS = [("recall1", "recall@1"), ("recall10", "recall@10"), ("recall", "recall"), ("precision", "precision"),
                ("f1", "F1"), ("inertia", "inertia"), ("token_exact", "token-exact"), ("exact", "token-exact"),
                ("reuse_ratio", "reuse ratio")]
# Size parameters a scaling curve can run along, first match wins: (key, axis label).
SIZE_KEYS = [("N", "N (keys / leaves)"), ("length", "stream length (frames pushed before)"),
             ("vocab", "vocabulary size V"), ("loops", "stream length (clip loops)"), ("size", "frame side (px)")]
# Axes a case can name explicitly with ``extra_info["scale"] = key`` (the value is ``extra_info[key]``).
SCALE_LABELS = {"B": "B (problems per call)", "N": "N (points per problem)", "D": "D (features)",
                "length": "stream length (frames pushed before)", "vocab": "vocabulary size V"}
PROVIDER_PARAM_KEYS = ("provider", "method", "backend", "mode")


# --------------------------------------------------------------------------
# Reading results
# --------------------------------------------------------------------------
def find_results(results_dir: str, mode: str | None = None) -> list[dict]:
    """Every run.py result document in ``results_dir`` (of ``mode`` if given), oldest first; other files are ignored."""
    docs = []
    for path in glob.glob(os.path.join(results_dir, "*.json")):
        match = RESULT_NAME.match(os.path.basename(path))
        if not match or (mode is not None and match["mode"] != mode):
            continue
        try:
            with open(path) as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            continue
        meta = doc.setdefault("streammem", {})
        meta.setdefault("machine", match["machine"])
        meta.setdefault("mode", match["mode"])
        meta.setdefault("kind", "gpu" if match["machine"].startswith("gpu-") else "cpu")
        doc["_path"] = path
        doc["_stamp"] = match["stamp"]
        add_percentiles(doc)
        docs.append(doc)
    return sorted(docs, key=lambda d: d["_stamp"])


def percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``samples``, linear interpolation (numpy's default)."""
    data = sorted(samples)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def add_percentiles(doc: dict) -> dict:
    """Add ``stats["p20"]`` and ``stats["p80"]`` from the per-round samples, where a benchmark has them.

    Baselines are committed without the samples, so run.py adds these before
    stripping them; rows that never had them keep only pytest-benchmark's stats.
    """
    for bench in doc.get("benchmarks", []):
        stats = bench.get("stats") or {}
        data = stats.get("data")
        if data and "p20" not in stats:
            stats["p20"], stats["p80"] = percentile(data, 20), percentile(data, 80)
    return doc


def spread(stats: dict) -> tuple[float, float, str]:
    """(low, high, label) of a benchmark's noise band: p20-p80, else pytest-benchmark's q1-q3 (p25-p75)."""
    if "p20" in stats and "p80" in stats:
        return stats["p20"], stats["p80"], "p20-p80"
    if "q1" in stats and "q3" in stats:
        return stats["q1"], stats["q3"], "p25-p75"
    return stats["median"], stats["median"], "median"


def newest(docs: list[dict], kind: str) -> dict | None:
    runs = [d for d in docs if d["streammem"]["kind"] == kind]
    return runs[-1] if runs else None


def suites_in(doc: dict) -> list[str]:
    return list(OrderedDict.fromkeys(suite_of(b) for b in doc.get("benchmarks", [])))


def baseline_path(baseline_dir: str, machine: str, mode: str) -> str:
    return os.path.join(baseline_dir, f"{machine}-{mode}.json")


def committed_baseline(baseline_dir: str, machine: str, mode: str) -> dict | None:
    """The last committed results of ``machine`` in ``mode``: ``bench/baseline/<machine>-<mode>.json`` at git HEAD.

    Outside a git work tree (a copied source tree, the tests' temporary folders)
    the file on disk is taken instead.  None when there is no such baseline.
    """
    path = baseline_path(baseline_dir, machine, mode)
    folder = os.path.dirname(os.path.abspath(path))
    text = None
    if os.path.isdir(folder):
        try:
            inside = subprocess.run(["git", "-C", folder, "rev-parse", "--is-inside-work-tree"], capture_output=True,
                                    text=True, timeout=20).stdout.strip() == "true"
        except (OSError, subprocess.TimeoutExpired):
            inside = False
        if inside:
            try:
                out = subprocess.run(["git", "-C", folder, "show", f"HEAD:./{os.path.basename(path)}"],
                                     capture_output=True, text=True, timeout=20)
                text = out.stdout if out.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired):
                text = None
        elif os.path.exists(path):
            with open(path) as fh:
                text = fh.read()
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    doc["_path"] = path
    return doc


def strip_for_baseline(doc: dict) -> dict:
    """A results document without the per-round samples (``stats["data"]``): what gets committed."""
    slim = {k: v for k, v in doc.items() if not k.startswith("_")}
    slim["benchmarks"] = []
    for bench in doc.get("benchmarks", []):
        bench = dict(bench)
        bench["stats"] = {k: v for k, v in bench.get("stats", {}).items() if k != "data"}
        slim["benchmarks"].append(bench)
    return slim


def combined_run(docs: list[dict], kind: str, baseline_dir: str | None = None) -> dict | None:
    """The newest run of ``kind``, with every suite it lacks taken from the newest earlier run that has it.

    ``run.py --only pipeline`` writes a file holding one suite; the report still shows
    every suite, each from its newest run on the same machine, and names the file
    each came from.  The regression check compares every source file with the
    committed baseline of its machine and mode (``committed_baseline``), or, when
    none is committed, with the runs before it kept in the results folder.
    """
    base = newest(docs, kind)
    if base is None:
        return None
    machine = base["streammem"]["machine"]
    same_machine = [d for d in reversed(docs) if d["streammem"]["machine"] == machine]
    sources: list[tuple[dict, list[str]]] = []
    taken: set[str] = set()
    for doc in same_machine:
        fresh = [suite for suite in suites_in(doc) if suite not in taken]
        if fresh:
            sources.append((doc, fresh))
            taken.update(fresh)
    # Suites no local run measured come from the committed record of this machine and mode, so a
    # partial run (run.py --only, a fresh clone) never drops the other suites from the report.
    committed_run = committed_baseline(baseline_dir, machine, base["streammem"]["mode"]) if baseline_dir else None
    if committed_run is not None:
        committed_run["_stamp"] = "committed"
        committed_run.setdefault("streammem", {}).setdefault("mode", base["streammem"]["mode"])
        fresh = [suite for suite in suites_in(committed_run) if suite not in taken]
        if fresh:
            sources.append((committed_run, fresh))
    view = dict(base)
    view["benchmarks"] = [b for doc, suites in sources for b in doc.get("benchmarks", []) if suite_of(b) in suites]
    view["_sources"] = sources
    regressions, compared, committed = [], [], []
    baselines: dict[str, dict | None] = {}
    for doc, suites in sources:
        if doc is committed_run:
            continue  # the baseline itself: nothing to compare
        mode = doc["streammem"]["mode"]
        if baseline_dir is not None and mode not in baselines:
            baselines[mode] = committed_baseline(baseline_dir, machine, mode)
        mine = {"benchmarks": [b for b in doc.get("benchmarks", []) if suite_of(b) in suites]}
        baseline = baselines.get(mode)
        if baseline is not None:
            regressions += regression_lines(mine, baseline)
            committed.append(baseline)
            continue
        earlier = [d for d in docs if d["_stamp"] < doc["_stamp"] and d["streammem"]["machine"] == machine
                   and d["streammem"]["mode"] == mode]
        regressions += regression_lines(mine, earlier)
        compared += [os.path.basename(d["_path"]) for d in earlier
                     if any(suite_of(b) in suites for b in d.get("benchmarks", []))]
    view["_regressions"] = regressions
    view["_compared"] = sorted(set(compared))
    view["_baselines"] = list({b["_path"]: b for b in committed}.values())
    return view


# --------------------------------------------------------------------------
# One benchmark row
# --------------------------------------------------------------------------
def suite_of(bench: dict) -> str:
    if bench.get("suite"):
        return bench["suite"]
    match = re.search(r"bench_(\w+)\.py", bench.get("fullname", ""))
    return match[1] if match else "bench"


def provider_of(bench: dict, series: bool = False) -> str:
    """Provider named in extra_info or params, else the test name (without its id when naming a plot series)."""
    info, params = bench.get("extra_info") or {}, bench.get("params") or {}
    for source in (info, params):
        for key in PROVIDER_PARAM_KEYS:
            if isinstance(source.get(key), str):
                return source[key]
    return bench["name"].split("[")[0] if series else bench["name"]


def group_of(bench: dict) -> str:
    """The benchmark's group; a case without one is grouped by its test id minus the provider part.

    ``test_logprobs_time[token-V49152-T128-ours[cpp]]`` -> ``logprobs token-V49152-T128``, so the
    providers run on the same inputs land in one table.
    """
    if bench.get("group"):
        return bench["group"]
    name = bench.get("name", "")
    case = name[name.index("[") + 1:-1] if "[" in name and name.endswith("]") else ""
    for key in PROVIDER_PARAM_KEYS:
        value = (bench.get("params") or {}).get(key)
        if isinstance(value, str) and value:
            case = case.replace(value, "")
    case = re.sub(r"-{2,}", "-", case).strip("-")
    return suite_of(bench) + (f" {case}" if case else "")


@functools.lru_cache(maxsize=1)
def public_names() -> frozenset[str]:
    """``streammem_kernels.__all__``, read from the source so the report never imports torch."""
    path = os.path.join(os.path.dirname(BENCH_DIR), "streammem_kernels", "__init__.py")
    try:
        tree = ast.parse(open(path).read())
    except (OSError, SyntaxError):
        return frozenset()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            try:
                return frozenset(ast.literal_eval(node.value))
            except ValueError:
                return frozenset()
    return frozenset()


def is_ours(bench: dict) -> bool:
    """Rows of ours: provider or test named ``ours...``, or a provider named after one of our public functions."""
    provider = provider_of(bench)
    if provider.startswith("ours") or bench["name"].startswith(("test_ours", "ours")):
        return True
    return re.split(r"[\s(\[]", provider, maxsplit=1)[0] in public_names()


def units_of(bench: dict) -> tuple[float, str] | None:
    info = dict(bench.get("params") or {})
    info.update(bench.get("extra_info") or {})
    if isinstance(info.get("streams"), (int, float)) and isinstance(info.get("frames"), (int, float)):
        return float(info["streams"] * info["frames"]), "frames"
    for key, unit in UNIT_KEYS:
        value = info.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value), unit
    return None


def size_of(bench: dict) -> tuple[float, str, str] | None:
    """(value, axis label, key) of the size parameter this case was run at, if it has one."""
    info = dict(bench.get("params") or {})
    info.update(bench.get("extra_info") or {})
    axis = info.get("scale")
    if isinstance(axis, str) and isinstance(info.get(axis), (int, float)):
        return float(info[axis]), SCALE_LABELS.get(axis, axis), axis
    for key, label in SIZE_KEYS:
        value = info.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), label, key
    match = re.search(r"\[(\d+)px\]", bench.get("name", "")) or re.search(r"-(\d+)$", bench.get("group") or "")
    if match:
        return float(match[1]), SIZE_KEYS[-1][1], "size"
    return None


def quality_of(bench: dict) -> dict[str, object]:
    info = bench.get("extra_info") or {}
    return {label: info[key] for key, label in QUALITY_KEYS if key in info and info[key] is not None}


# --------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------
def fmt_time(seconds: float) -> str:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_rate(per_second: float) -> str:
    if per_second >= 1e6:
        return f"{per_second / 1e6:.3g} M"
    if per_second >= 1e3:
        return f"{per_second / 1e3:.3g} k"
    return f"{per_second:.3g}"


def fmt_value(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def group_benchmarks(doc: dict) -> "OrderedDict[str, list[dict]]":
    groups: OrderedDict[str, list[dict]] = OrderedDict()
    for bench in doc.get("benchmarks", []):
        groups.setdefault(group_of(bench), []).append(bench)
    return groups


def baseline_of(rows: list[dict]) -> dict | None:
    """Our fastest row (by mean) in a group, the denominator of every ratio."""
    ours = [b for b in rows if is_ours(b)]
    return min(ours, key=lambda b: b["stats"]["mean"]) if ours else None


def group_table(rows: list[dict]) -> list[str]:
    base = baseline_of(rows)
    quality_labels = [label for _, label in QUALITY_KEYS if any(label in quality_of(b) for b in rows)]
    quality_labels = list(OrderedDict.fromkeys(quality_labels))
    with_band = any("p20" in b["stats"] for b in rows)
    header = ["provider", "mean", "median", *(["p20-p80"] if with_band else []), "throughput", "time / ours",
              *quality_labels]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for bench in sorted(rows, key=lambda b: b["stats"]["mean"]):
        stats = bench["stats"]
        units = units_of(bench)
        rate = f"{fmt_rate(units[0] / stats['mean'])} {units[1]}/s" if units and stats["mean"] > 0 else "-"
        if base is None:
            ratio = "-"
        elif bench is base:
            ratio = "**1.00 (baseline)**"
        else:
            ratio = f"{stats['mean'] / base['stats']['mean']:.2f}"
        quality = quality_of(bench)
        band = [f"{fmt_time(stats['p20'])}-{fmt_time(stats['p80'])}" if "p20" in stats else "-"] if with_band else []
        cells = [f"`{provider_of(bench)}`", fmt_time(stats["mean"]), fmt_time(stats["median"]), *band, rate, ratio,
                 *(fmt_value(quality[label]) if label in quality else "-" for label in quality_labels)]
        lines.append("| " + " | ".join(cells) + " |")
    if base is None:
        lines.append("\n(no row of ours in this group, so no ratios)")
    return lines


def regression_lines(current: dict, previous: dict | list[dict] | None,
                     threshold: float = REGRESSION_THRESHOLD) -> list[str]:
    """``REGRESSION:`` lines for rows of ours that became slower beyond the noise (matched by fullname).

    A row is flagged when its median grew by more than ``threshold`` and its
    p20-p80 range lies entirely above the earlier run's (``spread``): both runs'
    noise bands must separate.  Peers' rows are never flagged.  ``previous`` is
    one earlier run or a list of them, oldest first: each benchmark is compared
    with the newest earlier run that measured it.
    """
    if not previous:
        return []
    before = {}
    for doc in previous if isinstance(previous, list) else [previous]:
        before.update({b["fullname"]: b["stats"] for b in doc.get("benchmarks", [])})
    lines = []
    for bench in current.get("benchmarks", []):
        old_stats, new_stats = before.get(bench["fullname"]), bench["stats"]
        if old_stats is None or not is_ours(bench):
            continue
        old, new = old_stats["median"], new_stats["median"]
        new_low, new_high, new_band = spread(new_stats)
        old_low, old_high, old_band = spread(old_stats)
        if old > 0 and new > old * (1.0 + threshold) and new_low > old_high:
            ranges = ""
            if "median" not in (new_band, old_band):
                band = new_band if new_band == old_band else f"{new_band} vs {old_band}"
                ranges = f"; {band} {fmt_time(new_low)}-{fmt_time(new_high)} vs {fmt_time(old_low)}-{fmt_time(old_high)}"
            lines.append(f"REGRESSION: `{bench['fullname']}` median {fmt_time(new)} vs {fmt_time(old)} "
                         f"(+{100.0 * (new / old - 1.0):.0f} %{ranges})")
    return lines


# --------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------
def scaling_families(doc: dict) -> "OrderedDict[tuple[str, str, str], dict[str, list[tuple[float, float]]]]":
    """Curves per family: groups that differ only by one size parameter, one series per provider.

    The family name is the group name with the size value replaced by ``*``
    (``motion-224`` and ``motion-336`` -> ``motion-*``).  The y value is time per
    unit where ``extra_info`` counts units, else time per call.
    """
    families: OrderedDict = OrderedDict()
    for bench in doc.get("benchmarks", []):
        size = size_of(bench)
        if size is None:
            continue
        value, label, _ = size
        group = group_of(bench)
        number = f"{value:g}" if value != int(value) else str(int(value))
        family = re.sub(rf"(?<![0-9]){re.escape(number)}(?![0-9])", "*", group)
        info = bench.get("extra_info") or {}
        units = None if info.get("plot_per") == "call" else units_of(bench)
        y = bench["stats"]["median"] / units[0] if units else bench["stats"]["median"]
        ylabel = f"median time per {SINGULAR.get(units[1], units[1])} (s)" if units else "median time per call (s)"
        key = (family, label, ylabel)
        curves = families.setdefault(key, OrderedDict())
        curves.setdefault(provider_of(bench, series=True), []).append((value, y))
        if isinstance(info.get("peak_extra_bytes"), (int, float)):
            memory = families.setdefault((family, label, MEMORY_LABEL), OrderedDict())
            # RSS moves in 4 KiB pages and log axes need > 0: a case that allocated nothing shows as one page.
            memory.setdefault(provider_of(bench, series=True), []).append(
                (value, max(float(info["peak_extra_bytes"]), 4096.0) / 2**20))
    return OrderedDict((k, v) for k, v in families.items() if len({x for series in v.values() for x, _ in series}) >= 2)


MEMORY_LABEL = "peak extra memory (MiB)"
SINGULAR = {"pairs": "pair", "problems": "problem", "queries": "query", "tokens": "token", "frames": "frame"}


def series_is_ours(name: str) -> bool:
    """A plot series of ours: named ``ours...`` or after one of our public functions."""
    return name.startswith("ours") or re.split(r"[\s(\[]", name, maxsplit=1)[0] in public_names()


def make_plots(doc: dict, plots_dir: str, prefix: str) -> list[tuple[str, str]]:
    """Write one PNG per scaling family; return (title, path) pairs."""
    families = scaling_families(doc)
    if not families:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    os.makedirs(plots_dir, exist_ok=True)
    for stale in glob.glob(os.path.join(plots_dir, f"{prefix}-*.png")):
        os.remove(stale)
    written = []
    for (family, xlabel, ylabel), series in families.items():
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
        for provider, points in sorted(series.items(), key=lambda kv: (not series_is_ours(kv[0]), kv[0])):
            points = sorted(points)
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            ours = series_is_ours(provider)
            ax.plot(xs, ys, "-o" if ours else "--s", label=provider + (" (ours)" if ours and not provider.startswith(
                "ours") else ""), linewidth=2 if ours else 1.2, markersize=5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:.0f}" if v >= 1 and v == int(v) else f"{v:g}")  # 1000000, not 1e+06
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(sorted({x for points in series.values() for x, _ in points}))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        title = (f"{family}: {ylabel.split(' (')[0].replace('median ', '')} vs {xlabel.split(' (')[0]}\n"
                 f"{doc['streammem'].get('machine', '')}, {doc['streammem'].get('mode', '')} run, "
                 f"load average {doc['streammem'].get('load_average_before', '?')} before it (solid: ours)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        stem = re.sub(r'[^A-Za-z0-9]+', '_', family).strip('_') + ("-memory" if ylabel == MEMORY_LABEL else "")
        path = os.path.join(plots_dir, f"{prefix}-{stem}.png")
        fig.savefig(path)
        plt.close(fig)
        written.append((f"{family}: {ylabel} vs {xlabel}", path))
    return written


# --------------------------------------------------------------------------
# The block
# --------------------------------------------------------------------------
def describe_run(doc: dict, results_md_dir: str) -> list[str]:
    meta = doc["streammem"]
    libs = ", ".join(f"{k} {v}" for k, v in (meta.get("libraries") or {}).items())
    lines = [f"- Machine: `{meta.get('machine')}`: {meta.get('cpu_model', '?')}, {meta.get('cores', '?')} cores"
             + (f", GPU {meta['gpu']}" if meta.get("gpu") else ", no GPU"),
             f"- Libraries: {libs}" if libs else "- Libraries: not recorded",
             f"- Command: `{meta.get('command', 'python -m bench.run')}` ({meta.get('mode')} mode), "
             f"started {meta.get('started_utc', doc['_stamp'])}, {meta.get('total_seconds', '?')} s wall"
             + (f", {meta['total_cpu_seconds']} s CPU" if meta.get("total_cpu_seconds") else "") + " in all",
             f"- Load average (1/5/15 min): {meta.get('load_average_before', '?')} before the run, "
             f"{meta.get('load_average_after', '?')} after: the machine was shared with other jobs, so absolute "
             "times are noisy (often several times an idle machine's); ratios within one group come from "
             "one process, side by side, and are the meaningful part",
             "- Results files (git-ignored unless marked committed): " + "; ".join(
                 f"`{os.path.relpath(src['_path'], os.path.dirname(results_md_dir))}` ({', '.join(suites)})"
                 + (" [committed baseline: no local run measured these suites]" if src.get("_stamp") == "committed"
                    else "")
                 for src, suites in doc.get("_sources", [(doc, suites_in(doc))]))]
    if meta.get("kind") == "gpu":
        readers = sorted(os.path.basename(path)[len("bench_"):-3]
                         for path in glob.glob(os.path.join(BENCH_DIR, "bench_*.py"))
                         if any(mark in open(path).read() for mark in ("STREAMMEM_BENCH_DEVICE", "from _device import")))
        lines.append("- GPU placement: run.py sets `STREAMMEM_BENCH_DEVICE=cuda`; suites that read it: "
                     + (", ".join(f"`{r}`" for r in readers) if readers else
                        "none yet, so every suite below still ran its CPU code on this machine"))
    suites = meta.get("suites") or []
    if suites:
        lines.append("- Suites: " + "; ".join(f"`{s['suite']}` {s['status']}" + (f" ({s['seconds']:.0f} s wall" + (
            f", {s['cpu_seconds']:.0f} s CPU)" if s.get("cpu_seconds") is not None else ")") if s.get("seconds") else "")
                                              for s in suites))
    return lines


def regression_paragraph(doc: dict, md_dir: str) -> list[str]:
    regressions, compared, baselines = doc.get("_regressions", []), doc.get("_compared", []), doc.get("_baselines", [])
    verdict = "none." if not regressions else f"{len(regressions)} found (timings are noisy on a shared machine)."
    rule = (f"rows of ours whose median is more than {REGRESSION_THRESHOLD:.0%} slower and whose p20-p80 range "
            "lies entirely above the earlier one")
    lines = []
    if baselines:
        named = ", ".join(f"`{os.path.relpath(b['_path'], os.path.dirname(md_dir))}` (run started "
                          f"{(b.get('streammem') or {}).get('started_utc', '?')})" for b in baselines)
        lines.append(f"Regression check ({rule}, against the last committed results of this machine and mode, "
                     f"{named} as of git HEAD): {verdict}")
        newest_file = os.path.relpath(doc["_path"], os.path.dirname(md_dir))
        lines.append(f"Side by side: `python -m pytest_benchmark compare {os.path.relpath(baselines[0]['_path'], os.path.dirname(md_dir))} "
                     f"{newest_file} --group-by=fullname --columns=median` (run.py saves that table next to the "
                     "results file as `*.compare.txt`).")
    elif compared:
        lines.append(f"Regression check ({rule}, against the newest earlier run of this machine and mode kept in "
                     f"`bench/results/`, since no baseline of this machine and mode is committed in `bench/baseline/`; "
                     f"compared with {', '.join(f'`{c}`' for c in compared)}): {verdict}")
    else:
        lines.append("Regression check: no committed baseline of this machine and mode in `bench/baseline/` and no "
                     "earlier run in `bench/results/` (`python -m bench.run --save-baseline` writes the baseline to "
                     "commit).")
    if regressions:
        lines += [""] + [f"- {line}" for line in regressions]
        note = load_note(doc)
        if note:
            lines += ["", note]
    return lines


def _one_minute_load(meta: dict, key: str) -> float | None:
    match = re.match(r"\s*([0-9.]+)", str(meta.get(key, "")))
    return float(match[1]) if match else None


def load_note(doc: dict) -> str | None:
    """A line putting regressions next to the machine load of this run and of the runs it was compared with."""
    meta = doc.get("streammem") or {}
    before, after = _one_minute_load(meta, "load_average_before"), _one_minute_load(meta, "load_average_after")
    if before is None:
        return None
    earlier = [_one_minute_load(b.get("streammem") or {}, "load_average_before") for b in doc.get("_baselines", [])]
    earlier = [v for v in earlier if v is not None]
    text = (f"Load average (1 min) {before:g} before this run and {after if after is not None else '?'} after it "
            f"on {meta.get('cores', '?')} cores")
    text += f"; {', '.join(f'{v:g}' for v in earlier)} before the compared run." if earlier else "."
    if before >= 1.0 or (earlier and before >= min(earlier) + 1.0):
        text += (" Other jobs shared the cores: slowdowns measured under load are as likely the load as the code "
                 "(multi-threaded code, OpenMP kernels and torch ops alike, suffers most), so rerun those suites on idle "
                 "cores before acting on them.")
    return text


def render_block(runs: list[dict], plots: list[tuple[str, str]], results_md: str, mode: str = "full") -> str:
    md_dir = os.path.dirname(os.path.abspath(results_md))
    title = "## Generated report (`make bench`)" if mode == "full" else "## Generated report (`make bench-quick`)"
    out = [BEGIN, title, "",
           "Written by `bench/report.py` from the newest `bench/results/*.json`; do not edit by hand (the text "
           "between the report markers is replaced on every run). Time / ours = this row's mean over the mean of "
           "the fastest row of ours in the same group (> 1: slower than ours). Throughput counts the units the "
           "suite records in `extra_info` (pairs, problems, queries, frames, tokens).", ""]
    for doc in runs:
        meta = doc["streammem"]
        out += [f"### {meta.get('kind', 'cpu').upper()} run: `{meta.get('machine')}`", ""]
        out += describe_run(doc, os.path.join(md_dir, "RESULTS.md"))
        out.append("")
        out += regression_paragraph(doc, md_dir) + [""]
        for group, rows in group_benchmarks(doc).items():
            out += [f"**{group}** (`{suite_of(rows[0])}`)", ""] + group_table(rows) + [""]
    if plots:
        out += ["### Scaling plots", ""]
        for title, path in plots:
            out += [f"![{title}]({os.path.relpath(path, md_dir)})", ""]
    out.append(END)
    return "\n".join(out)


def replace_block(text: str, block: str) -> str:
    """Put ``block`` between the markers; insert the markers after the intro paragraph when absent."""
    if BEGIN in text and END in text and text.index(BEGIN) < text.index(END):
        start, stop = text.index(BEGIN), text.index(END) + len(END)
        return text[:start] + block + text[stop:]
    lines = text.split("\n")
    i = 0
    while i < len(lines) and not lines[i].startswith("# "):
        i += 1
    i += 1  # past the title
    while i < len(lines) and not lines[i].strip():
        i += 1
    while i < len(lines) and lines[i].strip() and not lines[i].startswith("#"):
        i += 1  # past the intro paragraph
    if i > len(lines):
        i = len(lines)
    head, tail = lines[:i], lines[i:]
    while tail and not tail[0].strip():
        tail = tail[1:]
    return "\n".join(head + ["", block, ""] + tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=tuple(OUTPUTS), default="full",
                        help="which runs to report; each mode has its own page and plots (default: full)")
    parser.add_argument("--results-dir", default=os.path.join(BENCH_DIR, "results"))
    parser.add_argument("--results-md", default=None, help="page to write (default: the mode's, see OUTPUTS)")
    parser.add_argument("--plots-dir", default=None, help="plots folder (default: the mode's)")
    parser.add_argument("--baseline-dir", default=BASELINE_DIR,
                        help="committed baselines <machine>-<mode>.json (read at git HEAD)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    results_md = args.results_md or OUTPUTS[args.mode][0]
    plots_dir = args.plots_dir or OUTPUTS[args.mode][1]

    docs = find_results(args.results_dir, args.mode)
    runs = [view for view in (combined_run(docs, "cpu", args.baseline_dir), combined_run(docs, "gpu", args.baseline_dir))
            if view is not None]
    if not runs:
        print(f"[report] no {args.mode} bench/run.py results in {args.results_dir}; run `python -m bench.run"
              + (" --quick" if args.mode == "quick" else "") + "` first")
        return 1
    plots: list[tuple[str, str]] = []
    if not args.no_plots:
        for doc in runs:
            plots += make_plots(doc, plots_dir, doc["streammem"]["kind"])
    block = render_block(runs, plots, results_md, args.mode)
    if os.path.exists(results_md):
        text = open(results_md).read()
    else:
        text = QUICK_HEADER if args.mode == "quick" else "# Benchmark results\n"
        os.makedirs(os.path.dirname(os.path.abspath(results_md)), exist_ok=True)
    with open(results_md, "w") as fh:
        fh.write(replace_block(text, block))
    for doc in runs:
        for line in doc["_regressions"]:
            print(line)
        if doc["_regressions"] and load_note(doc):
            print(load_note(doc))
    print(f"[report] {sum(len(d.get('benchmarks', [])) for d in runs)} benchmarks, {len(plots)} plots -> "
          f"{os.path.relpath(results_md)}" + (f" and {os.path.relpath(plots_dir)}/" if plots else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
