"""Read the keyword names NxDI's config classes accept from its models/config.py, for
neuron_config_fields.json.

The same reader serves two uses: run by hand on a release commit from NxDI's GitHub, for the stored lists,

    git -C nxdi show <commit>:src/neuronx_distributed_inference/models/config.py \\
        | python -m fusedspec.compile.neuron.read_nxdi_fields - > fields-<version>.json

and by compile.neuron.fields on the models/config.py of the NxDI installed on a host (0.10 and later have
no public source, so their lists can only come from there).

It parses the source (never imports or runs it) and collects, per class:
  NeuronConfig            every `kwargs.pop("<name>", ...)` in any of its methods (`__init__`, `_get_lnc`,
                          ...)
  OnDeviceSamplingConfig  every `kwargs.pop("<name>", ...)` in its `__init__`
  FusedSpecNeuronConfig   the parameters of its `__init__` (it takes no **kwargs)
which is exactly what those constructors consume; NeuronConfig only logs and drops anything else. The lists
of NxDI 0.6.0 and 0.9.0 in the data file were first read by hand; this reader reproduces all four stored
lists exactly from their commits (and NxDI's HEAD 4bcdc54 gives 0.9.0's).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

POPPED_IN_ANY_METHOD = "NeuronConfig"
POPPED_IN_INIT = "OnDeviceSamplingConfig"
INIT_PARAMETERS = "FusedSpecNeuronConfig"


def _popped_names(function: ast.FunctionDef) -> set[str]:
    names = set()
    for node in ast.walk(function):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "pop"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "kwargs"
                and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


def _methods(cls: ast.ClassDef) -> list[ast.FunctionDef]:
    return [node for node in cls.body if isinstance(node, ast.FunctionDef)]


def read_fields(source: str) -> dict[str, list[str]]:
    """{class name: sorted accepted keyword names} for the three config classes found in `source`."""
    found: dict[str, list[str]] = {}
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        if cls.name == POPPED_IN_ANY_METHOD:
            found[cls.name] = sorted(set().union(*(_popped_names(m) for m in _methods(cls))))
        elif cls.name == POPPED_IN_INIT:
            found[cls.name] = sorted(set().union(*(_popped_names(m) for m in _methods(cls)
                                                   if m.name == "__init__")))
        elif cls.name == INIT_PARAMETERS:
            init = next((m for m in _methods(cls) if m.name == "__init__"), None)
            if init is None:
                raise ValueError(f"class {cls.name} has no __init__: is this NxDI's models/config.py?")
            found[cls.name] = sorted(a.arg for a in [*init.args.args[1:], *init.args.kwonlyargs])
    missing = [name for name in (POPPED_IN_ANY_METHOD, POPPED_IN_INIT, INIT_PARAMETERS) if name not in found]
    if missing:
        raise ValueError(f"no class {', '.join(missing)} in this source: is it NxDI's models/config.py?")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fusedspec.compile.neuron.read_nxdi_fields CONFIG_PY|-", file=sys.stderr)
        return 2
    source = sys.stdin.read() if argv[0] == "-" else Path(argv[0]).read_text()
    print(json.dumps(read_fields(source), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
