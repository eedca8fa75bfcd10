"""A `.pt2` program that would run code when loaded is refused before `torch.export.load` sees it
(compile/cpu/archive.py), and the programs we save pass.

The hostile archives are built from a real one (`save_program` of a small module with a dynamic size, as
the cpu backend saves its programs) by adding what a crafted `programs/*.pt2` in a store could hold. Each
payload would create a file; the tests never load one: they show the check refuses it and the file does
not exist. That torch really unpickles such a member is shown with a harmless object instead.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from fusedspec.compile.cpu.archive import check_program_archive
from fusedspec.compile.cpu.export import save_program
from fusedspec.core.errors import ArtifactError


class Step(nn.Module):
    """Shaped like our programs: weights are inputs, a cache is updated in place, one size is dynamic."""

    def forward(self, weights: dict[str, torch.Tensor], tokens: torch.Tensor,
                cache: torch.Tensor) -> torch.Tensor:
        cache.add_(1.0)  # (batch, 4)
        hidden = tokens.float().sum(-1, keepdim=True) * tokens.shape[1]  # (batch, 1): uses the symbolic size
        return hidden @ weights["w"] + cache  # (batch, 4)


@pytest.fixture
def program(tmp_path: Path) -> Path:
    args = ({"w": torch.randn(1, 4)}, torch.zeros(2, 5, dtype=torch.int64), torch.zeros(2, 4))
    shapes = ({"w": None}, {1: torch.export.Dim("context", min=2, max=64)}, None)
    exported = torch.export.export(Step(), args, dynamic_shapes=shapes, strict=True)
    return save_program(exported, tmp_path / "programs", "fused_step", aot_inductor=False)


def rewrite(source: Path, target: Path, change: Callable[[str, bytes], bytes | None],
            extra: dict[str, bytes] | None = None) -> Path:
    """A copy of the archive `source` with each member's bytes passed through `change` (None drops it),
    plus `extra` members (names relative to the archive's root directory), stored as torch stores them."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as out:
        root = original.namelist()[0].split("/", 1)[0]
        for member in original.infolist():
            data = change(member.filename[len(root) + 1:], original.read(member))
            if data is not None:
                out.writestr(member, data)
        for name, data in (extra or {}).items():
            out.writestr(zipfile.ZipInfo(f"{root}/{name}"), data)
    return target


def with_planted_constant(source: Path, target: Path, payload: bytes) -> Path:
    """The archive with a constant stored as `opaque_obj_0`, which torch.export.load reads with
    pickle.loads."""
    entry = {"planted": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                         "tensor_meta": None}}

    def change(rel: str, data: bytes) -> bytes:
        return json.dumps({"config": entry}).encode() if rel.endswith("_constants_config.json") else data

    return rewrite(source, target, change, {"data/constants/opaque_obj_0": payload})


