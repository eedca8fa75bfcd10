"""Imports flow one way between the packages, and no two files import each other.

The layers: `compile` imports none of the other packages; `validate` and `registry` import only
`compile` (not each other); `flows` may import any. Every import statement counts, the ones inside
functions too: a function-level import is how a cycle or a layer breach hides (it does not fail at
import time, only when the function first runs).

Two kinds of import are looked at differently:
- An import under `if TYPE_CHECKING:` never runs, so it cannot make an import-order cycle; it is left
  out of the cycle check. It still counts for the layers: a type from a higher layer in a signature is a
  dependency on that layer all the same.
- `importlib.import_module("a.literal.name")` is an import and counts like one; a name built at run
  time (a backend registered by name, an exception class named by a child process) cannot be followed
  by reading the source and is not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("compile", "validate", "registry", "flows")
# What each package may import among PACKAGES (its own modules always).
ALLOWED = {
    "compile": {"compile"},
    "validate": {"compile", "validate"},
    "registry": {"compile", "registry"},
    "flows": set(PACKAGES),
}


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
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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
                if imported.split(".")[0] in packages and imported != importer:
                    found.append(Import(importer, imported, path.relative_to(root),
                                        node.lineno, node.lineno in type_only))  # type: ignore[attr-defined]
    return found


def layer_violations(imports: list[Import]) -> list[str]:
    return [f"{imp.where()}: {imp.importer} imports {imp.imported}, but {imp.importer.split('.')[0]} may "
            f"import only {', '.join(sorted(ALLOWED[imp.importer.split('.')[0]]))}"
            for imp in imports
            if imp.imported.split(".")[0] not in ALLOWED[imp.importer.split(".")[0]]]


def import_cycles(imports: list[Import]) -> list[list[str]]:
    """Each set of files that import one another, directly or through others (Tarjan's strongly
    connected components of the import graph), sorted; type-checking-only imports left out."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if not imp.type_checking_only:
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


def describe_cycle(cycle: list[str], imports: list[Import]) -> str:
    inside = set(cycle)
    edges = sorted({f"{imp.importer} -> {imp.imported} ({imp.where()})" for imp in imports
                    if imp.importer in inside and imp.imported in inside and not imp.type_checking_only})
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


# The checker itself, on crafted trees: each of these would pass if the checker could not fail ----------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for package in PACKAGES:
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_function_level_import_against_the_layers_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "compile/spec.py": "def f():\n    from registry.store import Store\n    return Store\n",
        "validate/greedy.py": "import compile.spec\n",
        "registry/verify.py": "from flows import pipeline\n",
        "flows/pipeline.py": "from registry import verify\nimport validate.greedy\n",
    })
    assert layer_violations(collect_imports(root)) == [
        "compile/spec.py:2: compile.spec imports registry.store, but compile may import only compile",
        "registry/verify.py:1: registry.verify imports flows.pipeline, but registry may import only "
        "compile, registry",
    ]


def test_validate_and_registry_may_not_import_each_other(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "validate/greedy.py": "class Greedy: ...\n",
        "registry/hub.py": "def f():\n    import importlib\n    return importlib.import_module('validate.greedy')\n",
    })
    assert layer_violations(collect_imports(root)) == [
        "registry/hub.py:3: registry.hub imports validate.greedy, but registry may import only compile, registry",
    ]


def test_a_cycle_hidden_in_a_function_is_caught_within_and_across_packages(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "registry/hub.py": "from registry.download import fetch\n",
        "registry/download.py": "def fetch():\n    from registry import hub\n",
        "compile/a.py": "from compile.b import x\n",
        "compile/b.py": "x = 1\ndef f():\n    from .c import y\n",
        "compile/c.py": "from compile import a\ny = 2\n",
        "flows/run.py": "from flows.cli import main\n",
        "flows/cli.py": "import flows.run\n",
        "flows/ok.py": "from compile.a import x\n",
    })
    imports = collect_imports(root)
    assert import_cycles(imports) == [
        ["compile.a", "compile.b", "compile.c"],
        ["flows.cli", "flows.run"],
        ["registry.download", "registry.hub"],
    ]
    assert "registry/download.py:2" in describe_cycle(["registry.download", "registry.hub"], imports)


def test_an_import_only_for_type_checking_is_no_cycle_but_still_a_layer(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "registry/store.py": "from registry.publish import publish\n",
        "registry/publish.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from registry.store import Store\n    from flows.summary import S\n"
                                "def publish(): ...\n"),
    })
    imports = collect_imports(root)
    assert import_cycles(imports) == []
    assert [v.split(":")[1] for v in layer_violations(imports)] == ["4"]


def test_relative_imports_resolve_to_the_module_they_name(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "compile/cpu/__init__.py": "from . import backend\n",
        "compile/cpu/backend.py": "from ..errors import E\nfrom .model import M\n",
        "compile/cpu/model.py": "M = 1\n",
        "compile/errors.py": "E = 1\n",
    })
    assert sorted((imp.importer, imp.imported) for imp in collect_imports(root)) == [
        ("compile.cpu", "compile.cpu.backend"),
        ("compile.cpu.backend", "compile.cpu.model"),
        ("compile.cpu.backend", "compile.errors"),
    ]


def test_one_bad_import_added_to_a_copy_of_the_product_is_caught(tmp_path: Path) -> None:
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            copy = tmp_path / path.relative_to(REPO)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(path.read_text())
    spec = tmp_path / "compile" / "spec.py"
    spec.write_text(spec.read_text() + "\n\ndef _late() -> None:\n    from validate import greedy  # noqa: F401\n")
    line = len(spec.read_text().splitlines())
    imports = collect_imports(tmp_path)
    assert layer_violations(imports) == [
        f"compile/spec.py:{line}: compile.spec imports validate.greedy, but compile may import only compile"]
    # compile.spec <- validate.greedy <- ... <- compile.spec: an upward import closes a cycle too
    assert any({"compile.spec", "validate.greedy"} <= set(cycle) for cycle in import_cycles(imports))
