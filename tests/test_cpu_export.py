"""The export guard and the loader's errors (compile/cpu/export.py): a program holding tensor constants
is exported again, then refused before anything is saved; a program file torch cannot load is an
ArtifactError naming the file; the loader's kept schema hints (a speed-up) rebuild the same program as
torch's own load and leave torch's deserializer as they found it, also when the load fails; the save
that skips torch's discarded canonical form (a speed-up) writes the bytes torch's own save writes; a
program names no path of the host that built it; the heap is collected after the exports of large
weights only."""

from __future__ import annotations

import io
import logging
import shutil
import typing
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import sympy
import torch
from torch import nn
from torch._export.serde import serialize

from fusedspec.compile.backend import get_backend
from fusedspec.compile.cpu.export import load_program, save_program, without_constants
from fusedspec.compile.trust import LoadTrust
from fusedspec.core.errors import ArtifactError, CompileError


class HoldsAConstant(nn.Module):
    """A tensor attribute that is neither parameter nor buffer: export lifts it as a constant, the
    fault our programs must never have."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = torch.ones(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offset


class AddsOne(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def _export(module: nn.Module) -> torch.export.ExportedProgram:
    return torch.export.export(module, (torch.zeros(3),), strict=True)


def test_a_program_that_keeps_lifting_constants_is_refused_naming_them() -> None:
    with pytest.raises(CompileError,
                       match=r"program demo: .*lifted tensor constants twice \(offset \(3,\)\)"):
        without_constants("demo", lambda: _export(HoldsAConstant()))


def test_one_faulty_trace_is_exported_again(caplog: pytest.LogCaptureFixture) -> None:
    traces = iter([HoldsAConstant(), AddsOne()])  # the fault shows in the first trace only
    with caplog.at_level(logging.WARNING, logger="fusedspec.compile.cpu.export"):
        program = without_constants("demo", lambda: _export(next(traces)))
    assert not program.constants
    assert torch.equal(program.module()(torch.zeros(3)), torch.ones(3))
    assert "program demo: export lifted tensor constants (offset (3,)); exporting it again" in caplog.text


def test_a_truncated_program_is_refused_before_torch_reads_it(
        build_tiny: Callable[..., Path], tmp_path: Path) -> None:
    artifact = tmp_path / "artifact"
    shutil.copytree(build_tiny(tp=1, k=2, batch=1, draft="cut"), artifact)
    program = artifact / "programs" / "fused_step.pt2"
    program.write_bytes(program.read_bytes()[: program.stat().st_size // 2])  # a truncated copy
    with pytest.raises(ArtifactError,
                       match=rf"{program}: refused before loading: not a readable zip archive"):
        load_program(artifact, "programs/fused_step.pt2", LoadTrust(str(artifact)), None)
    with pytest.raises(ArtifactError, match="fused_step.pt2: refused before loading"):
        get_backend("cpu").load(artifact)


def test_a_program_torch_cannot_load_is_an_artifact_error_naming_it(
        build_tiny: Callable[..., Path], tmp_path: Path) -> None:
    """An archive of the allowed shape whose graph is not one torch can rebuild (`{}`): the archive check
    passes it, torch fails, and the error names the file and the fix."""
    artifact = tmp_path / "artifact"
    shutil.copytree(build_tiny(tp=1, k=2, batch=1, draft="cut"), artifact)
    program = artifact / "programs" / "fused_step.pt2"
    with zipfile.ZipFile(program) as original:
        members = [(info, original.read(info)) for info in original.infolist()]
    with zipfile.ZipFile(program, "w", zipfile.ZIP_STORED) as rewritten:
        for info, data in members:
            rewritten.writestr(info, b"{}" if info.filename.endswith("models/model.json") else data)
    with pytest.raises(ArtifactError, match=rf"{program}: torch .* cannot load this program .*"
                                            rf"delete the artifact directory {artifact} and build it again"):
        load_program(artifact, "programs/fused_step.pt2", LoadTrust(str(artifact)), None)
    assert serialize.typing is typing and serialize.sympy is sympy, "a failed load gives torch its own back"


def test_the_loader_rebuilds_the_program_torch_itself_loads(build_tiny: Callable[..., Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The same code and the same symbolic sizes on every node as torch's own load; the context program's
    size expressions (one per node) are each parsed once."""
    from fusedspec.compile.cpu import export
    from fusedspec.core.kept import KeptByContent

    monkeypatch.setattr(export, "_DESERIALIZED", KeptByContent(8))  # no program kept by an earlier test
    parsed: list[str] = []
    sympify = sympy.sympify

    def counted(a: object, *args: object, **kwargs: object) -> object:
        if isinstance(a, str):  # a parse (sympy objects are passed through too)
            parsed.append(a)
        return sympify(a, *args, **kwargs)

    monkeypatch.setattr(sympy, "sympify", counted)
    artifact = build_tiny(tp=1, k=2, batch=1, draft="cut")
    for rel in ("programs/context_encoding.pt2", "programs/fused_step.pt2"):
        parsed.clear()
        ours = load_program(artifact, rel, LoadTrust(str(artifact)), None)
        our_parses = len(parsed)
        assert serialize.typing is typing and serialize.sympy is sympy, "the load gives torch its own back"
        parsed.clear()
        torchs = torch.export.load(io.BytesIO((artifact / rel).read_bytes())).module()
        assert ours.code == torchs.code, rel
        assert [str(n.meta.get("val")) for n in ours.graph.nodes] == \
            [str(n.meta.get("val")) for n in torchs.graph.nodes], rel
        if rel.endswith("context_encoding.pt2"):  # its context length is symbolic
            assert 0 < our_parses * 10 < len(parsed), (our_parses, len(parsed))