class WritesAFile:
    """Unpickling this object opens (creates) `path`: what a crafted member would do to a validator."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.path), "w")


def test_programs_we_save_pass_and_still_load(program: Path) -> None:
    check_program_archive(program)
    loaded = torch.export.load(str(program)).module()
    cache = torch.zeros(2, 4)
    out = loaded({"w": torch.ones(1, 4)}, torch.ones(2, 7, dtype=torch.int64), cache)
    assert out.shape == (2, 4) and float(out[0, 0]) == 7.0 * 7 + 1  # 7 tokens of 1, times the size 7, + cache


def test_torch_unpickles_a_planted_member(program: Path, tmp_path: Path) -> None:
    """Why the check exists, shown with a harmless object: torch.export.load runs pickle on this member."""
    planted = with_planted_constant(program, tmp_path / "planted.pt2", pickle.dumps({"unpickled": True}))
    assert torch.export.load(str(planted)).constants["planted"] == {"unpickled": True}


@pytest.mark.parametrize("where", ["opaque object", "example inputs", "pickled weight", "pkl name"])
def test_a_pickled_member_is_refused_without_running_it(program: Path, tmp_path: Path, where: str) -> None:
    flag = tmp_path / "written-by-the-payload"
    payload = pickle.dumps(WritesAFile(flag))
    crafted = tmp_path / "crafted.pt2"
    if where == "opaque object":
        with_planted_constant(program, crafted, payload)
        member = "opaque_obj_0"
    elif where == "example inputs":
        rewrite(program, crafted, lambda rel, data: payload if rel == "data/sample_inputs/model.pt" else data)
        member = "data/sample_inputs/model.pt"
    elif where == "pickled weight":
        entry = {"w": {"path_name": "weight_0", "is_param": True, "use_pickle": True, "tensor_meta": None}}
        rewrite(program, crafted, lambda rel, data: json.dumps({"config": entry}).encode()
                if rel.endswith("_weights_config.json") else data, {"data/weights/weight_0": payload})
        member = "weight_0"
    else:
        rewrite(program, crafted, lambda rel, data: data, {"extra/state.pkl": b"not even a pickle"})
        member = "state.pkl"
    with pytest.raises(ArtifactError, match="refused before loading") as refused:
        check_program_archive(crafted)
    assert member in str(refused.value) and str(crafted) in str(refused.value)
    assert not flag.exists()


def _graph_change(edit: Callable[[dict], None]) -> Callable[[str, bytes], bytes]:
    def change(rel: str, data: bytes) -> bytes:
        if rel != "models/model.json":
            return data
        graph = json.loads(data)
        edit(graph)
        return json.dumps(graph).encode()

    return change


def _nodes(graph: dict) -> list[dict]:
    return graph["graph_module"]["graph"]["nodes"]


def _first_expression(graph: dict) -> dict:
    stack: list = [graph]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("expr_str"), str):
                return item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    raise AssertionError("the program has no symbolic size")


@pytest.mark.parametrize("attack, words", [
    ("shape expression", "sympify would evaluate"),  # sympify is eval: this one wrote a file when loaded
    ("guards code", "exec"),
    ("python target", "not an aten operator"),
    ("file operator", "reads or writes a file"),
])
def test_code_in_the_graph_is_refused_without_running_it(program: Path, tmp_path: Path, attack: str,
                                                         words: str) -> None:
    flag = tmp_path / "written-by-the-graph"
    code = f"__import__('pathlib').Path({str(flag)!r}).write_text('x')"

    def edit(graph: dict) -> None:
        if attack == "shape expression":
            expression = _first_expression(graph)
            expression["expr_str"] = f"Add({expression['expr_str']}, Integer(0*len({code})))"
        elif attack == "guards code":
            graph["guards_code"] = [code]
        elif attack == "python target":
            _nodes(graph)[0]["target"] = "torch.os.system"
        else:
            _nodes(graph)[0]["target"] = "torch.ops.aten.save.default"

    crafted = rewrite(program, tmp_path / "crafted.pt2", _graph_change(edit))
    with pytest.raises(ArtifactError, match=words) as refused:
        check_program_archive(crafted)
    assert "models/model.json" in str(refused.value)
    assert not flag.exists()


def test_archives_not_shaped_like_ours_are_refused(program: Path, tmp_path: Path) -> None:
    def refused(path: Path, words: str) -> None:
        with pytest.raises(ArtifactError, match=words):
            check_program_archive(path)

    not_zip = tmp_path / "not-zip.pt2"
    not_zip.write_bytes(b"\x80\x04K\x01.")  # a bare pickle
    refused(not_zip, "does not start with a zip entry")
    native = rewrite(program, tmp_path / "aoti.pt2", lambda rel, data: data,
                     {"data/aotinductor/model/model.so": b"\x7fELF"})  # an AOTInductor package's library
    refused(native, "native code")
    with (zipfile.ZipFile(tmp_path / "squeezed.pt2", "w", zipfile.ZIP_DEFLATED) as out,
          zipfile.ZipFile(program) as src):
        for member in src.infolist():
            out.writestr(member.filename, src.read(member))
    refused(tmp_path / "squeezed.pt2", "compressed")
    twice = rewrite(program, tmp_path / "twice.pt2", lambda rel, data: data)
    with zipfile.ZipFile(twice, "a") as out, pytest.warns(UserWarning, match="Duplicate name"):
        out.writestr(out.namelist()[0], b"{}")
    refused(twice, "two members of the same name")
    headless = rewrite(program, tmp_path / "headless.pt2",
                       lambda rel, data: None if rel == "models/model.json" else data)
    refused(headless, "has no")
