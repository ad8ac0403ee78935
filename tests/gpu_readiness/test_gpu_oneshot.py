"""The one-shot GPU run (bash bench/gpu.sh) keeps the GPU machine's limits, checked without a GPU.

The machine is lent for 15 minutes, has no network and no package index, and sends
back at most 8 files: the run must fit 8 minutes by its own caps, write only its
declared files, and never call make, create a virtual environment or ask an index.
Here the driver runs end to end with every command it starts faked, which records
what it would have run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from bench import gpu_bench, gpu_oneshot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_out_files_fit_what_comes_back():
    files = gpu_oneshot.OUT_FILES
    assert len(files) <= 8 and len(set(files)) == len(files)
    assert all("/" not in f for f in files)  # directly in $OUT
    assert {"summary.json", "tests.xml", "bench.json", "gpu.md"} <= set(files)


def test_stage_caps_add_up_to_eight_minutes_or_less():
    caps = dict(gpu_oneshot.STAGES)
    assert sum(caps.values()) <= gpu_oneshot.TOTAL_CAP_S <= 8 * 60
    assert sum(gpu_oneshot.BENCH_SUITE_CAPS_S.values()) <= caps["bench"]
    assert set(gpu_oneshot.BENCH_SUITE_CAPS_S) == set(gpu_bench.SUITES)  # every suite runs, each under a cap
    assert list(caps) == ["environment", "carry", "build", "tests", "peaks", "bench", "report"]


def test_gpu_tests_are_chosen_by_marker_not_by_path():
    assert gpu_oneshot.GPU_TESTS == ("-m", "gpu") and gpu_oneshot.HOST_SYNC_TESTS == ("-m", "host_sync")
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m",
                          "gpu or host_sync", "-o", "addopts="], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    # Every op's cuda-device cases, its CUDA-graph captures and its no-host-sync checks are in.
    for op in ("motion", "kmeans", "tree", "graph", "boundaries", "logprobs"):
        mine = [i for i in ids if op in i.split("::")[0]]
        assert any("cuda" in i for i in mine), op
        assert any("cuda_graph" in i for i in mine), op
        assert any("sync" in i for i in mine), op
    assert len(ids) > 100


class FakeMachine:
    """Stands in for every command the driver starts: records it and leaves what a good run leaves."""

    def __init__(self, fail_suite: str | None = None):
        self.commands: list[list[str]] = []
        self.fail_suite = fail_suite

    def run(self, cmd, **kwargs):
        self.commands.append(list(cmd))
        out = ""
        if cmd[0] == "nvidia-smi":
            out = "9.0\n" if "compute_cap" in cmd[1] else "NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB\n"
        elif cmd[:2] == [sys.executable, "-c"]:
            out = json.dumps({"cuda": "13.0", "available": True, "devices": 1}) + "\n"
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    def popen(self, cmd, **kwargs):
        self.commands.append(list(cmd))
        rc = 0
        value = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in cmd if a.startswith("--") and "=" in a}
        if "--junitxml" in value:
            with open(value["--junitxml"], "w") as fh:
                fh.write('<testsuites><testsuite name="pytest" tests="1"><testcase classname="tests.test_x" '
                         'name="test_y[cuda]"/></testsuite></testsuites>')
        if "gpu_bench.py" in " ".join(cmd):
            out = cmd[cmd.index("--out") + 1]
            if "peaks" in cmd:
                with open(out, "w") as fh:
                    json.dump({"copy_bytes": 1, "copy_gbps": 3000.0, "matmul_fp32_tflops": 50.0,
                               "matmul_tf32_tflops": 400.0, "matmul_bf16_tflops": 700.0, "matmul_n": 8192}, fh)
            else:
                suite = cmd[cmd.index("run") + 1]
                with open(out, "a") as fh:
                    fh.write(json.dumps({"suite": suite, "group": f"{suite}-g", "provider": "ours-triton",
                                         "kind": "ours", "dtype": "float32", "bytes": 3e9, "flops": 1e12,
                                         "median_s": 0.002, "p20_s": 0.0019, "p80_s": 0.0021, "status": "ok"}) + "\n")
                rc = 1 if suite == self.fail_suite else 0
        return FakeProcess(rc)


class FakeProcess:
    pid = -1

    def __init__(self, rc):
        self.rc = rc

    def wait(self, timeout=None):
        return self.rc


@pytest.fixture()
def machine(monkeypatch, tmp_path):
    def start(fail_suite=None):
        fake = FakeMachine(fail_suite)
        monkeypatch.setattr(subprocess, "run", fake.run)
        monkeypatch.setattr(subprocess, "Popen", fake.popen)
        monkeypatch.setattr(gpu_oneshot, "SCRATCH", str(tmp_path / "scratch"))
        monkeypatch.setattr(gpu_oneshot, "CARRY_SITE", str(tmp_path / "scratch" / "site"))
        monkeypatch.setattr(gpu_oneshot, "CARRY_WHEELS", str(tmp_path / "wheels"))
        monkeypatch.setattr(gpu_oneshot, "find_nvcc", lambda: "/opt/cuda/bin/nvcc")
        (tmp_path / "wheels").mkdir(exist_ok=True)
        (tmp_path / "wheels" / "faiss_cpu-1.0-cp312-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"")
        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
        monkeypatch.setenv("OUT", str(out))
        return fake, out

    return start


def test_a_good_run_writes_its_files_and_calls_no_make_pip_index_or_venv(machine):
    fake, out = machine()
    assert gpu_oneshot.main([]) == 0
    assert sorted(os.listdir(out)) == sorted(gpu_oneshot.OUT_FILES)
    for cmd in fake.commands:
        words = [os.path.basename(w) for w in cmd]
        assert "make" not in words and "venv" not in words and "virtualenv" not in words, cmd
        if "pip" in words:
            assert "--no-index" in cmd and "--no-deps" in cmd and "--target" in cmd, cmd
    pip = [c for c in fake.commands if "pip" in c]
    assert len(pip) == 1  # the carried wheels, once
    nvcc = [c for c in fake.commands if c[0].endswith("nvcc")]
    assert nvcc and all("arch=compute_90,code=sm_90" in c and "arch=compute_80,code=sm_80" not in c for c in nvcc)
    assert any(c[-2:] == ["-j", str(gpu_oneshot.cores())] for c in fake.commands if "setup.py" in c)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit"] == 0 and [s["stage"] for s in summary["stages"]] == [s for s, _ in gpu_oneshot.STAGES]
    assert summary["device"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert "| kmeans-g | ours-triton | 2 ms |" in (out / "gpu.md").read_text()  # with its fraction of the peaks
    assert "| 50% |" in (out / "gpu.md").read_text()  # 3e9 bytes in 2 ms = 1500 GB/s = 50% of 3000 GB/s


def test_a_failing_suite_fails_the_run_and_the_others_still_run(machine):
    fake, out = machine(fail_suite="tree")
    assert gpu_oneshot.main([]) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_stages"] == ["bench"]
    suites = [c[c.index("run") + 1] for c in fake.commands if "gpu_bench.py" in " ".join(c) and "run" in c]
    assert suites == list(gpu_oneshot.BENCH_SUITE_CAPS_S)


def test_the_one_shot_path_of_gpu_sh_runs_no_make_pip_or_venv():
    with open(os.path.join(ROOT, "bench", "gpu.sh")) as fh:
        script = fh.read()
    one_shot = script[:script.index("\nshift\n")]  # what runs before the --full branch
    code = "\n".join(line for line in one_shot.splitlines() if not line.lstrip().startswith("#"))
    for word in ("make", "pip", "pip3", "venv", "virtualenv", "conda"):
        assert not re.search(rf"\b{word}\b", code), word
    assert "PYTHONPATH=" in code and "gpu_oneshot.py" in code


def test_gpu_sh_says_so_without_a_cuda_torch(tmp_path):
    fake_python = tmp_path / "python3"
    fake_python.write_text("#!/bin/sh\nexit 1\n")  # imports no torch at all
    fake_python.chmod(0o755)
    out = subprocess.run(["bash", os.path.join(ROOT, "bench", "gpu.sh")], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": str(fake_python)}, timeout=60)
    assert out.returncode == 2 and "does not import a CUDA build of torch" in out.stdout


@pytest.mark.parametrize("suite", gpu_bench.SUITES)
def test_every_suite_sets_up_and_calls_our_backends_at_toy_sizes_on_cpu(suite):
    """Each suite's set-up and each of our cases, called once at toy sizes on the CPU: a suite that
    names a moved op or passes a stale argument fails here, not in the GPU machine's minutes.
    The peers are not called (their torch.compile would cost a compile per case)."""
    called = 0
    for case in getattr(gpu_bench, f"suite_{suite}")(torch.device("cpu"), True):
        if isinstance(case, gpu_bench.Case) and case.kind == "ours":
            case.fn()
            called += 1
    assert called, f"suite {suite} ran none of our backends on the CPU"
