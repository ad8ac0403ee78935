# Two commands matter: `make demo` and `make test` (see README.md).
# Both create .venv on first use, or use the virtual environment that is active
# ($VIRTUAL_ENV) instead.  torch is installed first (2.13.0, a CPU build on
# machines without CUDA) only when none is importable; every later pip call is
# pinned to the torch that is present through <venv>/constraints.txt, so no step
# can pull a different (multi-GB) torch.  The same file pins Triton: to the one
# torch requires (CUDA wheels of torch pin theirs), else to the one installed,
# else to TRITON_DEFAULT, so no step replaces the Triton a torch needs.
#
# Each installs what it needs, no more: `make demo` the package with its
# [pipeline] extra and the C++ modules (no Triton, Ray, test tools or CUDA
# builds); `make test` (and build, bench) the development stack of
# requirements-dev.txt and every native module, CUDA ones included where nvcc is.
PYTHON ?= python3
VENV := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
TORCH_DEFAULT := 2.13.0
TRITON_DEFAULT := 3.9.0
CONSTRAINTS := $(VENV)/constraints.txt
STAMP := $(VENV)/.streammem-installed
DEMO_STAMP := $(VENV)/.streammem-installed-demo
# What building the native modules in place needs (pyproject.toml's build requirements).
BUILD_REQUIRES := "setuptools>=77" "pybind11>=2.12" wheel

# The constraints every install of the set-up runs with (argument: TRITON_DEFAULT).
define PINS_PY
import importlib.metadata as md, re, sys, torch
print("torch==" + torch.__version__.split("+")[0])
needed = [r for r in md.requires("torch") or [] if re.match(r"triton\b", r) and "extra ==" not in r]
try:
    installed = md.version("triton")
except md.PackageNotFoundError:
    installed = None
print(needed[0] if needed else "triton==" + (installed or sys.argv[1]))
endef
export PINS_PY

.PHONY: demo test build bench bench-quick record quality gpu-carry clean

$(VENV)/bin/python:
	$(PYTHON) -m venv --system-site-packages $(VENV)

$(CONSTRAINTS): $(VENV)/bin/python
	@if ! $(PY) -c "import torch" >/dev/null 2>&1; then \
		echo "streammem: no torch found, installing torch==$(TORCH_DEFAULT)"; \
		$(PIP) install -q "torch==$(TORCH_DEFAULT)"; \
	fi
	@$(PY) -c "$$PINS_PY" $(TRITON_DEFAULT) > $(CONSTRAINTS)
	@echo "streammem: pinned $$(tr '\n' ' ' < $(CONSTRAINTS))for every later install"

# The development stack: every extra, the test and benchmark tools (requirements-dev.txt).
$(STAMP): $(CONSTRAINTS) pyproject.toml setup.py requirements-dev.txt
	$(PIP) install -q -c $(CONSTRAINTS) -r requirements-dev.txt
	STREAMMEM_SKIP_EXT=1 $(PIP) install -q -c $(CONSTRAINTS) --no-build-isolation --no-deps -e .
	@touch $(STAMP)

# The demo's install: the package and its [pipeline] extra only.
$(DEMO_STAMP): $(CONSTRAINTS) pyproject.toml setup.py
	$(PIP) install -q -c $(CONSTRAINTS) $(BUILD_REQUIRES)
	STREAMMEM_SKIP_EXT=1 $(PIP) install -q -c $(CONSTRAINTS) --no-build-isolation -e ".[pipeline]"
	@touch $(DEMO_STAMP)

# Incremental rebuild of the native modules after C++/CUDA edits.
build: $(STAMP)
	$(PY) setup.py -q build_ext --inplace -j 2

# The C++ modules only (incremental): the demo runs on the CPU.
demo: $(DEMO_STAMP)
	STREAMMEM_SKIP_CUDA=1 $(PY) setup.py -q build_ext --inplace -j 2
	$(VENV)/bin/streammem run

# CPU fallback test mode: Triton kernels run through its interpreter, the C++
# extension must be importable (a broken build fails the suite, not skips it).
test: build
	TRITON_INTERPRET=1 STREAMMEM_REQUIRE_CPP=1 $(PY) -m pytest -q -p no:cacheprovider tests

# Full run that becomes the record: bench/baseline/<machine>-full.json, then bench/RESULTS.md and
# bench/plots/ regenerated from it (commit all three).
bench: build
	$(PY) -m bench.run --save-baseline $(BENCH_ARGS)

# The record regenerated from the committed JSON alone (no benchmark runs).
record: $(STAMP)
	$(PY) -m bench.report

# Answer-quality figures (counts and rates against ground truth, bench/quality.py): runs the suites,
# saves bench/baseline/quality-<suite>.json and regenerates bench/RESULTS.md (commit both).
QUALITY_ARGS ?= abstention prostream memverse scene_cuts
quality: build
	$(PY) -m bench.quality run $(QUALITY_ARGS)

# Smoke run: writes bench/results/quick/ (git-ignored) and never touches the record.
bench-quick: build
	$(PY) -m bench.run --quick $(BENCH_ARGS)

# The wheels bench/gpu.sh installs on the GPU machine (no network there): see docs/testing.md.
gpu-carry:
	bash bench/gpu_carry.sh

# .venv only: an active virtual environment that make reused is the user's, not ours to delete.
clean:
	rm -rf build .venv *.egg-info streammem_kernels/*.so
