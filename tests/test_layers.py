"""Imports flow one way between the packages, no two files depend on each other, and validation and
serving reach a backend only through its contract.

Every folder installs under one namespace (`fusedspec.compile`, ...). The layers, bottom up: `core`
(errors, settings, files) imports nothing of ours; `compile` only `core`; `validate`, `registry` and
`demo` only those two (not each other); `serve` also `registry` and `validate`; `flows` may import any.
Inside `compile`, the backends (`compile.cpu`, `compile.neuron`) are loaded by name through
`compile.backend`; `validate` and `serve` call a loaded artifact through `compile.backend.Runner` and
import no backend module, so a new backend needs no change there. Every import statement counts, the
ones inside functions too: a function-level import is how a cycle or a layer breach hides (it does not
fail at import time, only when the function first runs).

Two kinds of import are looked at differently:
- An import under `if TYPE_CHECKING:` never runs, so it cannot make an import-order cycle; the runtime
  cycle check leaves it out. It still counts for the layers, for the backend rule, and for the check
  that no two files depend on each other: a type from a higher layer in a signature is a dependency on
  that layer all the same, and two files naming each other's types cannot be read or changed apart.
- `importlib.import_module("a.literal.name")` is an import and counts like one; a name built at run
  time (a backend registered by name, an exception class named by a child process) cannot be followed
  by reading the source and is not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "fusedspec"  # every folder below installs as fusedspec.<folder> (pyproject.toml's package-dir)
PACKAGES = ("core", "compile", "validate", "registry", "demo", "serve", "flows")
# What each package may import among PACKAGES (its own modules always).
ALLOWED = {
    "core": {"core"},
    "compile": {"core", "compile"},
    "validate": {"core", "compile", "validate"},
    "registry": {"core", "compile", "registry"},
    "demo": {"core", "compile", "demo"},
    "serve": {"core", "compile", "registry", "validate", "serve"},
    "flows": set(PACKAGES),
}
BACKENDS = ("compile.cpu", "compile.neuron")  # loaded by name (compile.backend.get_backend), never imported
BACKEND_FREE = ("validate", "serve")  # they call a loaded artifact through compile.backend.Runner


def package_of(module: str) -> str | None:
    """The folder of PACKAGES a dotted module name belongs to, or None for anything else."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == NAMESPACE and parts[1] in PACKAGES else None


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name of the file holding the import
    imported: str  # dotted module name it imports (the module itself, not a name inside it)
    path: Path
    line: int
    type_checking_only: bool

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join((NAMESPACE, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def product_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of the packages under `root`, by dotted name."""
    return {module_name(root, path): path
            for package in packages for path in sorted((root / package).rglob("*.py"))}


def _is_type_checking_test(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """Line numbers inside the body (not the else) of every `if TYPE_CHECKING:` block."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking_test(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _absolute(importer: str, is_package: bool, module: str | None, level: int) -> str:
    """The absolute module a (possibly relative) `from ... import` names."""
    if level == 0:
        return module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _named_modules(node: ast.AST, importer: str, is_package: bool, modules: set[str]) -> list[str]:
    """The modules an AST node imports: `import a.b`, `from a import b` (b a module or a name in a),
    relative forms, and `importlib.import_module("a.b")` with a literal name."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _absolute(importer, is_package, node.module, node.level)
        # `from pkg import sub` imports the submodule when there is one, else a name defined in pkg.
        return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__"):
            return [node.args[0].value]
    return []


def collect_imports(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    """Every import of one package module by another, anywhere in a file (functions included)."""
    files = product_files(root, packages)
    found = []
    for importer, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        type_only = _type_checking_lines(tree)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            for imported in _named_modules(node, importer, is_package, set(files)):
                if package_of(imported) in packages and imported != importer:
                    found.append(Import(importer, imported, path.relative_to(root),
                                        node.lineno, node.lineno in type_only))  # type: ignore[attr-defined]
    return found


def layer_violations(imports: list[Import]) -> list[str]:
    found = []
    for imp in imports:
        layer = package_of(imp.importer)
        assert layer is not None
        if package_of(imp.imported) not in ALLOWED[layer]:
            found.append(f"{imp.where()}: {imp.importer} imports {imp.imported}, but {layer} may import only "
                         f"{', '.join(sorted(ALLOWED[layer]))}")
    return sorted(found)


def backend_imports(imports: list[Import]) -> list[str]:
    """Every import of a backend module by a package that must reach backends through their contract."""
    backends = tuple(f"{NAMESPACE}.{name}" for name in BACKENDS)
    return sorted(f"{imp.where()}: {imp.importer} imports the backend module {imp.imported}; use "
                  "fusedspec.compile.backend (Runner, Batcher, get_backend) instead"
                  for imp in imports if package_of(imp.importer) in BACKEND_FREE
                  and (imp.imported in backends or imp.imported.startswith(tuple(b + "." for b in backends))))


def import_cycles(imports: list[Import], *, types_too: bool = False) -> list[list[str]]:
    """Each set of files that import one another, directly or through others (Tarjan's strongly
    connected components of the import graph), sorted; type-checking-only imports left out unless
    `types_too`."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if types_too or not imp.type_checking_only:
            graph.setdefault(imp.importer, set()).add(imp.imported)
            graph.setdefault(imp.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def describe_cycle(cycle: list[str], imports: list[Import], *, types_too: bool = False) -> str:
    inside = set(cycle)
    edges = sorted({f"{imp.importer} -> {imp.imported} ({imp.where()})" for imp in imports
                    if imp.importer in inside and imp.imported in inside
                    and (types_too or not imp.type_checking_only)})
    return "cycle between " + ", ".join(cycle) + ":\n    " + "\n    ".join(edges)


# The product ------------------------------------------------------------------------------------------


def test_product_imports_follow_the_layers() -> None:
    imports = collect_imports(REPO)
    assert len({imp.importer for imp in imports}) > 50  # the walk really read the packages
    assert layer_violations(imports) == []


def test_no_two_product_files_import_each_other() -> None:
    imports = collect_imports(REPO)
    cycles = import_cycles(imports)
    assert not cycles, "\n".join(describe_cycle(cycle, imports) for cycle in cycles)


def test_no_two_product_files_depend_on_each_other_even_for_types() -> None:
    imports = collect_imports(REPO)
    cycles = import_cycles(imports, types_too=True)
    assert not cycles, "\n".join(describe_cycle(cycle, imports, types_too=True) for cycle in cycles)


def test_validation_and_serving_import_no_backend_module() -> None:
    imports = collect_imports(REPO)
    assert {package_of(imp.importer) for imp in imports} >= set(BACKEND_FREE)  # both were read
    assert backend_imports(imports) == []


def test_every_package_folder_installs_under_the_namespace() -> None:
    """A package folder missing from pyproject.toml would import from a checkout and be absent from the
    wheel; a folder mapped elsewhere would install under another name."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {f"{NAMESPACE}.{folder}": folder for folder in PACKAGES}
    folders = sorted(path.parent.relative_to(REPO).as_posix() for folder in PACKAGES
                     for path in (REPO / folder).rglob("__init__.py"))
    assert sorted(setuptools["packages"]) == sorted(f"{NAMESPACE}." + f.replace("/", ".") for f in folders)


# The checker itself, on a crafted tree with one of each fault: each test below would pass if the checker
# could not fail --------------------------------------------------------------------------------------

CRAFTED = {
    # against the layers: in a function, through importlib, at module level
    "compile/spec.py": "def f():\n    from fusedspec.registry.store import Store\n    return Store\n",
    "registry/hub.py": ("from fusedspec.registry.download import fetch\ndef f():\n    import importlib\n"
                        "    return importlib.import_module('fusedspec.validate.greedy')\n"),
    "registry/verify.py": "from fusedspec.flows import pipeline\n",
    "flows/pipeline.py": "from fusedspec.registry import verify\nimport fusedspec.validate.greedy\n",
    "validate/greedy.py": "import fusedspec.compile.spec\n",
    "core/files.py": "from fusedspec.compile import spec\n",
    # cycles: one hidden in a function, one through a relative import, one inside flows
    "registry/download.py": "def fetch():\n    from fusedspec.registry import hub\n",
    "compile/a.py": "from fusedspec.compile.b import x\n",
    "compile/b.py": "x = 1\ndef f():\n    from .c import y\n",
    "compile/c.py": "from fusedspec.compile import a\ny = 2\n",
    "flows/run.py": "from fusedspec.flows.cli import main\n",
    "flows/cli.py": "import fusedspec.flows.run\n",
    # a store/publish pair that only meet under TYPE_CHECKING, which also names a higher layer
    "registry/store.py": "from fusedspec.registry.publish import publish\n",
    "registry/publish.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from fusedspec.registry.store import Store\n"
                            "    from fusedspec.flows.summary import RunSummary\ndef publish(): ...\n"),
    # relative imports of every form, and one out of the package into another folder
    "compile/cpu/__init__.py": "from . import backend\n",
    "compile/cpu/backend.py": "from ...core.errors import E\nfrom .model import M\nfrom ..spec import S\n",
    "compile/cpu/model.py": "M = 1\n",
    "core/errors.py": "E = 1\n",
    # a name outside the namespace that happens to match a folder (configobj's top-level `validate`)
    "serve/app.py": "import validate\nfrom compile import x\n",
    # backend modules reached from validation and serving: for types only, in a function, by literal name,
    # as a package; and the contract itself, which is fine
    "validate/staggered.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from fusedspec.compile.cpu.batching import ContinuousBatcher\n"),
    "validate/step_costs.py": ("from fusedspec.compile.backend import Runner\ndef f():\n"
                               "    from fusedspec.compile.neuron.backend import parameters_all_ranks\n"),
    "serve/engine.py": "import importlib\nrunner = importlib.import_module('fusedspec.compile.cpu.runner')\n",
    "serve/text.py": "from fusedspec.compile import cpu\nfrom fusedspec.compile.cpu_notes import x\n",
    "compile/backend.py": "from fusedspec.compile.spec import S\n",
    "compile/cpu_notes.py": "x = 1\n",
}


@pytest.fixture
def crafted(tmp_path: Path) -> list[Import]:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for name, text in CRAFTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return collect_imports(tmp_path)


def test_imports_against_the_layers_are_caught_wherever_they_stand(crafted: list[Import]) -> None:
    assert layer_violations(crafted) == [
        "compile/spec.py:2: fusedspec.compile.spec imports fusedspec.registry.store, but compile may import "
        "only compile, core",
        "core/files.py:1: fusedspec.core.files imports fusedspec.compile.spec, but core may import only core",
        "registry/hub.py:4: fusedspec.registry.hub imports fusedspec.validate.greedy, but registry may "
        "import only compile, core, registry",
        "registry/publish.py:4: fusedspec.registry.publish imports fusedspec.flows.summary, but registry may "
        "import only compile, core, registry",
        "registry/verify.py:1: fusedspec.registry.verify imports fusedspec.flows.pipeline, but registry may "
        "import only compile, core, registry",
    ]


def test_cycles_are_caught_within_and_across_packages_but_not_through_type_checking(
        crafted: list[Import]) -> None:
    assert import_cycles(crafted) == [
        ["fusedspec.compile.a", "fusedspec.compile.b", "fusedspec.compile.c"],
        ["fusedspec.flows.cli", "fusedspec.flows.run"],
        ["fusedspec.flows.pipeline", "fusedspec.registry.verify"],
        ["fusedspec.registry.download", "fusedspec.registry.hub"],
    ]
    assert "registry/download.py:2" in describe_cycle(["fusedspec.registry.download",
                                                       "fusedspec.registry.hub"], crafted)


def test_a_pair_naming_each_others_types_is_a_dependency_cycle(crafted: list[Import]) -> None:
    # store imports publish; publish names store's type under TYPE_CHECKING only (as runner.py and
    # batching.py once did): no import-order cycle, but the two cannot be read or changed apart
    assert import_cycles(crafted, types_too=True) == sorted(
        [*import_cycles(crafted), ["fusedspec.registry.publish", "fusedspec.registry.store"]])
    assert "registry/publish.py:3" in describe_cycle(["fusedspec.registry.publish",
                                                      "fusedspec.registry.store"], crafted, types_too=True)


def test_backend_modules_imported_by_validation_or_serving_are_caught(crafted: list[Import]) -> None:
    found = backend_imports(crafted)
    assert [line.split(": ")[0] for line in found] == [
        "serve/engine.py:2", "serve/text.py:1", "validate/staggered.py:3", "validate/step_costs.py:3"]
    assert "fusedspec.compile.neuron.backend; use fusedspec.compile.backend (Runner" in found[-1]


def test_relative_imports_resolve_to_the_module_they_name(crafted: list[Import]) -> None:
    assert sorted((imp.importer, imp.imported) for imp in crafted
                  if imp.importer.startswith("fusedspec.compile.cpu")) == [
        ("fusedspec.compile.cpu", "fusedspec.compile.cpu.backend"),
        ("fusedspec.compile.cpu.backend", "fusedspec.compile.cpu.model"),
        ("fusedspec.compile.cpu.backend", "fusedspec.compile.spec"),
        ("fusedspec.compile.cpu.backend", "fusedspec.core.errors"),
    ]


def test_names_outside_the_namespace_are_not_the_product(crafted: list[Import]) -> None:
    assert [imp for imp in crafted if imp.importer == "fusedspec.serve.app"] == []


def test_one_bad_import_added_to_a_copy_of_the_product_is_caught(tmp_path: Path) -> None:
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            copy = tmp_path / path.relative_to(REPO)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(path.read_text())
    spec = tmp_path / "compile" / "spec.py"
    spec.write_text(spec.read_text() + "\n\ndef _late() -> None:\n"
                                       "    from fusedspec.validate import greedy  # noqa: F401\n")
    line = len(spec.read_text().splitlines())
    imports = collect_imports(tmp_path)
    assert layer_violations(imports) == [
        f"compile/spec.py:{line}: fusedspec.compile.spec imports fusedspec.validate.greedy, but compile may "
        "import only compile, core"]
    # compile.spec <- validate.greedy <- ... <- compile.spec: an upward import closes a cycle too
    assert any({"fusedspec.compile.spec", "fusedspec.validate.greedy"} <= set(cycle)
               for cycle in import_cycles(imports))