class TwoBranches(nn.Module):
    """Nodes whose canonical names (_0, _1, ...) differ from the serialized ones: a save that used the
    canonical form would write other bytes."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = x.sin(), y.cos()
        return (a + b).relu(), b * 2


def test_a_saved_program_is_the_bytes_torchs_own_save_writes(tmp_path: Path) -> None:
    program = torch.export.export(TwoBranches(), (torch.zeros(3), torch.zeros(3)), strict=False)
    torchs_check, made = serialize.canonicalize, []

    def watched(*args: object, **kwargs: object) -> object:
        made.append(args)
        return torchs_check(*args, **kwargs)

    serialize.canonicalize = watched
    try:
        ours = save_program(program, tmp_path, "two", aot_inductor=False).read_bytes()
        assert made == [], "the save still made torch's canonical form (a torch that moved it?)"
        assert serialize.canonicalize is watched, "the save must give torch its check back"
    finally:
        serialize.canonicalize = torchs_check
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    assert ours == buffer.getvalue()


def test_a_program_names_no_path_of_the_host_that_built_it(build_tiny: Callable[..., Path]) -> None:
    """Programs carry no stack traces of our code: they would name where fusedspec is installed on the build
    host in every artifact, and make the same graph's programs differ from one install to another."""
    import fusedspec.compile.cpu.model as model

    source_dir = str(Path(model.__file__).resolve().parent)
    artifact = build_tiny(tp=1, k=2, batch=1, draft="cut")
    for program in sorted((artifact / "programs").glob("*.pt2")):
        with zipfile.ZipFile(program) as archive:
            graph = next(archive.read(n) for n in archive.namelist() if n.endswith("models/model.json"))
        assert source_dir.encode() not in graph, program.name
    assert torch.fx.config.do_not_emit_stack_traces is False, "the export must give torch its setting back"


def test_a_build_releases_memory_by_the_bytes_of_all_its_weights(tmp_path: Path, tiny_target: Path,
                                                                  tiny_drafts: dict[str, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """What decides the release is the size of everything the programs take as weights: both models, in the
    build's dtype (a count that fell short would let a large build skip it); at TP 1, its weight file."""
    from safetensors import safe_open

    from fusedspec.compile.build import build_artifact
    from fusedspec.compile.cpu import backend
    from fusedspec.compile.spec import BuildSpec
    from fusedspec.core.settings import Settings
    from tests.fixtures.cpu_artifacts import local_model

    asked: list[int | None] = []
    monkeypatch.setattr(backend, "release_freed_memory", asked.append)  # records what the build passes
    settings = Settings(work_dir=tmp_path / "work")
    artifact = build_artifact(BuildSpec(1, 32, 2, 1, "float32"), local_model(tiny_target, settings),
                              local_model(tiny_drafts["cut"], settings), settings).path
    weights = 0
    for shard in sorted((artifact / "weights").glob("*.safetensors")):
        with safe_open(shard, "pt") as tensors:
            weights += sum(tensors.get_tensor(n).nbytes for n in tensors.keys())  # noqa: SIM118
    assert asked == [weights, weights]  # after each of the two programs
