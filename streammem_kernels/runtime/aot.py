"""Ahead-of-time compile check of every Triton kernel for real GPU targets, without a GPU.

The Triton interpreter (``TRITON_INTERPRET=1``, how the test suite runs on CPU)
accepts code that a real compile rejects (non-constexpr globals, for one) and
says nothing about registers, spills or shared memory.  This module closes that
gap in two phases:

1. **record** (in an interpreted process): scenarios call the public ops with
   ``backend="triton"`` on CPU tensors, and every kernel launch is recorded
   with its arguments abstracted to what Triton's specialisation looks at:
   tensors as (dtype, 16-byte alignment), integers and floats by value,
   constexprs and launch options (``num_warps``, ``enable_fp_fusion``...).
   The ops pick their GPU launch configuration while recording
   (:func:`streammem_kernels.runtime.launch.recording_gpu_launches`).
2. **compile** (in a process *without* ``TRITON_INTERPRET``, where
   ``@triton.jit`` gives real ``JITFunction`` objects): each launch goes
   through Triton's own binder (``create_function_from_signature`` and
   ``JITFunction._pack_args``, the code ``JITFunction.run`` executes before it
   compiles), so the signature, the integer/alignment specialisation and the
   options are exactly those a real launch computes; then
   ``triton.compile(..., target=GPUTarget("cuda", arch, 32))`` for each target
   and the ptxas log gives registers, spills and stack; shared memory comes
   from the kernel metadata.

Each Triton module declares ``KERNEL_CONTRACTS``: per kernel, whether it is a
hot kernel (at most 128 registers, no spills) and whether it promises
bit-identical decisions with the reference (launched with
``enable_fp_fusion=False``; no approximate sqrt/division/reciprocal in its
PTX).  :func:`check_report` turns a report into a list of violations.

Command line (``python -m streammem_kernels.runtime.aot --help``)::

    # both phases: record the scenarios (interpreted subprocess), compile, check
    python -m streammem_kernels.runtime.aot check tests/gpu_readiness/triton_scenarios.py --arch 80 90 --out report.json
    python -m streammem_kernels.runtime.aot record tests/gpu_readiness/triton_scenarios.py --out launches.json   # phase 1 only
    python -m streammem_kernels.runtime.aot compile launches.json --arch 80 90 --out report.json   # phase 2 only
    python -m streammem_kernels.runtime.aot table report.json

A scenarios file defines ``SCENARIOS = {"op": make}`` where ``make()``
returns a list of no-argument callables that call public ops with
``backend="triton"``.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import json
import os
import pkgutil
import re
import sys
import time
from dataclasses import dataclass, field

# Shared memory a block may use on every target we support, consumer cards
# (sm_86/sm_89: 99 KB dynamic per block) included.
MAX_SHARED_BYTES = 96 * 1024
HOT_MAX_REGISTERS = 128
# PTX instructions whose rounding differs from IEEE float32 (what the torch
# reference computes): approximate square root, division and reciprocal.
_INEXACT_PTX = re.compile(r"\b(sqrt\.approx|div\.approx|div\.full|rcp\.approx|rsqrt\.approx|ex2\.approx)(?:\.ftz)?\.f32")
_FMA_PTX = re.compile(r"\bfma\.rn(?:\.ftz)?\.f32")

def triton_modules() -> list[str]:
    """Names of the package's Triton kernel modules (``streammem_kernels.<op>._triton``), found by listing
    the package folder."""
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = []
    for info in pkgutil.iter_modules([package_dir]):
        if info.ispkg and os.path.exists(os.path.join(package_dir, info.name, "_triton.py")):
            names.append(f"streammem_kernels.{info.name}._triton")
    return sorted(names)


def _jit_functions(module) -> dict[str, object]:
    """JIT-decorated functions of a module (real or interpreted), by name."""
    from triton.runtime.jit import JITFunction

    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - very old Triton
        InterpretedFunction = ()
    out = {}
    for name, obj in vars(module).items():
        if isinstance(obj, (JITFunction, InterpretedFunction)) and getattr(obj, "fn", None) is not None:
            if obj.fn.__module__ == module.__name__:
                out[name] = obj
    return out


def kernel_inventory(only: list[str] | None = None) -> dict[str, dict]:
    """Every ``*_kernel`` JIT function of the package (of ops ``only``), with its contract.

    Returns ``{"module.name": {"hot": bool, "exact": bool}}``.  JIT functions
    not named ``*_kernel`` are device helpers called from kernels, never launched.
    """
    out = {}
    for mod_name in triton_modules():
        if only and not any(mod_name == f"streammem_kernels.{op}._triton" for op in only):
            continue
        module = importlib.import_module(mod_name)
        contracts = getattr(module, "KERNEL_CONTRACTS", {})
        for name in _jit_functions(module):
            if name.endswith("_kernel"):
                c = contracts.get(name, {})
                out[f"{mod_name}.{name}"] = {"hot": bool(c.get("hot", False)), "exact": bool(c.get("exact", False)),
                                             "spills": dict(c.get("spills", {}))}
        unknown = set(contracts) - set(_jit_functions(module))
        if unknown:
            raise ValueError(f"{mod_name}.KERNEL_CONTRACTS names no kernel: {sorted(unknown)}")
    return out


# --------------------------------------------------------------------------
# Phase 1: record launches (interpreted process)
# --------------------------------------------------------------------------
def _encode(value):
    import torch

    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).replace("torch.", ""), "aligned": value.data_ptr() % 16 == 0}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, float):
        return {"float": value}
    if hasattr(value, "value") and type(value).__name__ == "constexpr":
        return _encode(value.value)
    raise TypeError(f"cannot record a kernel argument of type {type(value).__name__}")


@dataclass
class Recorder:
    """Collects launches; ``scenario`` labels the launches that follow."""

    launches: list = field(default_factory=list)
    scenario: str = ""

    def add(self, fn, args, kwargs):
        params = list(inspect.signature(fn).parameters)
        self.launches.append({
            "kernel": f"{fn.__module__}.{fn.__name__}",
            "scenario": self.scenario,
            "args": [_encode(a) for a in args],
            "kwargs": {k: _encode(v) for k, v in kwargs.items()},
            "params": params,
        })


@contextlib.contextmanager
def recording():
    """Record every interpreted Triton launch made inside the block.

    The launches still execute (later launches of an op depend on earlier
    results), with the GPU launch configuration forced on.
    """
    from triton.runtime.interpreter import InterpretedFunction

    from .launch import recording_gpu_launches

    rec = Recorder()
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        rec.add(self.fn, args, kwargs)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        with recording_gpu_launches():
            yield rec
    finally:
        InterpretedFunction.run = original


# --------------------------------------------------------------------------
# Phase 2: compile (process without TRITON_INTERPRET)
# --------------------------------------------------------------------------
class _MockPointer:
    """What Triton's specialisation reads from a tensor argument: dtype and address."""

    def __init__(self, dtype, aligned: bool):
        self.dtype = dtype
        self._ptr = 0 if aligned else 4

    def data_ptr(self):
        return self._ptr


