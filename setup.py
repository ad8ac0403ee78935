"""Build the native kernels of streammem-kernels.

* Every ``csrc/cpu/<op>.cpp`` becomes its own pybind11 + OpenMP module
  ``streammem_kernels._cpu_<op>`` (one module per op, so ops build and load
  independently and a broken op never hides the others).
* Every ``csrc/cuda/<op>.cu`` becomes ``streammem_kernels._cuda_<op>`` through
  ``torch.utils.cpp_extension`` -- only when nvcc *and* a CUDA-enabled torch are
  present.  Otherwise a one-line notice is printed and the CPU paths keep
  working.  (CI compiles every ``.cu`` file with ``nvcc -c`` in a test, so CUDA
  code cannot rot on machines without a GPU.)

torch is deliberately *not* a build requirement (an isolated build would pull a
multi-GB CUDA wheel); the CPU modules only need pybind11 and numpy buffers.
``STREAMMEM_SKIP_EXT=1`` builds no module (used by the Makefile's editable
install, after which ``make build`` compiles in place).  Set ``STREAMMEM_MARCH_NATIVE=1`` to compile the CPU modules with
``-march=native``.
"""
import glob
import os
import shutil
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


def cpu_extensions():
    # -Wno-psabi: GCC notes on every build that the ABI of 32-byte vector arguments changed in
    # GCC 4.6; such vectors are passed only to functions with internal linkage (anonymous
    # namespaces), never across a library boundary, so the change cannot matter here.
    cflags = ["-O3", "-fopenmp", "-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math", "-Wno-psabi"]
    if os.environ.get("STREAMMEM_MARCH_NATIVE") == "1":
        cflags.append("-march=native")
    exts = []
    for src in sorted(glob.glob(os.path.join("csrc", "cpu", "*.cpp"))):
        op = os.path.splitext(os.path.basename(src))[0]
        exts.append(
            Pybind11Extension(
                f"streammem_kernels._cpu_{op}",
                [src],
                include_dirs=[os.path.join("csrc", "cpu")],
                depends=glob.glob(os.path.join("csrc", "cpu", "*.h")),
                extra_compile_args=list(cflags),  # Pybind11Extension appends to it
                extra_link_args=["-fopenmp"],
                cxx_std=17,
            )
        )
    return exts


def cuda_extensions():
    sources = sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
    if not sources:
        return [], None
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        print("streammem-kernels: nvcc not found, CUDA kernels not built (CPU/Triton paths unaffected)")
        return [], None
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CUDAExtension
    except ImportError:
        print("streammem-kernels: torch not importable at build time, CUDA kernels not built")
        return [], None
    if torch.version.cuda is None:
        print("streammem-kernels: torch is a CPU build, CUDA kernels not built")
        return [], None
    exts = []
    for src in sources:
        op = os.path.splitext(os.path.basename(src))[0]
        exts.append(
            CUDAExtension(
                f"streammem_kernels._cuda_{op}",
                [src],
                extra_compile_args={"cxx": ["-O3", "-Wno-psabi"],
                                    "nvcc": ["-O3", "--use_fast_math", "-lineinfo", "-Xcompiler", "-Wno-psabi"]},
            )
        )
    return exts, BuildExtension


if os.environ.get("STREAMMEM_SKIP_EXT") == "1":
    # The Makefile's editable install registers the packages only; `make build`
    # then compiles the modules in place, once and incrementally.
    cpu_exts, (cuda_exts, cuda_build_ext) = [], ([], None)
else:
    cpu_exts, (cuda_exts, cuda_build_ext) = cpu_extensions(), cuda_extensions()
cmdclass = {"build_ext": cuda_build_ext.with_options(no_python_abi_suffix=False) if cuda_build_ext else build_ext}

setup(
    ext_modules=cpu_exts + cuda_exts,
    cmdclass=cmdclass,
)
