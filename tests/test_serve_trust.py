"""What a pod serves is what was published (issue 25, must-show 1) and native code runs only from trusted
bytes (issue 27 #1), against the real SeaweedFS, a real FUSE mount of it (s3fs, as the Mountpoint CSI
driver presents a version to a pod) and a directory store.

- A weight object overwritten in the bucket with other bytes of the same size: the init container's own
  command from `fusedspec k8s` (through the S3 API: the store's checksums, no byte read) exits 1 naming the
  file; `fusedspec serve` of the mount and of the s3:// version exits 1 naming it, never listening.
- A crafted AOTInductor package whose shared library writes a marker file when it is loaded, in a version
  published --unvalidated and unsigned: `serve` and `validate`, from a directory store and from S3, refuse
  it before loading, and the marker does not exist. Signed and served with the verify key, the same package
  is loaded (the marker appears): the payload is real, and trust is what kept it out.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fusedspec.compile.cpu import native
from fusedspec.compile.cpu.layout import weights_file
from fusedspec.core.settings import Settings, load_settings
from fusedspec.flows.cli import main
from fusedspec.registry.publish import publish_artifact
from fusedspec.serve.source import load_served, open_version
from tests.fixtures.servers import free_port

pytestmark = pytest.mark.slow  # the tiny serve build, and `serve`/`validate` loading it several times
WEIGHTS = "weights/tp0_sharded_checkpoint.safetensors"
PAYLOAD = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void payload(void) {
    const char *path = getenv("FUSEDSPEC_TEST_MARKER");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f) { fputs("native code ran\n", f); fclose(f); }
}
"""


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seaweed) -> Path:  # noqa: ANN001
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_REGION", seaweed.region)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("FUSEDSPEC_VERIFY_KEY", raising=False)
    return tmp_path / "work"


