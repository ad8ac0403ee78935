# Two commands matter: `make demo` and `make test` (see README.md).
# Both create .venv on first use, or use the virtual environment that is active
# ($VIRTUAL_ENV) instead.  torch is installed first (2.13.0, a CPU build on
# machines without CUDA) only when none is importable; every later pip call is
# pinned to the torch that is present through <venv>/constraints.txt, so no step
# can pull a different (multi-GB) torch.  The same file pins Triton: to the one
# torch requires (CUDA wheels of torch pin theirs), else to the one installed,
# else to TRITON_DEFAULT, so no step replaces the Triton a torch needs.
PYTHON ?= python3
VENV := $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
TORCH_DEFAULT := 2.13.0
TRITON_DEFAULT := 3.9.0
STAMP := $(VENV)/.streammem-installed

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

.PHONY: demo test test-fast build bench bench-quick gpu-carry clean

$(VENV)/bin/python:
	$(PYTHON) -m venv --system-site-packages $(VENV)

$(STAMP): $(VENV)/bin/python pyproject.toml setup.py requirements-dev.txt
	@if ! $(PY) -c "import torch" >/dev/null 2>&1; then \
		echo "streammem: no torch found, installing torch==$(TORCH_DEFAULT)"; \
		$(PIP) install -q "torch==$(TORCH_DEFAULT)"; \
	fi
	@$(PY) -c "$$PINS_PY" $(TRITON_DEFAULT) > $(VENV)/constraints.txt
	@echo "streammem: pinned $$(tr '\n' ' ' < $(VENV)/constraints.txt)for every later install"
	$(PIP) install -q -c $(VENV)/constraints.txt -r requirements-dev.txt
	STREAMMEM_SKIP_EXT=1 $(PIP) install -q -c $(VENV)/constraints.txt --no-build-isolation --no-deps -e .
	@touch $(STAMP)

# Incremental rebuild of the native modules after C++/CUDA edits.
build: $(STAMP)
	$(PY) setup.py -q build_ext --inplace -j 2

demo: build
	$(VENV)/bin/streammem run

# CPU fallback test mode: Triton kernels run through its interpreter, the C++
# extension must be importable (a broken build fails the suite, not skips it).
test: build
	TRITON_INTERPRET=1 STREAMMEM_REQUIRE_CPP=1 $(PY) -m pytest -q -p no:cacheprovider tests

# Full run: rewrites the committed record (bench/RESULTS.md, bench/plots/).
bench: build
	$(PY) bench/run.py $(BENCH_ARGS)

# Smoke run: writes bench/results/quick/ (git-ignored) and never touches the record.
bench-quick: build
	$(PY) bench/run.py --quick $(BENCH_ARGS)

# The wheels bench/gpu.sh installs on the GPU machine (no network there): see README "GPU run".
gpu-carry:
	bash bench/gpu_carry.sh

# .venv only: an active virtual environment that make reused is the user's, not ours to delete.
clean:
	rm -rf build .venv *.egg-info streammem_kernels/*.so
