"""`fusedspec run` refuses bad input before Prefect starts or anything is written: exit 2, every
problem in one message."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_bad_run_config_exits_2_naming_every_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str],
                                                      tiny_target: Path) -> None:
    from fusedspec.flows.cli import main

    work = tmp_path / "work"
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(work))
    config = tmp_path / "run.yaml"
    config.write_text(f"target: {tiny_target}\ndraft: ./no-such-draft\n"
                      "matrix: {tp_degree: [3], seq_len: [64], speculation_length: [1, 70]}\n")
    assert main(["run", str(config)]) == 2
    err = capsys.readouterr().err
    for words in ("no-such-draft", "matrix.speculation_length[0]: 1 is less than the minimum of 2",
                  "matrix.speculation_length[1]: 70 is greater than the maximum of 32"):
        assert words in err, err
    assert not (work / "builds").exists() and not (work / "models").exists()


def test_unknown_key_in_run_config_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fusedspec.flows.cli import main

    config = tmp_path / "run.yaml"
    config.write_text("target: a\ndraft: b\n"
                      "matrix: {tp_degree: [1], seq_len: [64], speculation_length: [2]}\n"
                      "publish: {uri: ./x, bucket: y}\n")
    assert main(["run", str(config)]) == 2
    assert "publish: Additional properties are not allowed ('bucket' was unexpected)" in \
        capsys.readouterr().err


def test_a_temporary_server_that_never_starts_is_named_with_the_setting_to_raise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mock of the one fault: Prefect's own words when its temporary server did not answer in time (prefect
    server/api/server.py), raised inside the block. A host too busy to start it in 180 s is not one we can
    make on demand; the demo on a loaded host (tests/test_demo.py) is the run that must not end here."""
    from fusedspec.core.errors import FusedspecError
    from fusedspec.flows.commands.run import EPHEMERAL_STARTUP_SECONDS, prefect_for_this_run

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with pytest.raises(FusedspecError) as refused, prefect_for_this_run(tmp_path / "home"):
        raise RuntimeError("Timed out while attempting to connect to ephemeral Prefect API server.")
    message = str(refused.value)
    assert f"did not start within {EPHEMERAL_STARTUP_SECONDS} s" in message, message
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in message and "PREFECT_API_URL" in message
    with pytest.raises(RuntimeError, match="another fault"), prefect_for_this_run(tmp_path / "home"):
        raise RuntimeError("another fault")  # anything else keeps its own words
