"""GPU readiness without a GPU: every Triton kernel, compiled ahead of time for sm_80 and sm_90.

The scenarios of tests/gpu_readiness/triton_scenarios.py call the public ops with
``backend="triton"`` under the interpreter while their launches are recorded;
each distinct launch is then compiled for both targets in a process without
``TRITON_INTERPRET``, through Triton's own argument binder (so the signature
and specialisation are those of a real launch), and the ptxas figures are
checked (streammem_kernels/_aot.py):

* every kernel compiles, and every ``*_kernel`` of the package is launched by
  some scenario;
* no spills anywhere; hot kernels (``KERNEL_CONTRACTS[...]["hot"]``) use at
  most 128 registers;
* shared memory within 96 KB (consumer cards, sm_86/sm_89, run too);
* kernels promising decisions identical to the reference are launched with
  ``enable_fp_fusion=False`` and have no approximate sqrt/division in their PTX.

The full report (registers, spills, stack, shared memory per specialisation)
is written to ``$STREAMMEM_AOT_REPORT`` when set.
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from streammem_kernels.runtime import aot as _aot  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ARCHS = (80, 90)


def _env_without_interpreter():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = os.pathsep.join([HERE, ROOT, env.get("PYTHONPATH", "")])  # aot_canaries, tests.support
    return env


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = os.environ.get("STREAMMEM_AOT_REPORT") or str(tmp_path_factory.mktemp("aot") / "report.json")
    cmd = [sys.executable, "-m", "streammem_kernels.runtime.aot", "check", os.path.join(HERE, "triton_scenarios.py"),
           "--arch", *map(str, ARCHS), "--jobs", str(min(4, os.cpu_count() or 1)), "--out", out]
    proc = subprocess.run(cmd, env=_env_without_interpreter(), capture_output=True, text=True, timeout=900)
    if not os.path.exists(out):
        pytest.fail(f"compile check did not produce a report:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    with open(out) as f:
        data = json.load(f)
    data["table"] = proc.stdout
    return data


def _problems(report, *needles):
    return [p for p in report["problems"] if any(n in p for n in needles)]


def test_every_kernel_compiles_for_sm80_and_sm90(report):
    errors = _problems(report, "compile error")
    assert not errors, "\n".join(errors)
    assert {r["arch"] for r in report["results"]} == set(ARCHS)


def test_every_kernel_is_launched_by_a_scenario(report):
    missing = _problems(report, "no scenario launches", "not in the kernel inventory")
    assert not missing, "\n".join(missing)
    assert len(report["inventory"]) >= 12  # motion 2, k-means 2, tree 2, boundaries 4, log-probs 2


def test_no_spills_and_hot_kernels_within_128_registers(report):
    bad = _problems(report, "spills", "registers (>")
    assert not bad, "\n".join(bad) + "\n\n" + report["table"]


def test_shared_memory_fits_consumer_cards(report):
    bad = _problems(report, "shared memory")
    assert not bad, "\n".join(bad)


def test_exact_kernels_compile_without_fusion_or_approximations(report):
    bad = _problems(report, "promises exact")
    assert not bad, "\n".join(bad)
    exact = [k for k, c in report["inventory"].items() if c["exact"]]
    assert exact, "some kernels promise exact decisions (boundaries, motion)"


def test_size_one_cases_are_compiled(report):
    # One query / one pair / k = 1 / T = 1 specialise integer arguments to constants.
    scenarios = {s for r in report["results"] for s in r["scenarios"]}
    for name in ("tree:greedy_one_query", "tree:topk_one_query", "boundaries:streaming_one_push",
                 "kmeans:single_problem_k1", "logprobs:linear_one_token_bias_odd"):
        assert name in scenarios


# --------------------------------------------------------------------------
# The harness itself: it must catch what the interpreter lets through
# --------------------------------------------------------------------------
def _compile_canary(kernel, args, kwargs):
    code = (
        "import json, sys; from streammem_kernels.runtime import aot as _aot;"
        f"print(json.dumps(_aot._compile_one({{'kernel': 'aot_canaries.{kernel}', 'arch': 80, 'scenarios': ['canary'],"
        f" 'args': {args!r}, 'kwargs': {kwargs!r}}})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=_env_without_interpreter(), capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_harness_catches_a_non_constexpr_global():
    r = _compile_canary("_global_float_kernel", [{"tensor": "float32", "aligned": True}], {})
    assert r["error"] and "_PLAIN_GLOBAL" in r["error"]


def test_harness_catches_approximate_math_in_an_exact_kernel():
    ptr = {"tensor": "float32", "aligned": True}
    fused = _compile_canary("_approx_sqrt_kernel", [ptr, ptr, {"int": 100}], {"BLOCK": {"int": 128}})
    exact = _compile_canary("_approx_sqrt_kernel", [ptr, ptr, {"int": 100}],
                            {"BLOCK": {"int": 128}, "enable_fp_fusion": False})
    assert fused["error"] is None and fused["registers"] > 0 and fused["spill_stores"] == 0
    inventory = {"aot_canaries._approx_sqrt_kernel": {"hot": False, "exact": True}}
    launch = {"kernel": "aot_canaries._approx_sqrt_kernel", "scenario": "canary", "kwargs": {}}
    problems = _aot.check_report([fused], [launch], inventory)
    assert any("enable_fp_fusion=False" in p for p in problems)
    assert any("sqrt.approx" in p or "div.full" in p or "div.approx" in p or "rcp.approx" in p for p in problems)
    # tl.sqrt is approximate even without fusion: an exact kernel must use tl.sqrt_rn / tl.div_rn.
    assert exact["inexact_ptx"], exact


def test_spill_allowance_is_per_triton_release_and_bounded():
    """A kernel's contract may allow the bytes an older Triton spills ("spills": {"3.6": n}); the same
    spill is a problem under any other release, and more than n bytes is one under 3.6 too."""
    inventory = {"k": {"hot": True, "exact": False, "spills": {"3.6": 8}}}
    launch = {"kernel": "k", "scenario": "s", "kwargs": {}}

    def result(stores, loads):
        return {"kernel": "k", "arch": 80, "scenarios": ["s"], "error": None, "spill_stores": stores,
                "spill_loads": loads, "registers": 64, "shared": 0, "inexact_ptx": [], "fma_ptx": False}

    assert _aot.check_report([result(4, 4)], [launch], inventory, triton_version="3.6.0") == []
    assert any("spills" in p for p in _aot.check_report([result(4, 4)], [launch], inventory, triton_version="3.9.0"))
    assert any("spills" in p for p in _aot.check_report([result(8, 4)], [launch], inventory, triton_version="3.6.0"))
