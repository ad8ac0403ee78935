"""Run every benchmark suite in ``bench/`` with pytest-benchmark, compare with the committed baseline.

    python -m bench.run                 # full run (up to ~45 min on 2 cores): JSON in bench/results/
    python -m bench.run --save-baseline # ... and make it the record: bench/baseline/<machine>-full.json,
                                        #   then bench/RESULTS.md and bench/plots/ regenerated from it (make bench)
    python -m bench.run --only tree --save-baseline   # re-measure one suite, replace it in the record
    python -m bench.run --quick         # smoke run: small sizes, few rounds (< 3 min on 2 idle cores)
                                        #   -> bench/results/quick/RESULTS.md and plots/ (git-ignored)
    python -m bench.run --gpu           # on a CUDA machine (bench/gpu.sh --full calls this)

Each ``bench/bench_<suite>.py`` runs with pytest-benchmark in its own subprocess,
so a crash, a missing optional peer or a timeout in one suite is reported and the
others still run; the exit status is then 1 (a suite that errors or runs past its
time limit fails the run, after the results are written).  The per-suite JSON
files (``--benchmark-json``) are merged into one
``bench/results/<machine>-<mode>-<date>.json`` (pytest-benchmark's own format,
with each row's p20 and p80, plus a ``streammem`` key recording the command, the
library versions, the load average and how every suite ended).

Regressions are judged against the committed baseline of the same machine and
mode, ``bench/baseline/<machine>-<mode>.json`` at git HEAD: ``pytest-benchmark
compare`` writes both side by side into ``bench/results/<run>.compare.txt``, and a
``REGRESSION:`` line names every row of ours whose p20-p80 range lies entirely
above the baseline's (``bench/report.py``, ``regression_lines``).  Regressions are
report lines, never failures.

The record, ``bench/RESULTS.md``, is generated from the committed JSON only
(``python -m bench.report``): a full run changes it only with ``--save-baseline``,
which writes the run (without the per-round samples) as the new baseline and
regenerates the page from it; commit both.
"""
from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import platform
import re
import resource
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from bench import report

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
RESULTS_DIR = os.path.join(BENCH_DIR, "results")

# Suites left out of --quick, with the reason printed when they are skipped.  Each
# entry was measured: the whole quick run has to stay under 3 minutes on 2 cores.
QUICK_SKIPS: dict[str, str] = {
    "distributed": "starts a Ray cluster and shard actors with the real models, streams for seconds per grid "
                   "point: about 10 min on 2 cores; run `python -m bench.run --only distributed`",
    "caption_reuse": "decodes with SmolLM2-135M: 72 s alone with STREAMMEM_BENCH_QUICK=1 on 2 idle cores, "
                     "which would take the quick run past 3 minutes; run "
                     "`python -m bench.run --only caption_reuse`",
}
# Cases left out of --quick within a suite (a pytest -k expression), with the reason.
QUICK_SELECT: dict[str, tuple[str, str]] = {
    "boundaries": ("not bikes", "the bikes.mp4 cases load EfficientNet / TransNetV2 models"),
    "kmeans": ("not (test_ours and torch) and not (sklearn and c-tiny)",
               "no pure-torch reference backend of ours, no 512-problem scikit-learn loop (25 s a round loaded)"),
    "logprobs": ("T128 or memory", "only T = 128 rows (T = 1024 materialises 1024 x V logits per peer) and the "
                 "memory-vs-vocabulary cases"),
}
# Wall-clock limit per suite; a suite that runs past it is killed and reported.  Generous in
# --quick because a shared machine runs several times slower than an idle one.
QUICK_SUITE_TIMEOUT_S = 240
FULL_SUITE_TIMEOUT_S = 30 * 60
# pytest-benchmark's own round control, for the cases that do not use benchmark.pedantic.
QUICK_ROUND_ARGS = ["--benchmark-max-time=0.2", "--benchmark-min-rounds=3", "--benchmark-warmup=off"]
FULL_ROUND_ARGS = ["--benchmark-max-time=1.0", "--benchmark-min-rounds=5"]
# A progress line at most this often while cases finish, and a heartbeat after this long inside one case.
PROGRESS_EVERY_S = 20.0
HEARTBEAT_S = 60.0