def test_a_same_size_tampered_weight_object_is_refused_by_the_init_check_and_by_serve(
        seaweed, s3_bucket: str, s3_settings: Settings, serve_artifact: Path, s3_mount,  # noqa: ANN001
        work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        api_calls: list[tuple[str, str]]) -> None:
    result = publish_artifact(serve_artifact, f"s3://{s3_bucket}/serving", s3_settings, unvalidated=True)
    # Before the tampering: a synced copy damaged in the cache since is found as it loads, and fetched again.
    settings = load_settings()
    loaded = load_served(open_version(result.version_uri, settings), settings)
    assert loaded.trust.unverified() == [] and sorted(loaded.trust.verified) == sorted(loaded.trust.hashes)
    cached = settings.cache_dir / "serve" / result.key / result.attempt / WEIGHTS
    cached.write_bytes(b"\0" * cached.stat().st_size)
    reused = open_version(result.version_uri, settings)
    assert reused.reused and load_served(reused, settings).runner.lines == 4
    assert cached.read_bytes()[:8] != b"\0" * 8  # the good bytes again
    client = seaweed.client()
    key = f"{result.version_uri[len(f's3://{s3_bucket}/'):]}/{result.attempt}/{WEIGHTS}"
    original = client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
    middle = len(original) // 2
    tampered = (original[:middle] + bytes(b ^ 0xFF for b in original[middle:middle + 64])
                + original[middle + 64:])
    client.put_object(Bucket=s3_bucket, Key=key, Body=tampered)
    assert client.head_object(Bucket=s3_bucket, Key=key)["ContentLength"] == len(original)

    assert main(["k8s", result.version_uri, "--s3-endpoint", seaweed.endpoint, "--mount-root",
                 str(tmp_path / "mdl")]) == 0
    documents = {d["kind"]: d for d in yaml.safe_load_all(capsys.readouterr().out)}
    pod = documents["Deployment"]["spec"]["template"]["spec"]
    [init], [serve] = pod["initContainers"], pod["containers"]
    mount = Path(serve["volumeMounts"][0]["mountPath"])
    prefix = next(o for o in documents["PersistentVolume"]["spec"]["mountOptions"] if o.startswith("prefix "))
    s3_mount(s3_bucket, prefix[len("prefix "):], mount)
    assert (mount / result.attempt / WEIGHTS).stat().st_size == len(original)  # the mount shows sizes only

    # The init container's command, as the YAML has it: exit 1 naming the file, and not one byte of a
    # version file read (HEAD and listings only: no full re-hash on a pod's start).
    api_calls.clear()
    assert init["command"][:2] == ["fusedspec", "verify"] and "--quick" in init["command"]
    assert main(init["command"][1:]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["bytes_checked"] == 0
    assert any(problem.startswith(f"{WEIGHTS}: ") for problem in report["problems"]), report["problems"]
    reads = [k for operation, k in api_calls if operation == "GetObject" and not k.endswith("manifest.json")]
    assert reads == [] and any(operation == "ListObjectsV2" for operation, _ in api_calls)

    # The serving container's command on the mount: hashed as it loads, refused naming the file.
    argv = [a if a != "8000" else str(free_port()) for a in serve["command"][1:]]
    argv[argv.index("--host") + 1] = "127.0.0.1"
    assert main(argv) == 1
    out = capsys.readouterr()
    assert f"{WEIGHTS}: sha256 " in out.err and "differs from the manifest's" in out.err, out.err
    assert "starting" not in out.out  # never listened

    # serve s3://: refused by the store's own checks before anything is downloaded.
    api_calls.clear()
    assert main(["serve", result.version_uri, "--port", str(free_port())]) == 1
    err = capsys.readouterr().err
    assert f"{WEIGHTS}: changed since it was published" in err, err
    assert not any(operation == "GetObject" and k.endswith(WEIGHTS) for operation, k in api_calls)


@pytest.fixture
def crafted(serve_artifact: Path, tmp_path: Path) -> Path:
    """The serve build with its fused step replaced by an AOTInductor package whose shared library is a
    payload that writes $FUSEDSPEC_TEST_MARKER when loaded (what issue 27 crafted); build.json records the
    package and this host's ISA, so nothing but trust stands between the package and the loader."""
    compiler = shutil.which("gcc") or shutil.which("g++")
    if compiler is None:
        pytest.fail("a C compiler is needed to build the payload (AOTInductor needs one anyway)")
    (tmp_path / "payload.c").write_text(PAYLOAD)
    subprocess.run([compiler, "-x", "c", "-shared", "-fPIC", "-o", str(tmp_path / "payload.so"),
                    str(tmp_path / "payload.c")], check=True, capture_output=True, timeout=120)
    artifact = tmp_path / "crafted"
    shutil.copytree(serve_artifact, artifact)
    import zipfile

    package = artifact / "programs" / "fused_step.aoti.pt2"
    with zipfile.ZipFile(package, "w", zipfile.ZIP_STORED) as archive:
        for name, data in (("archive_format", b"pt2"), ("archive_version", b"0"), ("byteorder", b"little"),
                           (".data/version", b"1"), (".data/serialization_id", b"0" * 40),
                           ("data/aotinductor/model/x.wrapper_metadata.json", b'{"AOTI_DEVICE_KEY": "cpu"}'),
                           ("data/aotinductor/model/x.wrapper.so", (tmp_path / "payload.so").read_bytes())):
            archive.writestr(f"fused_step/{name}", data)
    (artifact / "programs" / "fused_step.pt2").unlink()
    described = json.loads((artifact / "build.json").read_text())
    described["cpu"]["programs"]["fused_step"] = "programs/fused_step.aoti.pt2"
    # the build's program files, as compile lists them
    described["programs"] = sorted({*described["programs"], "programs/fused_step.aoti.pt2"}
                                   - {"programs/fused_step.pt2"})
    described["options"].update(aot_inductor=True, cpu_isa=native.build_isa())
    (artifact / "build.json").write_text(json.dumps(described))
    return artifact


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "payload-ran"
    monkeypatch.setenv("FUSEDSPEC_TEST_MARKER", str(path))
    yield path


def test_native_code_of_an_unsigned_version_never_runs_in_serve_or_validate(
        crafted: Path, marker: Path, seaweed, s3_bucket: str, s3_settings: Settings, s3_mount,  # noqa: ANN001
        work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    local = publish_artifact(crafted, str(tmp_path / "store"), Settings(work_dir=work), unvalidated=True)
    remote = publish_artifact(crafted, f"s3://{s3_bucket}/crafted", s3_settings, unvalidated=True)
    mounted = s3_mount(s3_bucket, remote.version_uri[len(f"s3://{s3_bucket}/"):],
                       tmp_path / "mdl" / remote.key)

    def refused(argv: list[str]) -> None:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "programs/fused_step.aoti.pt2 is native code" in err and "refused before loading" in err, err
        assert "FUSEDSPEC_VERIFY_KEY" in err and "unsigned" in err, err
        assert not marker.exists(), f"the payload ran: {argv}"

    refused(["serve", local.version_uri, "--port", str(free_port())])
    refused(["serve", remote.version_uri, "--port", str(free_port())])
    validate = ["--no-advice", "--max-new-tokens", "2", "--variants", "raw"]
    refused(["validate", str(Path(local.version_uri) / local.attempt), *validate])
    refused(["validate", str(mounted / remote.attempt), *validate])
    # the pods' YAML for it is refused too: every pod would refuse to load it (a cpu AOTInductor version)
    assert main(["k8s", remote.version_uri, "--s3-endpoint", "http://s3.example:8333"]) != 0
    err = capsys.readouterr().err
    assert "holds native code (programs/" in err and "no verify key is configured" in err, err

    # Signed, and read with the verify key: the same bytes are trusted and loaded; the payload runs.
    assert main(["keygen", str(tmp_path / "keys")]) == 0
    capsys.readouterr()
    signed = publish_artifact(crafted, str(tmp_path / "signed-store"),
                              Settings(work_dir=work,
                                       signing_key=(tmp_path / "keys" / "signing-key.pem").read_text()),
                              unvalidated=True)
    import os

    os.environ["FUSEDSPEC_VERIFY_KEY_FILE"] = str(tmp_path / "keys" / "verify-key.pem")
    try:
        # it is not a real program
        assert main(["serve", signed.version_uri, "--port", str(free_port())]) != 0
    finally:
        del os.environ["FUSEDSPEC_VERIFY_KEY_FILE"]
    assert marker.exists(), capsys.readouterr().err
    assert weights_file(crafted, 0).is_file()
