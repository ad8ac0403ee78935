"""`make demo` installs the package with its [pipeline] extra and builds the C++ modules only; the
development stack (requirements-dev.txt: Triton, Ray, Hypothesis, pytest, ...) and the CUDA builds belong
to `make test`.  Checked with `make -n` (what make would run) on a copy of the Makefile in an empty folder,
so that no stamp of an existing .venv hides a step."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(tmp_path, target: str) -> list[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for prerequisite in ("pyproject.toml", "setup.py", "requirements-dev.txt"):
        (tmp_path / prerequisite).touch()
    # A fresh checkout: make creates .venv.  Under `make test` the outer make's MAKELEVEL / MAKEFLAGS would
    # make this one print "Entering/Leaving directory" lines: drop them.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    proc = subprocess.run([make, "--no-print-directory", "-n", target], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_make_demo_installs_the_pipeline_extra_and_builds_no_cuda(tmp_path):
    lines = _dry_run(tmp_path, "demo")
    installs = [line for line in lines if " pip " in line and " install " in line and "torch==" not in line]
    assert installs and not [line for line in installs if "requirements-dev.txt" in line]
    assert any('-e ".[pipeline]"' in line and "-c .venv/constraints.txt" in line for line in installs)
    build = [line for line in lines if "build_ext" in line]
    assert build and all(line.startswith("STREAMMEM_SKIP_CUDA=1 ") for line in build)
    assert lines[-1].endswith("streammem run")


def test_make_test_installs_the_development_stack(tmp_path):
    lines = _dry_run(tmp_path, "test")
    assert any("-r requirements-dev.txt" in line and "-c .venv/constraints.txt" in line for line in lines)
    assert not any('.[pipeline]' in line for line in lines)
    assert any("build_ext" in line and "STREAMMEM_SKIP_CUDA" not in line for line in lines)
