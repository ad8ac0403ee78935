"""The house rules, checked on the source (CONTRIBUTING.md, "The two packages and their layers").

* No module imports a private name (``_x``, or a name from a private module) of another folder:
  private names stay inside the folder (op, runtime, layer) that defines them.  Tests are exempt.
* No import cycle between the modules of the packages (imports inside functions included: a lazy
  import is still a dependency).
* Layers import downward only: in ``streammem_kernels`` the runtime imports no op; in ``streammem``
  each layer imports only lower layers (``LAYERS``); the kernels import nothing of ``streammem``;
  nothing imports the CLI.
* ``bench/`` imports only public names and never edits ``sys.path``.
"""
from __future__ import annotations

import ast
import re
import os
from collections import defaultdict

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (package name, folder holding the package, relative to the root)
PACKAGES = (("streammem_kernels", "streammem_kernels"), ("streammem", os.path.join("python", "streammem")))
# streammem's layers, bottom first: a module may import its own layer and those below it.
LAYERS = (
    ("checks", "config", "checkpoint"),
    ("models",),
    ("io",),
    ("components",),
    ("stream",),
    ("recipes", "distributed"),
    ("cli",),
)


def _modules() -> dict[str, str]:
    """module name -> file, for every module of the two packages."""
    found = {}
    for package, folder in PACKAGES:
        base = os.path.join(ROOT, folder)
        for dirpath, _, files in os.walk(base):
            for name in files:
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), base)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                found[".".join([package, *rel])] = os.path.join(dirpath, name)
    return found


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES.get(module, "").endswith("__init__.py")


def _imports(module: str, path: str):
    """(target module, imported name or None, line) for every import in the file, relative ones resolved."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    here = module if _is_package(module) else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:  # `from pkg import submodule`
                    yield f"{target}.{alias.name}", None, node.lineno
                else:
                    yield target, alias.name, node.lineno


def _private(module: str, name: str | None) -> bool:
    parts = module.split(".") + ([name] if name else [])
    return any(p.startswith("_") and not p.startswith("__") for p in parts)


def _folder(module: str) -> str:
    """The folder a module lives in (a package is its own folder)."""
    return module if _is_package(module) else module.rsplit(".", 1)[0]


def _known(target: str) -> str | None:
    """The module of the packages an import names (the longest known prefix), or None."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _edges():
    for module, path in MODULES.items():
        for target, name, line in _imports(module, path):
            known = _known(target)
            if known is not None:
                yield module, known, target, name, line


def test_no_private_name_crosses_a_folder():
    bad = [f"{MODULES[module]}:{line} imports {target}{'.' + name if name else ''}"
           for module, known, target, name, line in _edges()
           if _private(target, name) and _folder(known) != _folder(module)]
    assert not bad, "private names imported across folders:\n" + "\n".join(bad)


def test_no_import_cycle():
    graph = defaultdict(set)
    for module, known, *_ in _edges():
        if known != module:
            graph[module].add(known)
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(MODULES):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "streammem" or len(parts) < 2:
        return None
    for rank, names in enumerate(LAYERS):
        if parts[1] in names:
            return rank
    return None


def test_layers_import_downward_only():
    bad = []
    for module, known, target, name, line in _edges():
        where = f"{MODULES[module]}:{line} imports {known}"
        if module.startswith("streammem_kernels") and known.startswith("streammem."):
            bad.append(f"{where} (the kernels know nothing of streammem)")
        if module.startswith("streammem_kernels.runtime") and not known.startswith("streammem_kernels.runtime"):
            bad.append(f"{where} (the runtime imports no op)")
        if known.startswith("streammem.cli") and not module.startswith("streammem.cli"):
            bad.append(f"{where} (nothing imports the CLI)")
        low, high = _layer(module), _layer(known)
        if low is not None and high is not None and high > low:
            bad.append(f"{where} (layer {LAYERS[low]} imports the higher layer {LAYERS[high]})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_every_streammem_module_has_a_layer():
    loose = [m for m in MODULES if m.startswith("streammem.") and _layer(m) is None]
    assert not loose, f"modules of streammem outside every layer of LAYERS: {loose}"


def _bench_files():
    bench = os.path.join(ROOT, "bench")
    return [os.path.join(bench, f) for f in sorted(os.listdir(bench)) if f.endswith(".py")]


@pytest.mark.parametrize("path", _bench_files(), ids=os.path.basename)
def test_bench_imports_public_names_only_and_leaves_sys_path_alone(path):
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    tree = ast.parse(source, path)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            parent_calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                            and n.func.value is node]
            if parent_calls or any(isinstance(n, (ast.Assign, ast.AugAssign)) for n in ast.walk(tree)
                                   if getattr(n, "lineno", None) == node.lineno):
                bad.append(f"line {node.lineno}: edits sys.path")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("streammem",
                                                                                          "streammem_kernels"):
            for alias in node.names:
                if _private(node.module, alias.name):
                    bad.append(f"line {node.lineno}: imports {node.module}.{alias.name}")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("streammem", "streammem_kernels") and _private(alias.name, None):
                    bad.append(f"line {node.lineno}: imports {alias.name}")
    assert not bad, f"{os.path.relpath(path, ROOT)}:\n" + "\n".join(bad)


MAX_LINES = 800


def test_no_module_of_the_packages_is_over_800_lines():
    long = {}
    for module, path in MODULES.items():
        with open(path, encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            long[os.path.relpath(path, ROOT)] = n
    assert not long, f"modules over {MAX_LINES} lines (split them by responsibility): {long}"


# History lives in git: no issue numbers, branch names or dated notes in code, tests or bench scripts.
HISTORY = re.compile(r"\b[Ii]ssue[ #]?\d+\b|\bi\d\d[a-z]\b|\b20\d\d-[01]\d-[0-3]\d\b(?!T\d)")


def _source_files():
    for top in ("streammem_kernels", "python", "tests", "bench", "csrc"):
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "results", "baseline", "data", "plots")]
            for name in files:
                if name.endswith((".py", ".cpp", ".h", ".cu", ".cuh", ".sh")):
                    yield os.path.join(dirpath, name)


def test_no_issue_numbers_branch_names_or_dates_in_the_source():
    this = os.path.abspath(__file__)
    found = []
    for path in _source_files():
        if os.path.abspath(path) == this:
            continue
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if HISTORY.search(line):
                    found.append(f"{os.path.relpath(path, ROOT)}:{lineno}: {line.strip()[:100]}")
    assert not found, "history belongs in git:\n" + "\n".join(found)
