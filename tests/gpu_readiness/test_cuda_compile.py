"""The CUDA modules build, link and load on machines without a GPU.

Every ``csrc/cuda/<op>.cu`` is built exactly as setup.py builds it (one nvcc
call, C ABI, no torch headers: streammem_kernels/_cuda_build.py) for sm_80 and
sm_90 with ``-Xptxas -v``, and:

* no kernel spills, and none uses more than 255 registers;
* the library exports exactly the functions of ``streammem_kernels.runtime.cuda.prototypes(op)``
  declares for the op (plus the two common ones), so Python and C agree;
* the library loads with ctypes here (the CUDA runtime is linked statically and
  finds no driver: a clean error code, not a crash);
* modules that promise decisions identical to the reference (``--fmad=false``
  declared in the source) contain no approximate sqrt/division in their PTX.
"""
import glob
import os
import re
import subprocess

import pytest

from streammem_kernels.runtime import cuda as _cuda
from streammem_kernels.runtime import cuda_build as _cuda_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
NVCC = _cuda_build.find_nvcc()
ARCHS = (80, 90)

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")


def _op(source):
    return os.path.splitext(os.path.basename(source))[0]


def _ptxas_figures(log: str) -> list[dict]:
    """Per (kernel, arch): registers and spill bytes, from nvcc -Xptxas -v output."""
    figures, current = [], None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for '(sm_\d+a?)'", line)
        if m:
            current = {"kernel": m.group(1), "arch": m.group(2), "spill": 0, "registers": 0}
            figures.append(current)
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            current["spill"] = int(m.group(1)) + int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current["registers"] = int(m.group(1))
    return figures


@pytest.fixture(scope="module", params=SOURCES, ids=[_op(s) for s in SOURCES])
def built(request, tmp_path_factory):
    source = request.param
    out = str(tmp_path_factory.mktemp("cuda") / f"_cuda_{_op(source)}.so")
    cmd = _cuda_build.nvcc_command(NVCC, source, out, ARCHS, verbose_ptxas=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return source, out, proc.stdout + proc.stderr


def test_no_spills(built):
    source, _, log = built
    figures = _ptxas_figures(log)
    assert figures, "ptxas reported no kernel"
    assert {f["arch"].rstrip("a") for f in figures} == {f"sm_{a}" for a in ARCHS}
    bad = [f for f in figures if f["spill"] or f["registers"] > 255]
    assert not bad, bad


def test_exports_match_the_python_prototypes(built):
    source, out, _ = built
    symbols = subprocess.run(["nm", "-D", "--defined-only", out], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in symbols.splitlines() if " T " in line}
    expected = set(_cuda.prototypes(_op(source)))
    assert exported == expected


def test_loads_without_a_gpu(built):
    source, out, _ = built
    mod = _cuda.CudaModule(_op(source), out)
    assert mod.streammem_cuda_error_string(0) == b"no error"
    count = __import__("ctypes").c_int(-1)
    code = mod.streammem_cuda_device_count(count)
    assert code == 0 or mod.streammem_cuda_error_string(code)  # no driver here: an error code, not a crash


@pytest.mark.parametrize("source", [s for s in SOURCES if "--fmad=false" in _cuda_build.module_flags(s)],
                         ids=lambda s: _op(s))
def test_exact_modules_have_no_approximate_math(source, tmp_path):
    ptx = tmp_path / "out.ptx"
    cmd = [NVCC, "-std=c++17", "-O3", "-ptx", "-arch=sm_90", "-I", os.path.dirname(source),
           *_cuda_build.module_flags(source), source, "-o", str(ptx)]
    subprocess.run(cmd, check=True, capture_output=True)
    text = ptx.read_text()
    inexact = re.findall(r"\b(?:(?:sqrt|div|rcp|rsqrt)\.approx|div\.full|fma\.rn)(?:\.ftz)?\.f32", text)
    assert not inexact, sorted(set(inexact))


def test_built_modules_are_current():
    # Modules built in place by `make build` must all be there and carry every declared function (no stale build).
    paths = {_op(source): _cuda.library_path(_op(source)) for source in SOURCES}
    if not any(paths.values()):
        pytest.skip("CUDA modules not built in place (STREAMMEM_SKIP_CUDA=1, or no nvcc at build time)")
    missing = sorted(op for op, path in paths.items() if path is None)
    assert not missing, f"stale build: no module for {missing}; run `make build`"
    for op, path in paths.items():
        _cuda.CudaModule(op, path)
