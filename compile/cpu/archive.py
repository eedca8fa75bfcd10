"""Refuse a torch.export program archive (`programs/*.pt2`) that could run code, before torch reads it.

`torch.export.load` is documented as unsafe on untrusted files, and an artifact's programs come from a
store that others can write to. Reading torch 2.13's loader (torch/export/pt2_archive/_package.py,
torch/_export/serde/serialize.py, torch/export/_unlift.py) shows four ways an archive runs code:

- pickled members: weights and constants saved "with pickle" (`torch.load(weights_only=False)`),
  `opaque_obj_*` constants (`pickle.loads`), `custom_obj_*` (the TorchScript pickler), and the *.pt
  members of the older format that `torch.export.load` falls back to;
- the symbolic shape expressions of models/*.json, which are parsed with `sympy.sympify`: that is
  Python's `eval` (a crafted `expr_str` wrote a file during `torch.export.load` here);
- `guards_code`, Python source that `ExportedProgram.module()` passes to `exec`;
- node targets, resolved by attribute lookup under `torch`, `operator` and `math`: `torch.os.system`
  resolves, and so do `torch.ops.aten.save` and `aten.from_file`, which write and map files.

A program of ours holds none of that: `compile.cpu.export.save_program` exports graphs of aten
operators (plus `operator.mul` on sizes) whose weights are inputs, so the archive has no weights, no
constants, empty example inputs and no guards, and its shape expressions are sympy constructors over
size symbols. `check_program_archive` therefore accepts exactly that shape (an allowlist, not a search
for known attacks) and raises ArtifactError naming the first member that does not fit. What remains is
the trust any compiled program needs: aten kernels are native code that a crafted graph calls with
inputs of its choosing.

AOTInductor packages (`*.aoti.pt2`) hold a shared library: loading one runs its native code, and no
inspection of the archive can make that safe. They are loaded only when the work dir's own build wrote
them, or from bytes that matched a manifest whose signature verified with the configured key
(compile.trust.LoadTrust.native_refusal, enforced by compile.cpu.export.load_program). This check refuses
them (they have native members).
"""

from __future__ import annotations

import functools
import io
import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fusedspec.core.errors import ArtifactError

PICKLE_PROTO = b"\x80"  # the first opcode of every pickle since protocol 2
ZIP_LOCAL_HEADER = b"PK\x03\x04"
MAX_MEMBER_BYTES = 1 << 30  # a graph of a 64-layer model is tens of MB; a member beyond this is not ours

# Every member of an archive `torch.export.save` writes for a program saved as ours are (under the
# archive's single root directory), and what its content must be.
TEXT_MEMBERS = {
    "archive_format": re.compile(rb"^pt2$"),
    "archive_version": re.compile(rb"^\d{1,4}$"),
    ".data/version": re.compile(rb"^\d{1,4}\n?$"),
    "byteorder": re.compile(rb"^(little|big)$"),
    ".data/serialization_id": re.compile(rb"^\d{1,64}$"),
}
GRAPH = "models/model.json"
EMPTY_CONFIGS = ("data/weights/model_weights_config.json", "data/constants/model_constants_config.json")
SAMPLE_INPUTS = "data/sample_inputs/model.pt"  # empty: save_program drops the example inputs
ROOT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")

# Node targets a program may call: aten operators, and Python's arithmetic on symbolic sizes.
ATEN_TARGET = re.compile(r"^torch\.ops\.aten\.([A-Za-z0-9_]+)\.([A-Za-z0-9_]+)$")
OPERATOR_TARGETS = frozenset(f"_operator.{name}" for name in (
    "add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "neg", "eq", "ne", "lt", "le", "gt", "ge",
    "getitem"))
# Argument kinds that name objects outside the graph's tensors: subgraphs, script objects, operators.
FOREIGN_ARGUMENTS = frozenset({"as_graph", "as_custom_obj", "as_operator", "as_opaque_obj"})

# Shape expressions as the serializer writes them (sympy's srepr): constructors, numbers, size symbols.
SYMPY_NAMES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Mod", "Abs",
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan",
    "And", "Or", "Not", "true", "false", "True", "False", "oo",
    # torch.utils._sympy.functions, as the deserializer names them
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv",
    "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator",
    "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "Identity",
    # assumptions given to Symbol(...)
    "positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite", "zero", "nonzero",
})
SIZE_SYMBOL = re.compile(r"^[a-z]{1,4}\d{1,9}$")  # s9, u0, zuf0: the shape environment's names
EXPRESSION_TOKEN = re.compile(r"\s+|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|'(?P<text>[^']*)'|"
                              r"\d+(?:\.\d+)?|[(),=+\-*/]")
MAX_EXPRESSION = 10_000


def check_program_archive(path: Path, data: bytes | None = None) -> None:
    """Raise ArtifactError unless `path` (or `data`, its bytes already read) is a torch.export archive of
    the shape `save_program` writes: nothing pickled, no weights or constants, no guards code, shape
    expressions and node targets from the allowlists above. Reads the archive with `zipfile` only; torch
    never sees a refused file."""
    path = Path(path)
    try:
        if data is None:
            data = path.read_bytes()
        if data[:len(ZIP_LOCAL_HEADER)] != ZIP_LOCAL_HEADER:
            raise _refused(path, "the file does not start with a zip entry (torch.export.save writes one "
                                 "first)")
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            _check_members(path, archive)
    except zipfile.BadZipFile as exc:
        raise _refused(path, f"not a readable zip archive ({exc})") from None
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot be read ({exc.strerror or exc}); build the artifact "
                            "again") from None