LIBRARIES = {  # what the report shows -> distribution names to try, first installed wins
    "torch": ["torch"],
    "triton": ["triton"],
    "numpy": ["numpy"],
    "faiss": ["faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "faiss"],
    "scikit-learn": ["scikit-learn"],
    "opencv": ["opencv-python-headless", "opencv-python", "opencv-contrib-python"],
    "transformers": ["transformers"],
    "pytest-benchmark": ["pytest-benchmark"],
}


def discover_suites() -> list[str]:
    return sorted(os.path.basename(p)[len("bench_"):-3] for p in glob.glob(os.path.join(BENCH_DIR, "bench_*.py")))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def gpu_name() -> str | None:
    """Name of the first NVIDIA GPU from nvidia-smi (no torch import needed), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return names[0] if out.returncode == 0 and names else None


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_tag(gpu: bool) -> str:
    """Short tag naming the hardware, not the host: ``cpu2c-amd-epyc`` or ``gpu-nvidia-h100-80gb-hbm3``."""
    if gpu:
        return "gpu-" + slug(gpu_name() or "unknown")
    model = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$|\b\d+-core processor\b", "", cpu_model(), flags=re.I)
    return f"cpu{cpu_cores()}c-{slug(model)}"


def library_versions(libraries: dict[str, list[str]] = LIBRARIES) -> dict[str, str]:
    """Shown name -> the version of the first of its distributions that is installed, or "not installed"."""
    from importlib import metadata

    versions = {}
    for shown, dists in libraries.items():
        for dist in dists:
            try:
                versions[shown] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            versions[shown] = "not installed"
    return versions


def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
        return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"
    except OSError:
        return "unknown"


def fmt_duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


class SuiteProgress:
    """Turns the events of bench/_progress.py into ``[bench]`` lines: progress at most every
    ``every_s`` seconds as cases finish, and a heartbeat naming the running case when nothing
    was printed for ``heartbeat_s`` seconds."""

    def __init__(self, suite: str, every_s: float, heartbeat_s: float, start: float):
        self.suite, self.every_s, self.heartbeat_s = suite, every_s, heartbeat_s
        self.start = self.last_print = start
        self.total: int | None = None
        self.done = 0
        self.current: str | None = None
        self.current_since = start

    def _print(self, text: str, now: float) -> None:
        print(f"[bench] {self.suite}: {text}", flush=True)
        self.last_print = now

    def _count(self) -> str:
        return f"{self.done}/{self.total if self.total is not None else '?'} cases"

    def event(self, line: str, now: float) -> None:
        kind, _, arg = line.strip().partition(" ")
        if kind == "collected":
            self.total = int(arg)
        elif kind == "start":
            self.current, self.current_since = arg.split("::", 1)[-1], now
        elif kind == "finish":
            self.done += 1
            self.current = None
            if now - self.last_print >= self.every_s:
                self._print(f"{self._count()} done, {fmt_duration(now - self.start)}", now)

    def tick(self, now: float) -> None:
        if self.current is not None and now - self.last_print >= self.heartbeat_s:
            self._print(f"still running {self.current} ({fmt_duration(now - self.current_since)} in it; "
                        f"{self._count()} done, {fmt_duration(now - self.start)})", now)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the suite and anything it started (its own session)
    except ProcessLookupError:
        pass
    proc.wait()


def _follow(proc: subprocess.Popen, read_fd: int, progress: SuiteProgress, deadline: float) -> bool:
    """Relay progress until the suite exits (True) or the deadline passes (False, the suite is killed)."""
    pending = b""
    try:
        while True:
            ready, _, _ = select.select([read_fd], [], [], 0.25)
            now = time.perf_counter()
            if ready:
                chunk = os.read(read_fd, 65536)
                if not chunk:  # every writer closed: the suite's process has ended
                    proc.wait()
                    return True
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    progress.event(line.decode(errors="replace"), now)
            progress.tick(now)
            if now > deadline:
                _kill(proc)
                return False
    except BaseException:  # Ctrl-C: the suite runs in its own session and would not see it
        _kill(proc)
        raise


def run_suite(suite: str, json_path: str, quick: bool, gpu: bool, timeout_s: float, *, path: str | None = None,
              progress_every_s: float = PROGRESS_EVERY_S, heartbeat_s: float = HEARTBEAT_S) -> dict:
    """Run one suite in a subprocess, printing its progress; return how it ended (never raises for a failing suite).

    ``path`` overrides ``bench/bench_<suite>.py`` (tests run a tiny suite through here).
    """
    env = dict(os.environ)
    env["STREAMMEM_BENCH_QUICK"] = "1" if quick else "0"
    env.pop("TRITON_INTERPRET", None)  # benchmarks time compiled code, never the interpreter
    if gpu:
        env["STREAMMEM_BENCH_DEVICE"] = "cuda"
    cmd = [sys.executable, "-m", "pytest", path or os.path.join("bench", f"bench_{suite}.py"), "-q",
           "-p", "no:cacheprovider", "-p", "bench._progress",  # python -m puts the root (cwd) on sys.path
           "--benchmark-only", f"--benchmark-json={json_path}", "--benchmark-disable-gc",
           *(QUICK_ROUND_ARGS if quick else FULL_ROUND_ARGS)]
    if quick and suite in QUICK_SELECT:
        cmd += ["-k", QUICK_SELECT[suite][0]]
        print(f"[bench] {suite}: --quick runs only -k {QUICK_SELECT[suite][0]!r}: {QUICK_SELECT[suite][1]}", flush=True)
    print(f"[bench] {suite}: {' '.join(shlex.quote(c) for c in cmd[2:])}", flush=True)
    start = time.perf_counter()
    # CPU seconds of the suite's process: unlike wall time they barely grow when other jobs share
    # the cores, so they estimate what an idle machine needs (wall >= cpu / cores).
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = load_average()
    read_fd, write_fd = os.pipe()
    env["STREAMMEM_PROGRESS_FD"] = str(write_fd)
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a chatty suite can never block on it
        try:
            proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                    pass_fds=(write_fd,), start_new_session=True)
        finally:
            os.close(write_fd)
        try:
            finished = _follow(proc, read_fd, SuiteProgress(suite, progress_every_s, heartbeat_s, start),
                               start + timeout_s)
        finally:
            os.close(read_fd)
        rc = proc.returncode if finished else None
        log.seek(0)
        output = log.read()
    seconds = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    summary = next((line for line in reversed(output.splitlines()) if re.search(r"passed|failed|error|skipped", line)),
                   "")
    if rc is None:
        status = f"timed out after {timeout_s:g} s"
    elif rc == 0:
        status = "ok"
    elif rc == 5:
        status = "no benchmarks collected"
    else:
        status = f"pytest exit code {rc}"
    print(f"[bench] {suite}: {status} in {seconds:.0f} s wall, {cpu_seconds:.0f} s CPU ({summary.strip('= ')})",
          flush=True)
    if rc not in (0, 5):
        tail = "\n".join(output.splitlines()[-15:])
        print(f"[bench] {suite}: last lines of its output:\n{tail}", flush=True)
    if quick and suite in QUICK_SELECT:
        status += f" (quick: -k '{QUICK_SELECT[suite][0]}')"
    return {"suite": suite, "status": status, "seconds": round(seconds, 1), "cpu_seconds": round(cpu_seconds, 1),
            "pytest_summary": summary.strip("= "), "load_average_before": load_before,
            "load_average_after": load_average()}


def merge_results(parts: list[tuple[str, str]]) -> dict:
    """One pytest-benchmark document from the per-suite JSON files (suites that wrote none are left out)."""
    merged: dict = {"benchmarks": []}
    for suite, path in parts:
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            continue
        with open(path) as fh:
            doc = json.load(fh)
        for key in ("machine_info", "commit_info", "datetime", "version"):
            merged.setdefault(key, doc.get(key))
        for bench in doc.get("benchmarks", []):
            bench["suite"] = suite
            merged["benchmarks"].append(bench)
    return report.add_percentiles(merged)  # p20/p80 survive into the baseline, which drops the samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (STREAMMEM_BENCH_QUICK=1)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="suites to run, e.g. motion kmeans")
    parser.add_argument("--gpu", action="store_true", help="GPU run: sets STREAMMEM_BENCH_DEVICE=cuda")
    parser.add_argument("--no-report", action="store_true", help="write the JSON only, regenerate no page")
    parser.add_argument("--save-baseline", action="store_true",
                        help="also write the run to bench/baseline/<machine>-<mode>.json, the reference of later "
                             "regression checks (a full run's is the record: bench/RESULTS.md is regenerated from "
                             "it); with --only, replace just those suites in it")
    args = parser.parse_args(argv)

    available = discover_suites()
    if args.only:
        unknown = sorted(set(args.only) - set(available))
        if unknown:
            parser.error(f"--only: unknown suite(s) {unknown}; available: {available}")
        suites = [s for s in available if s in args.only]
    else:
        suites = available
    if args.gpu and gpu_name() is None:
        print("[bench] --gpu: nvidia-smi finds no NVIDIA GPU; nothing to do", flush=True)
        return 0

    mode = "quick" if args.quick else "full"
    started = dt.datetime.now(dt.timezone.utc)
    machine = machine_tag(args.gpu)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    out_path = os.path.join(RESULTS_DIR, f"{machine}-{mode}-{started:%Y-%m-%dT%H%M%SZ}.json")
    command = "python -m bench.run" + (" --quick" if args.quick else "") + (" --gpu" if args.gpu else "") + \
        (" --only " + " ".join(args.only) if args.only else "")
    load_before = load_average()

    runs, parts = [], []
    with tempfile.TemporaryDirectory(prefix="streammem-bench-") as tmp:
        for suite in suites:
            if args.quick and suite in QUICK_SKIPS and not args.only:
                print(f"[bench] {suite}: skipped in --quick mode: {QUICK_SKIPS[suite]}", flush=True)
                runs.append({"suite": suite, "status": "skipped in --quick: " + QUICK_SKIPS[suite], "seconds": 0.0})
                continue
            part = os.path.join(tmp, f"{suite}.json")
            runs.append(run_suite(suite, part, args.quick, args.gpu,
                                  QUICK_SUITE_TIMEOUT_S if args.quick else FULL_SUITE_TIMEOUT_S))
            parts.append((suite, part))
        merged = merge_results(parts)

    total = (dt.datetime.now(dt.timezone.utc) - started).total_seconds()
    total_cpu = sum(r.get("cpu_seconds", 0.0) for r in runs)
    merged["streammem"] = {
        "machine": machine,
        "kind": "gpu" if args.gpu else "cpu",
        "mode": mode,
        "cpu_model": cpu_model(),
        "cores": cpu_cores(),
        "gpu": gpu_name() if args.gpu else None,
        "libraries": library_versions(),
        "command": command,
        "started_utc": started.isoformat(timespec="seconds"),
        "total_seconds": round(total, 1),
        "total_cpu_seconds": round(total_cpu, 1),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "suites": runs,
    }
    with open(out_path, "w") as fh:
        json.dump(merged, fh, indent=1)
    print(f"[bench] {len(merged['benchmarks'])} benchmarks from {len(parts)} suites in {total:.0f} s wall, "
          f"{total_cpu:.0f} s CPU -> "
          f"{os.path.relpath(out_path, REPO_ROOT)}", flush=True)

    compare_with_baseline(merged, out_path, machine, mode)
    if args.save_baseline:
        save_baseline(merged, machine, mode, suites if args.only else None)
    if args.no_report:
        pass
    elif mode == "quick":
        report.main(["--mode", "quick", "--results-dir", RESULTS_DIR])
    elif args.save_baseline:
        report.main(["--mode", "full", "--baseline-dir", report.BASELINE_DIR])
    else:
        print("[bench] the record (bench/RESULTS.md) is generated from the committed baseline: this run changes it "
              "only with --save-baseline", flush=True)
    failed = [r["suite"] for r in runs if not suite_succeeded(r["status"])]
    if failed:
        print(f"[bench] FAILED suites: {', '.join(failed)} (their status above); exit 1", flush=True)
        return 1
    return 0


def suite_succeeded(status: str) -> bool:
    """A suite that ran to its end without a failing case (or was left out on purpose)."""
    return status.startswith(("ok", "skipped in --quick", "no benchmarks collected"))


def save_baseline(merged: dict, machine: str, mode: str, only: list[str] | None) -> None:
    """Write ``merged`` as bench/baseline/<machine>-<mode>.json; with ``--only``, replace just those suites."""
    path = report.baseline_path(report.BASELINE_DIR, machine, mode)
    doc = report.strip_for_baseline(merged)
    if only is not None:
        if not os.path.exists(path):
            print(f"[bench] --save-baseline --only: no {os.path.relpath(path, REPO_ROOT)} to update; run every suite "
                  "once with --save-baseline first", flush=True)
            return
        with open(path) as fh:
            old = json.load(fh)
        kept = [b for b in old.get("benchmarks", []) if report.suite_of(b) not in only]
        doc["benchmarks"] = kept + doc["benchmarks"]
        doc["streammem"]["suites"] = [s for s in old["streammem"].get("suites", []) if s["suite"] not in only] + \
            doc["streammem"]["suites"]
        doc["streammem"]["updated_suites"] = {suite: doc["streammem"]["started_utc"] for suite in only}
        doc["streammem"]["started_utc"] = old["streammem"].get("started_utc")
        doc["streammem"]["command"] = old["streammem"].get("command")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=0)
    print(f"[bench] baseline written to {os.path.relpath(path, REPO_ROOT)}"
          + (f" (suites {', '.join(only)} replaced)" if only else "") + ": commit it to compare later runs with it",
          flush=True)


def compare_with_baseline(merged: dict, out_path: str, machine: str, mode: str) -> list[str]:
    """Print the regressions against the committed baseline and save ``pytest-benchmark compare``'s table of both
    as ``<run>.compare.txt``; return the regression lines."""
    baseline = report.committed_baseline(report.BASELINE_DIR, machine, mode)
    if baseline is None:
        print(f"[bench] no committed baseline for {machine}-{mode} in bench/baseline/: no comparison", flush=True)
        return []
    regressions = report.regression_lines(merged, baseline)
    before = (baseline.get("streammem") or {}).get("load_average_before", "?")
    verdict = f"{len(regressions)} found" if regressions else "none"
    print(f"[bench] regression check against the committed {os.path.relpath(baseline['_path'], REPO_ROOT)} (rows of "
          f"ours whose p20-p80 range lies above the baseline's; load average {before} before the baseline's run, "
          f"{merged.get('streammem', {}).get('load_average_before', '?')} before this one): {verdict}", flush=True)
    for line in regressions:
        print(f"[bench] {line}", flush=True)
    compare_path = write_compare_table(baseline, out_path)
    print(f"[bench] side-by-side table with the committed baseline: {os.path.relpath(compare_path, REPO_ROOT)}",
          flush=True)
    return regressions


def write_compare_table(baseline: dict, out_path: str) -> str:
    """``pytest-benchmark compare`` of the baseline and the run at ``out_path``, saved as ``<run>.compare.txt``."""
    with tempfile.TemporaryDirectory(prefix="streammem-baseline-") as tmp:
        committed = os.path.join(tmp, "committed-" + os.path.basename(baseline["_path"]))
        with open(committed, "w") as fh:
            json.dump(report.strip_for_baseline(baseline), fh)
        cmd = [sys.executable, "-m", "pytest_benchmark", "compare", committed, out_path, "--group-by=fullname",
               "--columns=median,mean,rounds", "--sort=name"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            text = proc.stdout + proc.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"pytest-benchmark compare failed: {exc}"
    compare_path = out_path[:-len(".json")] + ".compare.txt"
    with open(compare_path, "w") as fh:
        fh.write(f"# {os.path.relpath(out_path, REPO_ROOT)} vs the committed "
                 f"{os.path.relpath(baseline['_path'], REPO_ROOT)} (git HEAD)\n{text}")
    return compare_path


if __name__ == "__main__":
    sys.exit(main())