def _decode(value):
    import torch

    if isinstance(value, dict):
        if "tensor" in value:
            return _MockPointer(getattr(torch, value["tensor"]), value["aligned"])
        if "int" in value:
            return value["int"]
        if "float" in value:
            return value["float"]
    return value


_LOG_PATTERNS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
}


def _parse_ptxas_log(log: str) -> dict:
    out = {}
    for key, pattern in _LOG_PATTERNS.items():
        m = pattern.search(log)
        out[key] = int(m.group(1)) if m else None
    return out


def _binder_for(jit_fn, backend):
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature(jit_fn.signature, jit_fn.params, backend)


def _compile_one(task: dict) -> dict:
    """Compile one launch for one target; never raises (errors go in the result)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    knobs.nvidia.dump_ptxas_log = True
    knobs.compilation.always_compile = True
    mod_name, _, fn_name = task["kernel"].rpartition(".")
    result = {"kernel": task["kernel"], "arch": task["arch"], "scenarios": task["scenarios"]}
    try:
        jit_fn = getattr(importlib.import_module(mod_name), fn_name)
        target = GPUTarget("cuda", task["arch"], 32)
        backend = make_backend(target)
        args = [_decode(a) for a in task["args"]]
        kwargs = {k: _decode(v) for k, v in task["kwargs"].items()}
        # The options JITFunction.run adds before binding, where this Triton knows them (3.6 has no fpsan).
        known = _option_fields(backend)
        for key, default in (("debug", False), ("instrumentation_mode", ""), ("fpsan_homomorphic_casts", False)):
            if key in known:
                kwargs.setdefault(key, default)
        bound, specialization, options = _binder_for(jit_fn, backend)(*args, **kwargs)
        options, signature, constexprs, attrs = jit_fn._pack_args(backend, kwargs, bound, specialization, options)
        result["signature"] = {k: v for k, v in signature.items() if v != "constexpr"}
        result["constexprs"] = {str(jit_fn.params[p[0]].name): _plain(v) for p, v in constexprs.items()}
        result["specialised"] = sorted(str(jit_fn.params[p[0]].name) for p, a in attrs.items() if a)
        result["options"] = {k: getattr(options, k) for k in ("num_warps", "num_stages", "enable_fp_fusion")}
        log = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(log):
            kernel = triton.compile(ASTSource(jit_fn, signature, constexprs, attrs), target=target,
                                    options=options.__dict__)
        result["seconds"] = round(time.perf_counter() - start, 3)
        result.update(_parse_ptxas_log(log.getvalue()))
        result["shared"] = int(kernel.metadata.shared)
        ptx = kernel.asm["ptx"]
        result["inexact_ptx"] = sorted(set(m.group(1) for m in _INEXACT_PTX.finditer(ptx)))
        result["fma_ptx"] = bool(_FMA_PTX.search(ptx))
        result["error"] = None
    except Exception as exc:  # reported, the check fails on it
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    return result


def _option_fields(backend) -> set:
    import dataclasses

    options = backend.parse_options({})
    return {f.name for f in dataclasses.fields(options)}


def _plain(v):
    return v.value if hasattr(v, "value") else v


def _dedupe(launches: list[dict], archs) -> list[dict]:
    """One task per (kernel, arch, arguments as specialisation sees them)."""
    tasks: dict[str, dict] = {}
    for launch in launches:
        fixed = _unspecialised(launch["kernel"])  # do_not_specialize: every value shares one binary
        key_args = [{"int": "any"} if name in fixed and isinstance(a, dict) and "int" in a and abs(a["int"]) < 2**31
                    else _spec_key(a) for a, name in zip(launch["args"], launch["params"])]
        key_kwargs = {k: _spec_key(v) for k, v in launch["kwargs"].items()}
        for arch in archs:
            key = json.dumps([launch["kernel"], arch, key_args, key_kwargs], sort_keys=True)
            task = tasks.setdefault(key, {"kernel": launch["kernel"], "arch": arch, "args": launch["args"],
                                          "kwargs": launch["kwargs"], "scenarios": []})
            if launch["scenario"] not in task["scenarios"]:
                task["scenarios"].append(launch["scenario"])
    return list(tasks.values())


def _unspecialised(kernel: str) -> frozenset:
    """Parameters of ``kernel`` declared ``do_not_specialize`` (empty if it cannot be imported here)."""
    mod_name, _, fn_name = kernel.rpartition(".")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except Exception:  # reported by the compile step
        return frozenset()
    return frozenset(p.name for p in getattr(fn, "params", ()) if getattr(p, "do_not_specialize", False))


def _spec_key(value):
    """Integers specialise on == 1 and divisibility by 16 only; floats not at all."""
    if isinstance(value, dict) and "int" in value:
        v = value["int"]
        return {"int": "one" if v == 1 else ("d16" if v % 16 == 0 else "any"), "wide": abs(v) >= 2**31}
    if isinstance(value, dict) and "float" in value:
        return {"float": True}
    return value


def compile_launches(launches: list[dict], archs=(80, 90), jobs: int = 1) -> list[dict]:
    """Compile every distinct launch for every target; results in task order."""
    tasks = _dedupe(launches, archs)
    if jobs <= 1 or len(tasks) <= 1:
        return [_compile_one(t) for t in tasks]
    import multiprocessing

    # fork: workers inherit the imported Triton (no second import per worker)
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        return pool.map(_compile_one, tasks, chunksize=1)


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------
def check_report(results: list[dict], launches: list[dict], inventory: dict[str, dict],
                 triton_version: str | None = None) -> list[str]:
    """Violations of the GPU-readiness contract (empty list: all good).

    A kernel may not spill, except within the bytes (stored + loaded) its contract allows for the
    Triton release compiling it (``"spills": {"3.6": 52}``): an older compiler's measured spills,
    declared until a GPU run measures what they cost.
    """
    release = ".".join((triton_version or _triton_version()).split(".")[:2])
    problems = []
    launched = {l["kernel"] for l in launches}
    for kernel in sorted(set(inventory) - launched):
        problems.append(f"{kernel}: no scenario launches it (add one to tests/gpu_readiness/triton_scenarios.py)")
    for kernel in sorted(launched - set(inventory)):
        problems.append(f"{kernel}: launched but not in the kernel inventory")
    for launch in launches:
        contract = inventory.get(launch["kernel"], {})
        if contract.get("exact") and launch["kwargs"].get("enable_fp_fusion") is not False:
            problems.append(f"{launch['kernel']} [{launch['scenario']}]: promises exact decisions but is launched "
                            "without enable_fp_fusion=False")
    for r in results:
        where = f"{r['kernel']} sm_{r['arch']} [{', '.join(r['scenarios'][:3])}]"
        if r["error"]:
            problems.append(f"{where}: compile error: {r['error'].splitlines()[0]}")
            continue
        contract = inventory.get(r["kernel"], {})
        spills = (r["spill_stores"] or 0) + (r["spill_loads"] or 0)
        if spills > contract.get("spills", {}).get(release, 0):
            problems.append(f"{where}: spills {r['spill_stores']} B stored / {r['spill_loads']} B loaded "
                            f"({r['registers']} registers)")
        if contract.get("hot") and (r["registers"] or 0) > HOT_MAX_REGISTERS:
            problems.append(f"{where}: hot kernel uses {r['registers']} registers (> {HOT_MAX_REGISTERS})")
        if r["shared"] > MAX_SHARED_BYTES:
            problems.append(f"{where}: {r['shared']} B of shared memory (> {MAX_SHARED_BYTES})")
        if contract.get("exact") and (r["inexact_ptx"] or r["fma_ptx"]):
            what = r["inexact_ptx"] + (["fma.rn.f32"] if r["fma_ptx"] else [])
            problems.append(f"{where}: promises exact decisions but its PTX has {', '.join(what)}")
    return problems


def summary_table(results: list[dict], inventory: dict[str, dict]) -> str:
    """Markdown table: per kernel and target, the worst specialisation's figures."""
    rows: dict[tuple, dict] = {}
    for r in results:
        key = (r["kernel"].rsplit(".", 1)[-1], r["arch"])
        agg = rows.setdefault(key, {"n": 0, "registers": 0, "spills": 0, "stack": 0, "shared": 0, "seconds": 0.0,
                                    "errors": 0, "hot": inventory.get(r["kernel"], {}).get("hot", False),
                                    "exact": inventory.get(r["kernel"], {}).get("exact", False)})
        agg["n"] += 1
        if r["error"]:
            agg["errors"] += 1
            continue
        agg["registers"] = max(agg["registers"], r["registers"] or 0)
        agg["spills"] = max(agg["spills"], (r["spill_stores"] or 0) + (r["spill_loads"] or 0))
        agg["stack"] = max(agg["stack"], r["stack"] or 0)
        agg["shared"] = max(agg["shared"], r["shared"])
        agg["seconds"] += r["seconds"]
    lines = ["| kernel | target | specialisations | max registers | max spill bytes | max stack | max shared (B) "
             "| hot | exact | compile errors |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (name, arch), a in sorted(rows.items()):
        lines.append(f"| `{name}` | sm_{arch} | {a['n']} | {a['registers']} | {a['spills']} | {a['stack']} "
                     f"| {a['shared']} | {'yes' if a['hot'] else ''} | {'yes' if a['exact'] else ''} | {a['errors']} |")
    return "\n".join(lines)


def record_scenarios(path: str, only: list[str] | None = None) -> list[dict]:
    """Phase 1: run every scenario of a scenarios file, recording its launches (needs TRITON_INTERPRET=1)."""
    import importlib.util

    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise RuntimeError("recording runs the scenarios through the Triton interpreter: set TRITON_INTERPRET=1")
    spec = importlib.util.spec_from_file_location("_streammem_triton_scenarios", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    launches = []
    for op, make in module.SCENARIOS.items():
        if only and op not in only:
            continue
        for scenario in make():
            with recording() as rec:
                rec.scenario = f"{op}:{scenario.__name__}"
                scenario()
            launches += rec.launches
    return launches


def _record_in_subprocess(path: str, out: str, only: list[str] | None) -> None:
    import subprocess

    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "streammem_kernels.runtime.aot", "record", path, "--out", out]
    if only:
        cmd += ["--only", *only]
    subprocess.run(cmd, env=env, check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streammem_kernels.runtime.aot", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile recorded launches for GPU targets and check them")
    c.add_argument("launches", help="JSON file written by the record phase (tests/gpu_readiness/test_triton_compile.py)")
    c.add_argument("--arch", type=int, nargs="+", default=[80, 90], help="compute capabilities (80 = A100, 90 = H100)")
    c.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    c.add_argument("--out", help="write the full report (JSON) here")
    c.set_defaults(record=False)
    k = sub.add_parser("check", help="record the scenarios (interpreted subprocess), then compile and check")
    k.add_argument("scenarios", help="scenarios file (tests/gpu_readiness/triton_scenarios.py)")
    k.add_argument("--arch", type=int, nargs="+", default=[80, 90])
    k.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    k.add_argument("--out", help="write the full report (JSON) here")
    k.add_argument("--only", nargs="+", help="ops to check (scenario keys, e.g. tree motion); default: all")
    k.set_defaults(record=True)
    r = sub.add_parser("record", help="phase 1 only: run the scenarios under the interpreter, write the launches")
    r.add_argument("scenarios")
    r.add_argument("--out", required=True)
    r.add_argument("--only", nargs="+")
    t = sub.add_parser("table", help="print the summary table of a report")
    t.add_argument("report")
    args = parser.parse_args(argv)
    if args.cmd == "record":
        with open(args.out, "w") as f:
            json.dump(record_scenarios(args.scenarios, args.only), f)
        return 0
    if args.cmd == "table":
        with open(args.report) as f:
            report = json.load(f)
        print(summary_table(report["results"], report["inventory"]))
        return 0
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("the compile phase needs real JIT functions: unset TRITON_INTERPRET")
    record_seconds = 0.0
    if args.record:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            _record_in_subprocess(args.scenarios, os.path.join(tmp, "launches.json"), args.only)
            record_seconds = round(time.perf_counter() - start, 1)
            with open(os.path.join(tmp, "launches.json")) as f:
                launches = json.load(f)
    else:
        with open(args.launches) as f:
            launches = json.load(f)
    start = time.perf_counter()
    inventory = kernel_inventory(getattr(args, "only", None))
    results = compile_launches(launches, tuple(args.arch), args.jobs)
    problems = check_report(results, launches, inventory)
    report = {"results": results, "inventory": inventory, "problems": problems, "launches": launches,
              "seconds": round(time.perf_counter() - start, 1), "record_seconds": record_seconds,
              "triton": _triton_version()}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(summary_table(results, inventory))
    print(f"\n{len(launches)} launches recorded in {record_seconds} s; {len(results)} compiles in "
          f"{report['seconds']} s (Triton {report['triton']})")
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


def _triton_version() -> str:
    import triton

    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
