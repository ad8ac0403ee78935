"""Benchmark: gathered token log-probs vs log_softmax+gather and cross_entropy.

Two ways to run it:

* ``pytest bench/bench_logprobs.py --benchmark-only`` -- pytest-benchmark timings
  of every provider on the same inputs in the same run;
* ``python bench/bench_logprobs.py`` -- one fresh subprocess per (case,
  provider) measuring the median time *and* the peak extra memory: the RSS
  high-water mark (``ru_maxrss``) after the op minus the high-water mark once
  the inputs exist and the libraries are warm.  Prints a markdown table.

``STREAMMEM_BENCH_QUICK=1`` shrinks the grid.  Inputs: H = 576 (SmolLM2-135M),
V = 49,152 (SmolLM2) and 151,936 (Qwen2), float32, T rows of random data.

The ``logprobs-memory-*`` groups put the memory curve into the pytest JSON: for
``linear_token_logprobs`` and its peers at T = 256 rows and a range of vocabulary
sizes, each case measures its peak extra RSS in a fresh subprocess (the same
``--one`` measurement as above) and records it as ``extra_info["peak_extra_bytes"]``
next to the in-process timing; bench/report.py plots memory against V.

In a GPU run (``STREAMMEM_BENCH_DEVICE=cuda``, bench/_device.py) the
``logprobs-gpu-*`` groups time ours (auto, triton) and the torch peers on CUDA
tensors and record the peak extra CUDA memory (``torch.cuda.max_memory_allocated``
above the inputs).
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from bench._device import gpu_params, require_gpu, synced  # noqa: E402
from streammem_kernels import linear_token_logprobs, token_logprobs  # noqa: E402

QUICK = os.environ.get("STREAMMEM_BENCH_QUICK") == "1"
WIDTH = 576
VOCABS = [49_152, 151_936]
TOKEN_ROWS = [128, 1024] if QUICK else [128, 1024, 4096]
LINEAR_ROWS = [128] if QUICK else [128, 1024, 4096]
MEMORY_ROWS = 256
MEMORY_VOCABS = [8_192, 32_768, 151_936] if QUICK else [8_192, 32_768, 65_536, 151_936]
# Quick mode leaves out cross_entropy: it peaks like log_softmax+gather (both hold the (T, V) logits twice).
MEMORY_PROVIDERS = ["ours[cpp]", "matmul+log_softmax+gather"] + ([] if QUICK else ["matmul+cross_entropy(none)"])


def make_inputs(kind: str, rows: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    if kind == "token":
        # In-place scaling: a temporary copy would raise the RSS high-water mark
        # before the op runs and hide the op's own peak.
        return {"logits": torch.randn(rows, vocab, generator=g).mul_(3), "targets": targets}
    return {"hidden": torch.randn(rows, WIDTH, generator=g),
            "weight": torch.randn(vocab, WIDTH, generator=g).mul_(3 / WIDTH ** 0.5), "targets": targets}


def _log_softmax_gather(logits, targets):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None])[:, 0]


def _cross_entropy(logits, targets):
    return -F.cross_entropy(logits.float(), targets, reduction="none")


PROVIDERS = {
    "token": {
        "ours[cpp]": lambda x: token_logprobs(x["logits"], x["targets"], backend="cpp"),
        "ours[torch-chunked]": lambda x: token_logprobs(x["logits"], x["targets"], backend="torch"),
        "log_softmax+gather": lambda x: _log_softmax_gather(x["logits"], x["targets"]),
        "cross_entropy(none)": lambda x: _cross_entropy(x["logits"], x["targets"]),
    },
    "linear": {
        "ours[torch-chunked]": lambda x: linear_token_logprobs(x["hidden"], x["weight"], x["targets"], backend="torch"),
        "ours[cpp]": lambda x: linear_token_logprobs(x["hidden"], x["weight"], x["targets"], backend="cpp"),
        "matmul+log_softmax+gather": lambda x: _log_softmax_gather(x["hidden"] @ x["weight"].T, x["targets"]),
        "matmul+cross_entropy(none)": lambda x: _cross_entropy(x["hidden"] @ x["weight"].T, x["targets"]),
    },
}


def _cases():
    for kind, rows_list in (("token", TOKEN_ROWS), ("linear", LINEAR_ROWS)):
        # Quick mode keeps the linear form at the smaller vocabulary (one 151,936-row
        # GEMM per provider and round is seconds on 2 shared cores).
        for vocab in (VOCABS[:1] if QUICK and kind == "linear" else VOCABS):
            for rows in rows_list:
                for provider in PROVIDERS[kind]:
                    yield kind, vocab, rows, provider


# --------------------------------------------------------------------------
# pytest-benchmark timings
# --------------------------------------------------------------------------
@pytest.mark.parametrize("kind,vocab,rows,provider", list(_cases()),
                         ids=[f"{k}-V{v}-T{t}-{p}" for k, v, t, p in _cases()])
def test_logprobs_time(benchmark, kind, vocab, rows, provider):
    inputs = make_inputs(kind, rows, vocab)
    fn = PROVIDERS[kind][provider]
    expected = _log_softmax_gather(inputs["logits"], inputs["targets"]) if kind == "token" else None
    rounds = 1 if QUICK or rows * vocab >= 2e8 else 3
    result = benchmark.pedantic(fn, args=(inputs,), rounds=rounds, warmup_rounds=0 if QUICK else 1)
    benchmark.extra_info["tokens"] = rows
    if expected is not None:
        torch.testing.assert_close(result, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("vocab", MEMORY_VOCABS)
@pytest.mark.parametrize("provider", MEMORY_PROVIDERS)
def test_linear_memory(benchmark, vocab, provider):
    """Time in-process, peak extra RSS in a fresh subprocess (an in-process high-water mark cannot be reset)."""
    measured = _measure_in_subprocess("linear", vocab, MEMORY_ROWS, provider, repeats=1)
    inputs = make_inputs("linear", MEMORY_ROWS, vocab)
    benchmark.group = f"logprobs-memory-linear-T{MEMORY_ROWS}-V{vocab}"
    benchmark.extra_info.update(provider=provider, tokens=MEMORY_ROWS, vocab=vocab,
                                peak_extra_bytes=measured["extra_bytes"])
    benchmark.pedantic(PROVIDERS["linear"][provider], args=(inputs,), rounds=1 if QUICK else 3,
                       warmup_rounds=0 if QUICK else 1)


# --------------------------------------------------------------------------
# GPU: ours and the torch peers on CUDA tensors, peak CUDA memory (GPU runs only)
# --------------------------------------------------------------------------
GPU_PROVIDERS = {
    "token": {"ours[auto]": lambda x: token_logprobs(x["logits"], x["targets"]),
              "ours[triton]": lambda x: token_logprobs(x["logits"], x["targets"], backend="triton"),
              "log_softmax+gather": PROVIDERS["token"]["log_softmax+gather"],
              "cross_entropy(none)": PROVIDERS["token"]["cross_entropy(none)"]},
    "linear": {"ours[auto]": lambda x: linear_token_logprobs(x["hidden"], x["weight"], x["targets"]),
               "ours[triton]": lambda x: linear_token_logprobs(x["hidden"], x["weight"], x["targets"],
                                                               backend="triton"),
               "matmul+log_softmax+gather": PROVIDERS["linear"]["matmul+log_softmax+gather"],
               "matmul+cross_entropy(none)": PROVIDERS["linear"]["matmul+cross_entropy(none)"]},
}
GPU_CASES = [(kind, vocab, rows, provider) for kind in GPU_PROVIDERS for vocab in VOCABS for rows in (1024, 8192)
             for provider in GPU_PROVIDERS[kind]]


@pytest.mark.parametrize("case", gpu_params(*GPU_CASES), ids=lambda c: "-".join(map(str, c)) if c else "none")
def test_gpu(benchmark, case):
    device = require_gpu()
    kind, vocab, rows, provider = case
    inputs = {k: v.to(device) for k, v in make_inputs(kind, rows, vocab).items()}
    fn = synced(GPU_PROVIDERS[kind][provider], device)
    fn(inputs)  # compile / warm up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn(inputs)
    extra = torch.cuda.max_memory_allocated() - before
    benchmark.group = f"logprobs-gpu-{kind}-V{vocab}-T{rows}"
    benchmark.extra_info.update(provider=provider + "-gpu", tokens=rows, vocab=vocab, peak_extra_bytes=extra)
    benchmark.pedantic(fn, args=(inputs,), rounds=10, warmup_rounds=1)


# --------------------------------------------------------------------------
# Fresh-subprocess time + peak extra RSS
# --------------------------------------------------------------------------
def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    """The RSS high-water mark: VmHWM (resettable) where /proc has it, else ru_maxrss."""
    hwm = _status_kib("VmHWM")
    if hwm is not None:
        return hwm * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _measure_one(kind: str, vocab: int, rows: int, provider: str, repeats: int) -> dict:
    fn = PROVIDERS[kind][provider]
    fn(make_inputs(kind, 4, 256, seed=1))  # load native modules, MKL, thread pools
    inputs = make_inputs(kind, rows, vocab)
    # Without the reset, a high-water mark left by imports or input creation above the
    # current RSS would hide the op's peak (it reads 0 whenever the op fits under it).
    if _reset_peak_rss():
        before = _status_kib("VmRSS") * 1024
    else:
        before = _peak_rss_bytes()
    start = time.perf_counter()
    out = fn(inputs)
    first = time.perf_counter() - start
    extra = _peak_rss_bytes() - before
    times = [first]
    for _ in range(repeats - 1):
        start = time.perf_counter()
        fn(inputs)
        times.append(time.perf_counter() - start)
    return {"time_s": statistics.median(times), "extra_bytes": max(extra, 0), "checksum": float(out.double().sum())}


def _measure_in_subprocess(kind: str, vocab: int, rows: int, provider: str, repeats: int) -> dict:
    """``_measure_one`` in a fresh interpreter, so its RSS high-water mark belongs to this case alone."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", kind, str(vocab), str(rows), provider,
                           str(repeats)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"case {kind} V={vocab} T={rows} {provider} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        kind, vocab, rows, provider, repeats = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(
            sys.argv[6])
        print(json.dumps(_measure_one(kind, vocab, rows, provider, repeats)))
        return
    rows_out = []
    for kind, vocab, rows, provider in _cases():
        if provider == "ours[torch-chunked]" and rows > 128:
            continue  # the fallback path (float64 / no native build); slowest row, shown at T = 128 only
        if kind == "linear" and rows > 1024 and vocab > VOCABS[0]:
            continue  # 4096 x 151,936 x 576 is 0.7 TFLOP per call per provider: minutes on 2 shared cores
        work = rows * vocab * (WIDTH if kind == "linear" else 1)
        repeats = 5 if work < 5e8 else (3 if work < 5e10 else 1)
        res = _measure_in_subprocess(kind, vocab, rows, provider, repeats)
        rows_out.append((kind, vocab, rows, provider, res))
        print(f"{kind:6s} V={vocab:6d} T={rows:5d} {provider:28s} {res['time_s'] * 1e3:10.1f} ms "
              f"{res['extra_bytes'] / 2**20:10.1f} MiB", flush=True)
    print()
    print("| op | V | T | provider | time (ms) | peak extra RSS (MiB) | memory vs log_softmax+gather | time vs log_softmax+gather |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, vocab, rows, provider, res in rows_out:
        base_name = "log_softmax+gather" if kind == "token" else "matmul+log_softmax+gather"
        base = next(r for k, v, t, p, r in rows_out if (k, v, t, p) == (kind, vocab, rows, base_name))
        mem_ratio = base["extra_bytes"] / max(res["extra_bytes"], 4096)  # RSS moves in 4 KiB pages
        time_ratio = base["time_s"] / res["time_s"]
        print(f"| {kind} | {vocab} | {rows} | {provider} | {res['time_s'] * 1e3:.1f} | "
              f"{res['extra_bytes'] / 2**20:.1f} | {mem_ratio:.1f}x less | {time_ratio:.2f}x |")


if __name__ == "__main__":
    main()
