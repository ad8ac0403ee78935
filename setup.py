"""Build the native kernels of streammem-kernels.

* Every ``csrc/cpu/<op>.cpp`` (or folder ``csrc/cpu/<op>/`` of ``.cpp`` files) becomes its own pybind11 + OpenMP module
  ``streammem_kernels._cpu_<op>`` (one module per op, so ops build and load
  independently and a broken op never hides the others).
* Every ``csrc/cuda/<op>.cu`` becomes the shared library
  ``streammem_kernels/_cuda_<op>.so`` with a C ABI, loaded with ctypes
  (streammem_kernels/runtime/cuda.py), built by nvcc alone whenever nvcc is found
  (PATH or CUDA_HOME): no CUDA torch is needed at build time, so the CUDA
  kernels build and link on machines without a GPU.  Without nvcc a one-line
  notice is printed and the CPU and Triton paths keep working.
  ``STREAMMEM_CUDA_ARCHS="80;90"`` picks the architectures (default: 75, 80,
  86, 89, 90 plus PTX of the newest); ``STREAMMEM_SKIP_CUDA=1`` skips them.

torch is deliberately *not* a build requirement (an isolated build would pull a
multi-GB CUDA wheel); the CPU modules only need pybind11 and numpy buffers.
``STREAMMEM_SKIP_EXT=1`` builds no module (used by the Makefile's editable
install, after which ``make build`` compiles in place).  Set ``STREAMMEM_MARCH_NATIVE=1`` to compile the CPU modules with
``-march=native``.
"""
import glob
import os
import subprocess
import sys

import setuptools
from setuptools import setup

# pyproject.toml's SPDX `license = "Apache-2.0"` (PEP 639) needs setuptools >= 77; an
# older one (reachable only through --no-build-isolation) fails with a cryptic
# `project.license` schema error, so say what to do instead.
MIN_SETUPTOOLS = (77, 0)
_have = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
if _have < MIN_SETUPTOOLS:
    sys.exit(f"streammem-kernels: building needs setuptools>=77 (found {setuptools.__version__}); "
             "run `pip install -U 'setuptools>=77'` first, or build without --no-build-isolation")

try:
    from pybind11.setup_helpers import Pybind11Extension, build_ext
except ImportError:  # pragma: no cover - pybind11 is a build requirement
    sys.exit("streammem-kernels: pybind11 is required to build (pip install pybind11)")

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_sources() -> dict[str, list[str]]:
    """op -> its C++ sources: ``csrc/cpu/<op>.cpp``, or every ``.cpp`` of a folder ``csrc/cpu/<op>/``."""
    ops = {os.path.splitext(os.path.basename(src))[0]: [src] for src in glob.glob(os.path.join("csrc", "cpu", "*.cpp"))}
    for folder in glob.glob(os.path.join("csrc", "cpu", "*", "")):
        sources = sorted(glob.glob(os.path.join(folder, "*.cpp")))
        if sources:
            ops[os.path.basename(os.path.dirname(folder))] = sources
    return ops


def cpu_extensions():
    # -Wno-psabi: GCC notes on every build that the ABI of 32-byte vector arguments changed in
    # GCC 4.6; such vectors are passed only to functions with internal linkage (anonymous
    # namespaces), never across a library boundary, so the change cannot matter here.
    cflags = ["-O3", "-fopenmp", "-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math", "-Wno-psabi"]
    if os.environ.get("STREAMMEM_MARCH_NATIVE") == "1":
        cflags.append("-march=native")
    exts = []
    for op, sources in sorted(cpu_sources().items()):
        exts.append(
            Pybind11Extension(
                f"streammem_kernels._cpu_{op}",
                sources,
                include_dirs=[os.path.join("csrc", "cpu")],
                depends=glob.glob(os.path.join("csrc", "cpu", "*.h")) + glob.glob(os.path.join("csrc", "cpu", "*", "*.h")),
                extra_compile_args=list(cflags),  # Pybind11Extension appends to it
                extra_link_args=["-fopenmp"],
                cxx_std=17,
            )
        )
    return exts


def _cuda_build_helpers():
    # Loaded by path: importing the package would import torch, which a build must not need.
    import importlib.util

    spec = importlib.util.spec_from_file_location("_cuda_build", os.path.join(HERE, "streammem_kernels", "runtime", "cuda_build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildExt(build_ext):
    """pybind11's build_ext, then the CUDA shared libraries (nvcc) next to the CPU modules."""

    def run(self):
        super().run()
        if not _SKIP_EXT:
            self.build_cuda_libraries()

    def build_cuda_libraries(self):
        sources = sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
        if not sources or os.environ.get("STREAMMEM_SKIP_CUDA") == "1":
            return
        helpers = _cuda_build_helpers()
        nvcc = helpers.find_nvcc()
        if nvcc is None:
            print("streammem-kernels: nvcc not found, CUDA kernels not built (CPU/Triton paths unaffected)")
            return
        archs = helpers.requested_archs(nvcc)
        out_dir = "streammem_kernels" if self.inplace else os.path.join(self.build_lib, "streammem_kernels")
        os.makedirs(out_dir, exist_ok=True)
        headers = glob.glob(os.path.join("csrc", "cuda", "*.cuh"))
        for src in sources:
            op = os.path.splitext(os.path.basename(src))[0]
            target = os.path.join(out_dir, f"_cuda_{op}.so")
            newest = max(os.path.getmtime(p) for p in [src, *headers])
            if not self.force and os.path.exists(target) and os.path.getmtime(target) >= newest:
                continue
            cmd = helpers.nvcc_command(nvcc, src, target, archs)
            print(f"streammem-kernels: nvcc {src} -> {target} (sm_{', sm_'.join(map(str, archs))})")
            subprocess.run(cmd, check=True)


# The Makefile's editable install registers the packages only; `make build`
# then compiles the modules in place, once and incrementally.
_SKIP_EXT = os.environ.get("STREAMMEM_SKIP_EXT") == "1"

setup(
    ext_modules=[] if _SKIP_EXT else cpu_extensions(),
    cmdclass={"build_ext": BuildExt},
)
