"""How the CUDA modules are compiled (shared by setup.py and tests/gpu_readiness/test_cuda_compile.py).

Standard library only: setup.py loads this file by path, before the package
(and torch) can be imported.  One nvcc invocation per ``csrc/cuda/<op>.cu``
gives a shared library with a C ABI (no torch headers, so no CUDA torch is
needed at build time), with SASS for the common data-centre and consumer
architectures and PTX of the newest one for later GPUs.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

# T4, A100, RTX 30xx/A10, RTX 40xx/L4/L40, H100/H200; PTX of the last one JIT-compiles on newer GPUs.
DEFAULT_ARCHS = (75, 80, 86, 89, 90)
_FLAG_LINE = re.compile(r"^\s*//\s*streammem-nvcc:\s*(.+?)\s*$", re.MULTILINE)


def find_nvcc() -> str | None:
    """nvcc from PATH, or $CUDA_HOME/bin/nvcc."""
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    return None


def module_flags(source: str) -> list[str]:
    """Extra nvcc flags a module declares (``// streammem-nvcc: --fmad=false``)."""
    with open(source) as f:
        text = f.read()
    return [flag for line in _FLAG_LINE.findall(text) for flag in line.split()]


def supported_archs(nvcc: str) -> set[int]:
    out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True).stdout
    return {int(m) for m in re.findall(r"compute_(\d+)", out)}


def requested_archs(nvcc: str) -> list[int]:
    """``STREAMMEM_CUDA_ARCHS`` ("80;90") or the defaults, restricted to what this nvcc supports."""
    env = os.environ.get("STREAMMEM_CUDA_ARCHS", "").replace(",", ";")
    wanted = [int(a) for a in env.split(";") if a.strip()] if env.strip() else list(DEFAULT_ARCHS)
    supported = supported_archs(nvcc)
    return [a for a in wanted if not supported or a in supported]


def nvcc_command(nvcc: str, source: str, output: str, archs, *, verbose_ptxas: bool = False) -> list[str]:
    """The nvcc command building ``source`` into the shared library ``output``."""
    include = os.path.dirname(os.path.abspath(source))
    cmd = [nvcc, "-std=c++17", "-O3", "-lineinfo", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wno-psabi",
           "--threads", "0", "-I", include, *module_flags(source)]
    for arch in archs:
        cmd += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    if archs:
        top = max(archs)
        cmd += ["-gencode", f"arch=compute_{top},code=compute_{top}"]
    if verbose_ptxas:
        cmd += ["-Xptxas", "-v"]
    return cmd + [source, "-o", output]