def _refused(path: Path, why: str) -> ArtifactError:
    return ArtifactError(f"{path}: refused before loading: {why}. A program fusedspec exports holds none of "
                         "this; do not load this file, delete the artifact and build or download it again")


def _check_members(path: Path, archive: zipfile.ZipFile) -> None:
    members = archive.infolist()
    names = [m.filename for m in members]
    if len(set(names)) != len(names):  # readers disagree on which of two same-named members counts
        raise _refused(path, "it has two members of the same name")
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1 or not ROOT_NAME.match(next(iter(roots))):
        raise _refused(path, "its members are not under one plain root directory "
                             f"({', '.join(sorted(roots)[:3])})")
    root = next(iter(roots))
    contents = {member.filename: _read(path, archive, member) for member in members}
    for name, data in contents.items():  # a pickle is named first, wherever the archive refers to it
        if data.startswith(PICKLE_PROTO) or name.endswith((".pkl", ".pickle")):
            raise _refused(path, f"member {name} holds a pickle, which loading would execute")
    for name, data in contents.items():
        problem = _member_problem(name[len(root) + 1:], data)
        if problem:
            raise _refused(path, f"member {name}: {problem}")
    if f"{root}/{GRAPH}" not in names:
        raise _refused(path, f"it has no {root}/{GRAPH} (not a torch.export program of ours)")


def _read(path: Path, archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> bytes:
    if member.compress_type != zipfile.ZIP_STORED:  # torch stores members; a compressed one could be a bomb
        raise _refused(path, f"member {member.filename} is compressed (torch.export.save stores members)")
    if member.file_size > MAX_MEMBER_BYTES:
        raise _refused(path, f"member {member.filename} is {member.file_size} bytes")
    return archive.read(member)  # also checks the local header's name against the directory's


def _member_problem(rel: str, data: bytes) -> str | None:
    if rel in TEXT_MEMBERS:
        return None if TEXT_MEMBERS[rel].match(data) else f"unexpected content {data[:40]!r}"
    if rel in EMPTY_CONFIGS:
        return _empty_config_problem(data)
    if rel == SAMPLE_INPUTS:
        return None if not data else ("example inputs are saved (ours are dropped before saving; loading "
                                      "unpickles them)")
    if rel == GRAPH:
        return graph_problem(data)
    return ("not a member a fusedspec program has (weights, constants, pickled or opaque objects, native "
            "code and extra files are refused)")


def _empty_config_problem(data: bytes) -> str | None:
    try:
        config = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return "not JSON"
    if config != {"config": {}}:
        return ("lists weights or constants (ours are graph inputs, never saved in the program; loading them "
                "can unpickle)")
    return None


def graph_problem(data: bytes) -> str | None:
    """What in a serialized graph (models/model.json) would run code or touch files, or None."""
    try:
        graph = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return "the graph is not JSON"
    if not isinstance(graph, dict):
        return "the graph is not a JSON object"
    if graph.get("guards_code"):
        return "it carries guards code, which loading passes to exec (our programs have none)"
    for key, value in _items(graph):
        if key in FOREIGN_ARGUMENTS:
            return (f"an argument of kind {key} (subgraphs, script objects and operators are not in our "
                    "programs)")
        if key == "target" and isinstance(value, str):
            problem = target_problem(value)
            if problem:
                return problem
        if key == "expr_str" and isinstance(value, str):
            problem = expression_problem(value)
            if problem:
                return problem
    return None


def _items(value: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair of every object nested in `value`, iteratively (no recursion limit)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                yield key, inner
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


def target_problem(target: str) -> str | None:
    """Why a node may not call `target`, or None: aten operators that take no file name, and arithmetic."""
    if target in OPERATOR_TARGETS:
        return None
    match = ATEN_TARGET.match(target)
    if match is None:
        return (f"a node calls {target[:80]!r}, which is not an aten operator (a graph could reach any torch "
                "attribute)")
    if match.group(1) in _file_operators():
        return f"a node calls {target!r}, which reads or writes a file of the host"
    return None


@functools.cache
def _file_operators() -> frozenset[str]:
    """aten operators with a file name or path argument (aten::save, aten::from_file in torch 2.13)."""
    import torch

    return frozenset(schema.name.split("::", 1)[1] for schema in torch._C._jit_get_all_schemas()
                     if schema.name.startswith("aten::")
                     and any("str" in str(a.type) and ("file" in a.name.lower() or "path" in a.name.lower())
                             for a in schema.arguments))


def expression_problem(text: str) -> str | None:
    """Why a shape expression is not plain sympy over size symbols (sympify evaluates it), or None."""
    if len(text) > MAX_EXPRESSION:
        return f"a shape expression of {len(text)} characters"
    position = 0
    while position < len(text):
        token = EXPRESSION_TOKEN.match(text, position)
        if token is None:
            return f"a shape expression holds {text[position:position + 30]!r}, which sympify would evaluate"
        name, quoted = token.group("name"), token.group("text")
        if name is not None and name not in SYMPY_NAMES and not SIZE_SYMBOL.match(name):
            return f"a shape expression names {name!r}, which sympify would evaluate"
        if quoted is not None and not SIZE_SYMBOL.match(quoted):
            return f"a shape expression holds the text {quoted[:30]!r}, which is not a size symbol"
        position = token.end()
    return None
