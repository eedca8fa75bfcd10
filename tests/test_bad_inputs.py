"""Every bad input a new user might give, refused early and plainly (issue 12, must show 1 to 4).

CASES is one table: a command line, the exit code, the words its message must hold (the offending file
or field), and how to make the bad input. Every case runs in this process through `flows.cli.main`,
twice: as typed and with --json (where the command takes it). Each run must
- end with the table's exit code: 2 for bad input, 1 only where a check ran and failed (a damaged
  version found by `verify` or `ls`);
- name the offending file or field in its message, and print no traceback;
- with --json, print exactly one JSON document on stdout, with `"ok": false` and the exit code;
- write nothing: every file under the test's root (work dir, directory stores, the inputs themselves)
  and every object of the S3 bucket are the same after as before. The top-level handler's log file is
  written only for an internal error, which is a failure here.

The models are the session's tiny Qwen3 pair; each bad model is a directory of hard links to the good
one's files with one file changed. The work dir's hash cache is warmed by one good plan first, as a
user's would be, so a refusal that hashed a checkpoint again would show as a write.

The deployment path (issue 24, must show 4): each case whose mistake is in the run config's schema is also
sent to a compile-fused deployment on a real Prefect server, which refuses it when the run is created, in
the words `fusedspec plan` used (test_a_deployment_refuses_at_creation_in_the_words_of_plan).

Must show 2 is the case `plan-bad-store-and-prompts` (both problems named in one run); must show 4 the
TIMED cases (each refusal under a second: a bound, not a benchmark); must show 3 is also asserted on its
own below (no build or staging dir after NaN or truncated weights).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fusedspec.flows.cli import main

# ---- the world the cases run in ------------------------------------------------------------------------


@dataclass
class World:
    root: Path  # everything a case may touch lives under here (and in the S3 bucket)
    target: Path
    draft: Path
    artifact: Path  # a complete, validated artifact (made by hand: publishing never parses weights)
    store: Path  # a directory store holding that artifact's version
    version: Path  # the version directory in `store`
    bucket: str | None = None  # an S3 bucket holding a Neuron-shaped version (cases marked s3)
    s3_version: str = ""
    s3_client: Any = None

    @property
    def work(self) -> Path:
        return self.root / "work"

    def good_config(self) -> dict[str, Any]:
        return {"target": str(self.target), "draft": str(self.draft), "backend": "cpu",
                "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3], "batch_size": [1],
                           "dtype": ["float32"]},
                "compile": {"aot_inductor": False},  # exported programs: no AOTInductor compile time in tests
                "publish": {"uri": str(self.store)}}

    def names(self, case_dir: Path) -> dict[str, str]:
        return {"case": str(case_dir), "target": str(self.target), "draft": str(self.draft),
                "artifact": str(self.artifact), "store": str(self.store), "version": str(self.version),
                "work": str(self.work), "bucket": self.bucket or "", "s3version": self.s3_version}


Setup = Callable[[Path, World], None]


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # {case}, {target}, {store}, ... are filled from World.names
    words: tuple[str, ...]  # the message holds each (the offending file or field); same placeholders
    code: int = 2
    setup: Setup | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    json: bool = True  # the command takes --json
    s3: bool = False  # needs the SeaweedFS server and the world's bucket
    absent: tuple[str, ...] = ()  # text that must appear nowhere in the output (a secret)
    # Paths under the root a refusal may leave, each with its reason in the case's comment: "dir/" allows
    # what is under dir, anything else that exact path. Only compiles that reach the build have any.
    allowed: tuple[str, ...] = ()


# ---- making bad inputs ---------------------------------------------------------------------------------


def _deep_update(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_update(out[key], value)
        else:
            out[key] = value
    return out


def run_config(name: str = "run.yaml", **changes: Any) -> Setup:
    """A run config: the world's good one with `changes` merged in (a value of None removes nothing:
    it is written as null)."""
    def setup(d: Path, w: World) -> None:
        (d / name).write_text(yaml.safe_dump(_deep_update(w.good_config(), changes)))
    setup.changes = changes  # type: ignore[attr-defined]  # the deployment path sends them as parameters
    return setup


def drafts(*names: str, **changes: Any) -> Setup:
    """A run config of several drafts: "good" is the world's draft, "good/" the same spelled otherwise,
    "target" the world's target, any other name a directory of the case."""
    def setup(d: Path, w: World) -> None:
        config = _deep_update(w.good_config(), changes)
        given = {"good": str(w.draft), "good/": f"{w.draft}/.", "target": str(w.target)}
        (d / "run.yaml").write_text(yaml.safe_dump({**config, "draft": [given.get(n, n) for n in names]}))
    return setup


def text_file(name: str, content: str | bytes) -> Setup:
    def setup(d: Path, w: World) -> None:
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return setup


def directory(name: str, mode: int, *, linked_as: str | None = None) -> Setup:
    """A directory `name` of `mode` (set past the umask), and optionally a symlink `linked_as` to it."""
    def setup(d: Path, w: World) -> None:
        (d / name).mkdir()
        (d / name).chmod(mode)
        if linked_as is not None:
            (d / linked_as).symlink_to(d / name)
    return setup


def both(*setups: Setup) -> Setup:
    def setup(d: Path, w: World) -> None:
        for step in setups:
            step(d, w)
    return setup


def copied_model(d: Path, source: Path, name: str = "model") -> Path:
    """A copy of model dir `source` (a tiny model: copied in milliseconds). Not hard links: a new link moves
    the ctime of the world's own files, which the file-hash cache keys on, so the next case's refusal would
    hash them anew and write the cache the case asserts it leaves alone."""
    out = d / name
    out.mkdir()
    for path in source.iterdir():
        if path.is_file():
            shutil.copy2(path, out / path.name)
    return out


def model_config(**changes: Any) -> Setup:
    """d/model: the good target with these config.json fields changed, and d/run.yaml using it as target."""
    def setup(d: Path, w: World) -> None:
        model = copied_model(d, w.target)
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, **changes}))
        run_config(target=str(model))(d, w)
    return setup


def model_file(name: str, content: bytes | Callable[[bytes], bytes]) -> Setup:
    """d/model: the good target with file `name` replaced, and d/run.yaml using it as target."""
    def setup(d: Path, w: World) -> None:
        model = copied_model(d, w.target)
        old = (model / name).read_bytes() if (model / name).exists() else b""
        (model / name).unlink(missing_ok=True)
        (model / name).write_bytes(content(old) if callable(content) else content)
        run_config(target=str(model))(d, w)
    return setup


def draft_tokenizer_config(**changes: Any) -> Setup:
    """d/draft: the good draft with these tokenizer_config.json fields changed, and d/run.yaml using it."""
    def setup(d: Path, w: World) -> None:
        draft = copied_model(d, w.draft, "draft")
        settings = json.loads((draft / "tokenizer_config.json").read_text())
        (draft / "tokenizer_config.json").write_text(json.dumps({**settings, **changes}))
        run_config(draft=str(draft))(d, w)
    return setup


def nan_weights(original: bytes) -> bytes:
    """The same safetensors file with one NaN in the final norm's weight (header untouched)."""
    size = struct.unpack("<Q", original[:8])[0]
    header = json.loads(original[8:8 + size])
    name = next(n for n in header if n.endswith("norm.weight") and "layers" not in n)
    start = 8 + size + header[name]["data_offsets"][0]
    data = bytearray(original)
    data[start:start + 4] = struct.pack("<f", float("nan"))
    return bytes(data)


def truncated_to(nbytes: int) -> Callable[[bytes], bytes]:
    return lambda original: original[:nbytes]


def artifact_with(name: str, content: bytes | str | None) -> Setup:
    """d/artifact: a copy of the world's good artifact with `name` replaced (None: removed)."""
    def setup(d: Path, w: World) -> None:
        shutil.copytree(w.artifact, d / "artifact")
        path = d / "artifact" / name
        path.unlink(missing_ok=True)
        if content is not None:
            path.write_bytes(content.encode() if isinstance(content, str) else content)
    return setup


def build_json(change: Callable[[dict[str, Any]], Any]) -> Setup:
    """d/artifact with build.json replaced by `change(the good build.json)`."""
    def setup(d: Path, w: World) -> None:
        good = json.loads((w.artifact / "build.json").read_text())
        artifact_with("build.json", json.dumps(change(good)))(d, w)
    return setup


def store_manifest(change: Callable[[dict[str, Any]], Any]) -> Setup:
    """d/store: a copy of the world's store whose version's manifest is `change(the good manifest)`."""
    def setup(d: Path, w: World) -> None:
        shutil.copytree(w.store, d / "store")
        path = d / "store" / w.version.relative_to(w.store) / "manifest.json"
        good = json.loads(path.read_text())
        path.write_text(json.dumps(change(good)))
    return setup


def store_latest(content: str) -> Setup:
    def setup(d: Path, w: World) -> None:
        shutil.copytree(w.store, d / "store")
        (d / "store" / w.version.relative_to(w.store).parent / "LATEST").write_text(content)
    return setup


def s3_copy(d: Path, w: World) -> str:
    """The world's S3 store copied under s3://BUCKET/<case id>/ (before the case runs, so the copy is part
    of the 'before' listing); the copied version's key prefix."""
    client, prefix = w.s3_client, d.name
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=w.bucket, Prefix="good/"):
        for item in page.get("Contents", []):
            client.copy_object(Bucket=w.bucket, Key=f"{prefix}/{item['Key']}",
                               CopySource={"Bucket": w.bucket, "Key": item["Key"]})
    return f"{prefix}/{w.s3_version.removeprefix(f's3://{w.bucket}/')}"


def s3_manifest(change: Callable[[dict[str, Any]], Any]) -> Setup:
    """s3://BUCKET/<case id>/: a copy of the world's S3 store whose version's manifest is `change`d."""
    def setup(d: Path, w: World) -> None:
        key = f"{s3_copy(d, w)}/manifest.json"
        manifest = json.loads(w.s3_client.get_object(Bucket=w.bucket, Key=key)["Body"].read())
        w.s3_client.put_object(Bucket=w.bucket, Key=key, Body=json.dumps(change(manifest)).encode())
    return setup


def s3_latest(content: str) -> Setup:
    def setup(d: Path, w: World) -> None:
        config = s3_copy(d, w).rsplit("/", 1)[0]
        w.s3_client.put_object(Bucket=w.bucket, Key=f"{config}/LATEST", Body=content.encode())
    return setup


def without(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda doc: {k: v for k, v in doc.items() if k != key}


def first_file(value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A manifest whose first file entry is `value` (a callable gets the entry)."""
    def change(doc: dict[str, Any]) -> dict[str, Any]:
        name = sorted(doc["files"])[0]
        entry = value(doc["files"][name]) if callable(value) else value
        return {**doc, "files": {**doc["files"], name: entry}}
    return change


def renamed_file(new: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(doc: dict[str, Any]) -> dict[str, Any]:
        files = dict(doc["files"])
        files[new] = files.pop(sorted(files)[0])
        return {**doc, "files": files}
    return change


def keys_in(d: Path, w: World) -> None:
    (d / "keys").mkdir()
    (d / "keys" / "signing-key.pem").write_text("an existing key\n")


BINARY = bytes(range(256)) * 4


def alias_bomb(levels: int = 9) -> str:
    """A YAML flow list of a few hundred bytes that stands for 9**levels strings (each level is nine
    aliases of the one before): parsed in a moment, but anything that walks or prints it never ends."""
    names = "abcdefghijklmnopqrstuvwxyz"
    parts = ['&a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    parts += [f"&{names[i]} [{', '.join([f'*{names[i - 1]}'] * 9)}]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"
SECRET = "s3cr3t-in-the-url"

# ---- the corpus ----------------------------------------------------------------------------------------

CASES: list[Case] = [
    # usage
    Case("usage-unknown-command", ("frobnicate",), ("frobnicate",)),
    Case("usage-plan-no-config", ("plan",), ("CONFIG",)),
    Case("usage-compile-unknown-flag", ("compile", "{case}/run.yaml", "--fast"), ("--fast",)),
    Case("usage-k8s-replicas-not-int", ("k8s", "s3://b/x", "--replicas", "two"), ("--replicas",), json=False),
    # the run config file itself
    Case("plan-config-missing", ("plan", "{case}/nope.yaml"), ("{case}/nope.yaml", "no such file")),
    Case("plan-yaml-is-a-list", ("plan", "{case}/run.yaml"), ("{case}/run.yaml", "mapping"),
         setup=text_file("run.yaml", "- target\n- draft\n")),
    Case("plan-yaml-is-a-number", ("plan", "{case}/run.yaml"), ("{case}/run.yaml", "mapping"),
         setup=text_file("run.yaml", "5\n")),
    Case("plan-yaml-broken", ("plan", "{case}/run.yaml"), ("{case}/run.yaml", "YAML"),
         setup=text_file("run.yaml", "target: [unclosed\n")),
    Case("plan-yaml-binary", ("plan", "{case}/run.yaml"), ("{case}/run.yaml",),
         setup=text_file("run.yaml", BINARY)),
    Case("plan-yaml-huge", ("plan", "{case}/run.yaml"), ("{case}/run.yaml", "bytes"),
         setup=text_file("run.yaml", "# " + "x" * (2 << 20) + "\n")),
    Case("plan-yaml-alias-bomb", ("plan", "{case}/run.yaml"), ("{case}/run.yaml", "target"),
         setup=text_file("run.yaml", f"target: {alias_bomb()}\n")),
    Case("plan-unknown-key", ("plan", "{case}/run.yaml"), ("matrixx", "was unexpected"),
         setup=run_config(matrixx={"tp_degree": [1]})),
    Case("plan-matrix-is-a-string", ("plan", "{case}/run.yaml"), ("matrix",), setup=run_config(matrix="big")),
    # the matrix and its bounds
    Case("plan-tp-huge", ("plan", "{case}/run.yaml"), ("tp_degree", "1048576"),
         setup=run_config(matrix={"tp_degree": [1048576]})),
    Case("plan-batch-1e9", ("plan", "{case}/run.yaml"), ("batch_size",),
         setup=run_config(matrix={"batch_size": [1e9]})),
    Case("plan-batch-1e9-text", ("plan", "{case}/run.yaml"), ("batch_size",),
         setup=text_file("run.yaml", "target: /x\ndraft: /y\nmatrix: {tp_degree: [1], seq_len: [64], "
                                     "speculation_length: [3], batch_size: [1e9]}\n")),
    Case("plan-k-is-1", ("plan", "{case}/run.yaml"), ("speculation_length", "k=1"),
         setup=run_config(matrix={"speculation_length": [1]})),
    Case("plan-k-not-below-seq", ("plan", "{case}/run.yaml"), ("speculation_length", "seq_len"),
         setup=run_config(matrix={"seq_len": [4], "speculation_length": [5]})),
    Case("plan-seq-len-over-model", ("plan", "{case}/run.yaml"), ("seq_len", "max_position_embeddings"),
         setup=run_config(matrix={"seq_len": [4096]})),
    Case("plan-tp-does-not-divide-heads", ("plan", "{case}/run.yaml"), ("tp_degree=3",),
         setup=run_config(matrix={"tp_degree": [3]})),
    Case("plan-dtype-int8", ("plan", "{case}/run.yaml"), ("dtype", "int8"),
         setup=run_config(matrix={"dtype": ["int8"]})),
    Case("plan-empty-list", ("plan", "{case}/run.yaml"), ("tp_degree",),
         setup=run_config(matrix={"tp_degree": []})),
    Case("plan-repeated-value", ("plan", "{case}/run.yaml"), ("seq_len", "non-unique"),
         setup=run_config(matrix={"seq_len": [64, 64]})),
    Case("plan-repeated-k", ("plan", "{case}/run.yaml"),
         ("matrix.speculation_length", "[3, 3] has non-unique"),
         setup=run_config(matrix={"speculation_length": [3, 3]})),
    Case("plan-backend-unknown", ("plan", "{case}/run.yaml"), ("backend", "tpu"),
         setup=run_config(backend="tpu")),
    Case("plan-backend-neuronx", ("plan", "{case}/run.yaml"), ("backend", "'neuronx' is not one of"),
         setup=run_config(backend="neuronx")),
    Case("plan-dtype-alias-and-int8", ("plan", "{case}/run.yaml"), ("matrix.dtype[1]", "'int8'"),
         setup=run_config(matrix={"dtype": ["bf16", "int8"]})),  # the alias is no mistake: only int8 is named
    # schema mistakes and the models' at once (issue 24: 2 of these 4 were named)
    Case("plan-schema-and-model-mistakes", ("plan", "{case}/run.yaml"),
         ("matrix.speculation_length[0]", "matrix.batch_size[0]", "tp_degree=3 does not fit",
          "seq_len=100000 exceeds"),
         setup=run_config(matrix={"tp_degree": [3], "seq_len": [100000], "speculation_length": [1],
                                  "batch_size": [0]})),
    Case("plan-max-new-tokens-0", ("plan", "{case}/run.yaml"), ("max_new_tokens",),
         setup=run_config(validation={"max_new_tokens": 0})),
    # each draft's own cost ratio (issue 23): a list is one number per draft
    # NaN passes the schema's bounds (every comparison is false); pydantic's words for it were
    # "validation.cost_ratio.constrained-float=nan: input should be less than or equal to 10; ..."
    Case("plan-cost-ratio-nan", ("plan", "{case}/run.yaml"), ("validation.cost_ratio: nan is not a number",),
         setup=run_config(validation={"cost_ratio": float("nan")})),
    Case("plan-cost-ratios-nan", ("plan", "{case}/run.yaml"),
         ("validation.cost_ratio[1]: nan is not a number",),
         setup=drafts("good", "good-too", validation={"cost_ratio": [0.5, float("nan")]})),
    Case("plan-cost-ratios-more-than-drafts", ("plan", "{case}/run.yaml"),
         ("validation.cost_ratio: 2 numbers for 1 draft", "one per draft"),
         setup=run_config(validation={"cost_ratio": [0.1, 0.2]})),
    Case("plan-cost-ratios-fewer-than-drafts", ("plan", "{case}/run.yaml"),
         ("validation.cost_ratio: 1 number for 2 drafts",), setup=drafts("good", "good-too", validation={
             "cost_ratio": [0.1]})),
    Case("plan-cost-ratios-one-zero", ("plan", "{case}/run.yaml"), ("validation.cost_ratio",),
         setup=run_config(validation={"cost_ratio": [0]})),
    Case("plan-cost-ratios-empty", ("plan", "{case}/run.yaml"), ("validation.cost_ratio",),
         setup=run_config(validation={"cost_ratio": []})),
    # the matrix limited to the advice's top N per class (issue 23)
    Case("plan-top-per-class-0", ("plan", "{case}/run.yaml"), ("matrix.top_per_class", "minimum of 1"),
         setup=run_config(matrix={"top_per_class": 0})),
    Case("plan-top-per-class-a-word", ("plan", "{case}/run.yaml"), ("matrix.top_per_class", "'two'"),
         setup=run_config(matrix={"top_per_class": "two"})),
    Case("plan-top-per-class-a-fraction", ("plan", "{case}/run.yaml"), ("matrix.top_per_class", "1.5"),
         setup=run_config(matrix={"top_per_class": 1.5})),
    Case("plan-top-per-class-huge", ("plan", "{case}/run.yaml"), ("matrix.top_per_class", "maximum of 128"),
         setup=run_config(matrix={"top_per_class": 1000})),
    Case("plan-top-per-class-keeps-all", ("plan", "{case}/run.yaml"),
         ("matrix.top_per_class: 2 keeps every (draft, k) of 1 draft(s) x 2 k", "give at most 1"),
         setup=run_config(matrix={"speculation_length": [3, 4], "top_per_class": 2})),
    Case("compile-top-per-class-keeps-all", ("compile", "{case}/run.yaml"),
         ("matrix.top_per_class: 1 keeps every",), setup=run_config(matrix={"top_per_class": 1})),
    Case("plan-fan-out-mode", ("plan", "{case}/run.yaml"), ("fan_out.mode",),
         setup=run_config(fan_out={"mode": "kubernetes"})),
    # the neuron section (issue 26): each refusal names the field and NxDI's reason; matrix tp 1, seq 64, k 3
    Case("neuron-platform-unknown", ("plan", "{case}/run.yaml"), ("neuron.platform", "trn9", "inf2"),
         setup=run_config(backend="neuron", neuron={"platform": "trn9"})),
    Case("neuron-platform-trn3", ("plan", "{case}/run.yaml"), ("neuron.platform", "trn3 needs NxDI 0.7"),
         setup=run_config(backend="neuron", neuron={"platform": "trn3"})),
    Case("neuron-lnc-3", ("plan", "{case}/run.yaml"), ("neuron.logical_nc_config", "maximum of 2"),
         setup=run_config(backend="neuron", neuron={"logical_nc_config": 3})),
    Case("neuron-lnc-2-on-trn1", ("plan", "{case}/run.yaml"), ("neuron.logical_nc_config=2 needs trn2",),
         setup=run_config(backend="neuron", neuron={"platform": "trn1", "logical_nc_config": 2})),
    Case("neuron-lists-without-bucketing", ("plan", "{case}/run.yaml"),
         ("neuron.context_encoding_buckets", "enable_bucketing true"),
         setup=run_config(backend="neuron",
                          neuron={"enable_bucketing": False, "context_encoding_buckets": [64]})),
    Case("neuron-bucket-over-seq-len", ("plan", "{case}/run.yaml"),
         ("neuron.token_generation_buckets [32, 128]", "exceeds seq_len=64", "NxDI asserts"),
         setup=run_config(backend="neuron", neuron={"token_generation_buckets": [32, 128]})),
    Case("neuron-bucket-short-of-seq-len", ("plan", "{case}/run.yaml"),
         ("neuron.context_encoding_buckets [32]", "the largest must be seq_len=64"),
         setup=run_config(backend="neuron", neuron={"context_encoding_buckets": [32]})),
    Case("neuron-bucket-never-runs", ("plan", "{case}/run.yaml"),
         ("neuron.token_generation_buckets [4]", "would never run at k=3"),
         setup=run_config(backend="neuron", neuron={"token_generation_buckets": [4, 64]})),
    Case("neuron-bucket-repeated", ("plan", "{case}/run.yaml"),
         ("neuron.token_generation_buckets", "repeats"),
         setup=run_config(backend="neuron", neuron={"token_generation_buckets": [32, 32, 64]})),
    Case("neuron-bucket-empty", ("plan", "{case}/run.yaml"), ("neuron.context_encoding_buckets", "non-empty"),
         setup=run_config(backend="neuron", neuron={"context_encoding_buckets": []})),
    Case("neuron-bucket-zero", ("plan", "{case}/run.yaml"),
         ("neuron.token_generation_buckets[0]", "minimum of 1"),
         setup=run_config(backend="neuron", neuron={"token_generation_buckets": [0, 64]})),
    Case("neuron-async-not-bool", ("plan", "{case}/run.yaml"), ("neuron.async_mode", "boolean"),
         setup=run_config(backend="neuron", neuron={"async_mode": "yes"})),
    Case("neuron-unknown-field", ("plan", "{case}/run.yaml"), ("neuron:", "'neuron_config' was unexpected"),
         setup=run_config(backend="neuron", neuron={"neuron_config": {"fused_qkv": True}})),
    Case("neuron-tp-beyond-node", ("plan", "{case}/run.yaml"), ("tp_degree=64", "trn1.32xlarge"),
         setup=run_config(backend="neuron", matrix={"tp_degree": [64]}, neuron={"platform": "trn1"})),
    Case("neuron-seq-len-leaves-no-request", ("plan", "{case}/run.yaml"),
         ("seq_len=4 leaves 1 position(s) after k=3",),
         setup=run_config(backend="neuron", matrix={"seq_len": [4]})),
    Case("neuron-section-on-cpu", ("plan", "{case}/run.yaml"), ("neuron", "applies only to backend: neuron"),
         setup=run_config(neuron={"async_mode": True})),
    Case("neuron-cache-url-relative", ("plan", "{case}/run.yaml"),
         ("neuron.compile_cache_url must be an absolute directory",),
         setup=run_config(backend="neuron", neuron={"compile_cache_url": "neuron-cache"})),
    Case("neuron-cache-url-userinfo", ("plan", "{case}/run.yaml"),
         ("neuron.compile_cache_url carries a user name or password",), absent=(SECRET, "AKIAEXAMPLE"),
         setup=run_config(backend="neuron",
                          neuron={"compile_cache_url": f"s3://AKIAEXAMPLE:{SECRET}@bucket/x"})),
    Case("compile-dry-run-neuron-lnc-2-on-inf2", ("compile", "{case}/run.yaml", "--dry-run"),
         ("neuron.logical_nc_config=2 needs trn2",),
         setup=run_config(backend="neuron", neuron={"platform": "inf2", "logical_nc_config": 2})),
    # the model references and the models' own files
    Case("plan-draft-empty", ("plan", "{case}/run.yaml"), ("draft",), setup=run_config(draft="")),
    Case("plan-draft-blank", ("plan", "{case}/run.yaml"), ("draft", "blank"), setup=run_config(draft="   ")),
    Case("plan-drafts-repeated", ("plan", "{case}/run.yaml"), ("draft", "non-unique"),
         setup=drafts("good", "good")),
    Case("plan-drafts-the-same-twice", ("plan", "{case}/run.yaml"), ("is draft", "again (the same model)"),
         setup=drafts("good", "good/")),
    Case("plan-drafts-the-target", ("plan", "{case}/run.yaml"), ("is the target", "none that is the target"),
         setup=drafts("good", "target")),
    Case("plan-drafts-one-missing", ("plan", "{case}/run.yaml"), ("draft nope", "{case}/nope"),
         setup=drafts("good", "nope")),
    Case("plan-drafts-too-many-builds", ("plan", "{case}/run.yaml"),
         ("2 drafts x 144 builds", "name fewer drafts"), setup=drafts("good", "good-too",
                      matrix={"seq_len": list(range(64, 80)), "speculation_length": list(range(2, 11))})),
    Case("plan-target-no-such-dir", ("plan", "{case}/run.yaml"), ("target", "{case}/nope"),
         setup=run_config(target="nope")),
    Case("plan-target-hub-dotdot", ("plan", "{case}/run.yaml"), ("target", "hf://org/../x"),
         setup=run_config(target="hf://org/../x")),
    Case("plan-target-unknown-scheme", ("plan", "{case}/run.yaml"), ("target", "gs"),
         setup=run_config(target="gs://bucket/model")),
    Case("plan-heads-four", ("plan", "{case}/run.yaml"), ("{case}/model/config.json", "num_attention_heads"),
         setup=model_config(num_attention_heads="four")),
    Case("plan-heads-zero", ("plan", "{case}/run.yaml"), ("{case}/model/config.json", "num_attention_heads"),
         setup=model_config(num_attention_heads=0)),
    Case("plan-kv-heads-negative", ("plan", "{case}/run.yaml"),
         ("{case}/model/config.json", "num_key_value_heads"), setup=model_config(num_key_value_heads=-2)),
    Case("plan-vocab-size-null", ("plan", "{case}/run.yaml"), ("{case}/model/config.json", "vocab_size"),
         setup=model_config(vocab_size=None)),
    Case("plan-rope-theta-infinite", ("plan", "{case}/run.yaml"), ("{case}/model/config.json", "rope_theta"),
         setup=model_config(rope_theta=float("inf"))),
    Case("plan-rope-scaling-a-string", ("plan", "{case}/run.yaml"),
         ("{case}/model/config.json", "rope_scaling"), setup=model_config(rope_scaling="yes")),
    Case("plan-model-type-unknown", ("plan", "{case}/run.yaml"), ("model_type", "mistral"),
         setup=model_config(model_type="mistral")),
    Case("plan-config-json-a-list", ("plan", "{case}/run.yaml"), ("{case}/model/config.json",),
         setup=model_file("config.json", b"[1, 2]")),
    Case("plan-config-json-broken", ("plan", "{case}/run.yaml"), ("{case}/model/config.json", "JSON"),
         setup=model_file("config.json", b'{"model_type": "qwen3",')),
    Case("plan-config-json-binary", ("plan", "{case}/run.yaml"), ("{case}/model/config.json",),
         setup=model_file("config.json", BINARY)),
    Case("plan-model-pickle-only", ("plan", "{case}/run.yaml"), ("pytorch_model.bin", "safetensors"),
         setup=both(model_file("pytorch_model.bin", b"pickle"),
                    lambda d, w: (d / "model" / "model.safetensors").unlink())),
    Case("plan-weights-100-bytes", ("plan", "{case}/run.yaml"), ("{case}/model/model.safetensors",),
         setup=model_file("model.safetensors", truncated_to(100))),
    Case("plan-weights-truncated-20mb", ("plan", "{case}/run.yaml"),
         ("{case}/model/model.safetensors", "tensor"),
         setup=model_file("model.safetensors", truncated_to(20 << 20))),
    # the tokenizer gate, run by plan on the models' small files (issue 27 #9): a mismatched pair is a check
    # that failed (exit 1, as check-tokenizers); a tokenizer file that does not parse is bad input. The plan
    # hashes the one new file of the changed model (its hash goes to the work dir's cache).
    Case("plan-tokenizer-mismatch", ("plan", "{case}/run.yaml"), ("tokenizers of target and draft differ",
                                                                 "special tokens"), code=1,
         setup=draft_tokenizer_config(eos_token="<|endoftext|>"), allowed=("work/cache/file-hashes/",)),
    Case("compile-tokenizer-mismatch", ("compile", "{case}/run.yaml"),
         ("tokenizers of target and draft differ",), code=1,
         setup=draft_tokenizer_config(eos_token="<|endoftext|>"), allowed=("work/cache/file-hashes/",)),
    Case("run-tokenizer-mismatch", ("run", "{case}/run.yaml"),
         ("tokenizers of target and draft differ",), code=1,
         setup=draft_tokenizer_config(eos_token="<|endoftext|>"), allowed=("work/cache/file-hashes/",)),
    Case("plan-tokenizer-json-garbage", ("plan", "{case}/run.yaml"), ("{case}/model/tokenizer.json",),
         setup=model_file("tokenizer.json", BINARY), allowed=("work/cache/file-hashes/",)),
    Case("compile-tokenizer-json-garbage", ("compile", "{case}/run.yaml"), ("{case}/model/tokenizer.json",),
         setup=model_file("tokenizer.json", BINARY), allowed=("work/cache/file-hashes/",)),
    Case("validate-tokenizer-json-garbage", ("validate", "{case}/artifact"),
         ("{case}/artifact/tokenizer.json",), setup=artifact_with("tokenizer.json", BINARY)),
    # the store and the prompt file (must show 2: both named in one run)
    Case("plan-bad-store-and-prompts", ("plan", "{case}/run.yaml"),
         ("publish.uri", "s3://", "validation.prompts", "{case}/prompts.jsonl"),
         setup=run_config(publish={"uri": "s3://"}, validation={"prompts": "prompts.jsonl"})),
    Case("plan-store-under-a-file", ("plan", "{case}/run.yaml"), ("publish.uri", "{case}/file"),
         setup=both(text_file("file", "x"), run_config(publish={"uri": "file/store"}))),
    Case("plan-store-unknown-scheme", ("plan", "{case}/run.yaml"), ("publish.uri", "gs"),
         setup=run_config(publish={"uri": "gs://bucket/x"})),
    Case("plan-store-bucket-invalid", ("plan", "{case}/run.yaml"), ("publish.uri", "Bad_Bucket"),
         setup=run_config(publish={"uri": "s3://Bad_Bucket/x"})),
    Case("plan-prompts-binary", ("plan", "{case}/run.yaml"), ("{case}/p.jsonl",),
         setup=both(text_file("p.jsonl", BINARY), run_config(validation={"prompts": "p.jsonl"}))),
    Case("plan-prompts-empty", ("plan", "{case}/run.yaml"), ("{case}/p.jsonl",),
         setup=both(text_file("p.jsonl", ""), run_config(validation={"prompts": "p.jsonl"}))),
    Case("plan-prompts-bad-line", ("plan", "{case}/run.yaml"), ("{case}/p.jsonl", "line 2"),
         setup=both(text_file("p.jsonl", '{"class": "a", "text": "x"}\n{"class": \n'),
                    run_config(validation={"prompts": "p.jsonl"}))),
    Case("plan-prompts-yaml-a-string", ("plan", "{case}/run.yaml"), ("{case}/p.yaml",),
         setup=both(text_file("p.yaml", "just words\n"), run_config(validation={"prompts": "p.yaml"}))),
    Case("plan-prompts-alias-bomb", ("plan", "{case}/run.yaml"), ("{case}/p.yaml", "class"),
         setup=both(text_file("p.yaml", f"- text: hello\n  class: {alias_bomb()}\n"),
                    run_config(validation={"prompts": "p.yaml"}))),
    # a user name or password in a store URI or model reference: refused, and never echoed (issue 27 #10)
    Case("plan-store-userinfo", ("plan", "{case}/run.yaml"), ("publish.uri", "user name or password"),
         setup=run_config(publish={"uri": f"s3://user:{SECRET}@bucket/x"}), absent=(SECRET, "user:")),
    Case("plan-target-userinfo", ("plan", "{case}/run.yaml"), ("target", "user name or password"),
         setup=run_config(target=f"hf://user:{SECRET}@Qwen/Qwen3-32B"), absent=(SECRET, "user:")),
    Case("publish-store-userinfo", ("publish", "{artifact}", f"s3://user:{SECRET}@bucket/x"),
         ("user name or password",), absent=(SECRET, "user:")),
    Case("ls-store-userinfo", ("ls", f"s3://user:{SECRET}@bucket/x"), ("user name or password",),
         absent=(SECRET, "user:")),
    Case("verify-store-userinfo", ("verify", f"file://user:{SECRET}@/x"), ("user name or password",),
         absent=(SECRET, "user:")),
    Case("gc-store-userinfo", ("gc", f"gs://user:{SECRET}@bucket/x"), ("user name or password",),
         absent=(SECRET, "user:")),
    Case("k8s-store-userinfo", ("k8s", f"s3://user:{SECRET}@bucket/x"), ("user name or password",),
         json=False, absent=(SECRET, "user:")),
    # the environment (read by main when it starts)
    Case("env-s3-endpoint-not-a-url", ("plan", "{case}/run.yaml"), ("FUSEDSPEC_S3_ENDPOINT_URL", "notaurl"),
         setup=run_config(), env={"FUSEDSPEC_S3_ENDPOINT_URL": "notaurl"}),
    Case("env-s3-endpoint-port-out-of-range", ("ls", "s3://bucket/x"), ("FUSEDSPEC_S3_ENDPOINT_URL", "Port"),
         env={"FUSEDSPEC_S3_ENDPOINT_URL": "http://127.0.0.1:99999"}),
    Case("env-s3-endpoint-broken-ipv6", ("ls", "s3://bucket/x"), ("FUSEDSPEC_S3_ENDPOINT_URL", "IPv6"),
         env={"FUSEDSPEC_S3_ENDPOINT_URL": "http://[::1"}),
    Case("env-aws-region-invalid", ("ls", "s3://bucket/x"), ("AWS_REGION", "not a region"),
         env={"AWS_REGION": "not a region!"}),
    Case("env-aws-profile-missing", ("ls", "s3://bucket/x"), ("no-such-profile", "AWS_PROFILE"),
         env={"AWS_PROFILE": "no-such-profile", "AWS_CONFIG_FILE": "{case}/none",
              "AWS_SHARED_CREDENTIALS_FILE": "{case}/none"}),
    Case("env-verify-key-file-a-fifo", ("verify", "{version}"),
         ("FUSEDSPEC_VERIFY_KEY_FILE", "not a regular file"),
         setup=lambda d, w: os.mkfifo(d / "key"), env={"FUSEDSPEC_VERIFY_KEY_FILE": "{case}/key"}),
    Case("env-s3-endpoint-userinfo", ("ls", "s3://bucket/x"),
         ("FUSEDSPEC_S3_ENDPOINT_URL", "user name or password"),
         env={"FUSEDSPEC_S3_ENDPOINT_URL": f"http://user:{SECRET}@127.0.0.1:9"}, absent=(SECRET, "user:")),
    # nothing listens on port 9: the store check gives up after its 3 s, and says so (not "within 120 s")
    Case("env-s3-endpoint-unreachable", ("ls", "s3://bucket/x"), ("http://127.0.0.1:9", "did not answer",
                                                                  "for up to 3 s",
                                                                  "FUSEDSPEC_S3_ENDPOINT_URL"),
         env={"FUSEDSPEC_S3_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x",
              "AWS_SECRET_ACCESS_KEY": "y", "AWS_EC2_METADATA_DISABLED": "true"}),
    Case("env-hf-endpoint-ftp", ("plan", "{case}/run.yaml"), ("HF_ENDPOINT",),
         setup=run_config(), env={"HF_ENDPOINT": "ftp://hub.example"}),
    Case("env-work-dir-a-file", ("plan", "{case}/run.yaml"), ("FUSEDSPEC_WORK_DIR", "{case}/file"),
         setup=both(text_file("file", "x"), run_config()), env={"FUSEDSPEC_WORK_DIR": "{case}/file/work"}),
    Case("env-backend-plugin-missing", ("plan", "{case}/run.yaml"),
         ("FUSEDSPEC_BACKEND_PLUGINS", "no.such.module"),
         setup=run_config(backend="mine"), env={"FUSEDSPEC_BACKEND_PLUGINS": "mine=no.such.module"}),
    Case("env-builds-budget", ("gc", "--work-dir"), ("FUSEDSPEC_BUILDS_BUDGET",),
         env={"FUSEDSPEC_BUILDS_BUDGET": "lots"}),
    # a shared program cache holds native code: refused unless only this user can write it
    Case("env-programs-dir-group-writable", ("plan", "{case}/run.yaml"),
         ("FUSEDSPEC_PROGRAMS_DIR={case}/programs", "mode 775", "chmod go-w"),
         setup=both(directory("programs", 0o775), run_config()),
         env={"FUSEDSPEC_PROGRAMS_DIR": "{case}/programs"}),
    Case("env-programs-dir-a-symlink", ("plan", "{case}/run.yaml"),
         ("FUSEDSPEC_PROGRAMS_DIR={case}/link", "symlink"),
         setup=both(directory("programs", 0o700, linked_as="link"), run_config()),
         env={"FUSEDSPEC_PROGRAMS_DIR": "{case}/link"}),
    Case("env-programs-dir-under-a-shared-dir", ("plan", "{case}/run.yaml"),
         ("FUSEDSPEC_PROGRAMS_DIR={case}/open/programs", "{case}/open", "sticky"),
         setup=both(directory("open", 0o777), lambda d, w: (d / "open" / "programs").mkdir(mode=0o700),
                    run_config()),
         env={"FUSEDSPEC_PROGRAMS_DIR": "{case}/open/programs"}),
    Case("env-programs-dir-under-a-file", ("plan", "{case}/run.yaml"),
         ("FUSEDSPEC_PROGRAMS_DIR={case}/file/programs", "{case}/file above it is not a directory"),
         setup=both(text_file("file", "x"), run_config()),
         env={"FUSEDSPEC_PROGRAMS_DIR": "{case}/file/programs"}),
    Case("env-signing-key-file-missing", ("publish", "{artifact}", "{case}/store"),
         ("FUSEDSPEC_SIGNING_KEY_FILE",), env={"FUSEDSPEC_SIGNING_KEY_FILE": "/nonexistent/key.pem"}),
    Case("env-signing-key-garbage", ("publish", "{artifact}", "{case}/store"),
         ("FUSEDSPEC_SIGNING_KEY", "Ed25519"), env={"FUSEDSPEC_SIGNING_KEY": "not a key"}),
    Case("env-verify-key-garbage", ("verify", "{version}"), ("FUSEDSPEC_VERIFY_KEY", "Ed25519"),
         env={"FUSEDSPEC_VERIFY_KEY": "nope"}),
    # compile
    # NaN weights are found only by reading every weight, which a plan never does: the compile reads them.
    # By then the plan has hashed the new checkpoint (its hashes are cached: right, whatever the bytes
    # hold) and the build has taken its locks (empty files: the build's, and its graph key's in the program
    # cache) in the made builds dir. No build, no staging, no program.
    Case("compile-nan-weights", ("compile", "{case}/run.yaml"),
         ("{case}/model/model.safetensors", "norm.weight", "NaN"),
         setup=model_file("model.safetensors", nan_weights),
         allowed=("work/cache/file-hashes/", "work/cache/locks/", "work/programs/.locks/", "work/programs",
                  "work/builds")),
    Case("compile-weights-truncated-20mb", ("compile", "{case}/run.yaml"),
         ("{case}/model/model.safetensors", "tensor", "truncated"),
         setup=model_file("model.safetensors", truncated_to(20 << 20))),
    Case("compile-weights-100-bytes", ("compile", "{case}/run.yaml"), ("{case}/model/model.safetensors",),
         setup=model_file("model.safetensors", truncated_to(100))),
    Case("compile-dry-run-tp-huge", ("compile", "{case}/run.yaml", "--dry-run"), ("tp_degree",),
         setup=run_config(matrix={"tp_degree": [1048576]})),
    Case("compile-dry-run-yaml-list", ("compile", "{case}/run.yaml", "--dry-run"), ("{case}/run.yaml",),
         setup=text_file("run.yaml", "[1, 2]\n")),
    Case("compile-key-matches-nothing", ("compile", "{case}/run.yaml", "--key", "ffff"), ("--key", "ffff"),
         setup=run_config()),
    # validate
    Case("validate-no-such-dir", ("validate", "{case}/nope"), ("{case}/nope",)),
    Case("validate-empty-artifact-dir", ("validate", "{case}/empty"), ("{case}/empty", "build.json"),
         setup=lambda d, w: (d / "empty").mkdir()),
    Case("validate-build-json-is-5", ("validate", "{case}/artifact"), ("{case}/artifact/build.json",),
         setup=artifact_with("build.json", "5")),
    Case("validate-build-json-target-string", ("validate", "{case}/artifact"),
         ("{case}/artifact/build.json", "target"),
         setup=build_json(lambda b: {**b, "target": "Qwen/Qwen3-32B"})),
    Case("validate-max-new-tokens-0", ("validate", "{artifact}", "--max-new-tokens", "0"),
         ("--max-new-tokens",)),
    # the run config's bound (validation.max_new_tokens >= 2): one token would test no fused step
    Case("validate-max-new-tokens-1", ("validate", "{artifact}", "--max-new-tokens", "1"),
         ("--max-new-tokens 1", "validation.max_new_tokens")),
    Case("validate-tolerance-negative", ("validate", "{artifact}", "--tolerance", "-1"), ("--tolerance",)),
    Case("validate-prompts-missing", ("validate", "{artifact}", "--prompts", "{case}/p.jsonl"),
         ("{case}/p.jsonl",)),
    Case("validate-variants-unknown", ("validate", "{artifact}", "--variants", "poem"), ("--variants",)),
    Case("validate-step-times-missing", ("validate", "{artifact}", "--step-times", "{case}/t.json"),
         ("{case}/t.json",)),
    Case("validate-step-times-negative", ("validate", "{artifact}", "--step-times", "{case}/t.json"),
         ("{case}/t.json", "fused_step_s"), setup=text_file("t.json", json.dumps(
             {"where": "a device", "k": 4, "target_step_s": [0.02], "fused_step_s": [-0.03]}))),
    Case("validate-step-times-infinite", ("validate", "{artifact}", "--step-times", "{case}/t.json"),
         ("{case}/t.json", "fused_step_s", "finite"), setup=text_file("t.json", json.dumps(
             {"where": "a device", "k": 4, "target_step_s": [0.02], "fused_step_s": [float("inf")]}))),
    Case("validate-step-times-overflow", ("validate", "{artifact}", "--step-times", "{case}/t.json"),
         ("{case}/t.json", "target_step_s", "fused_step_s", "3600"), setup=text_file("t.json", json.dumps(
             {"where": "a device", "k": 4, "target_step_s": [1e-320], "fused_step_s": [1e308]}))),
    Case("validate-step-times-fused-faster", ("validate", "{artifact}", "--step-times", "{case}/t.json"),
         ("{case}/t.json", "fused_step_s", "swapped"), setup=text_file("t.json", json.dumps(
             {"where": "a device", "k": 4, "target_step_s": [0.02], "fused_step_s": [0.01]}))),
    Case("validate-step-times-k-huge", ("validate", "{artifact}", "--step-times", "{case}/t.json"),
         ("{case}/t.json", "k=1000000000"), setup=text_file("t.json", json.dumps(
             {"where": "a device", "k": 10**9, "target_step_s": [0.02], "fused_step_s": [0.03]}))),
    Case("validate-step-times-million-samples", ("validate", "{artifact}", "--step-times", "{case}/t.json"),
         ("{case}/t.json", "1000"), setup=text_file("t.json", json.dumps(
             {"where": "a device", "k": 4, "target_step_s": [0.02] * 20000, "fused_step_s": [0.03]}))),
    Case("validate-step-times-2mib", ("validate", "{artifact}", "--step-times", "{case}/t.json"),
         ("{case}/t.json", "bytes, more than"), setup=text_file("t.json", " " * (2 << 20) + "{}")),
    Case("validate-step-times-directory", ("validate", "{artifact}", "--step-times", "{case}/t.json"),
         ("{case}/t.json", "not a regular file"), setup=lambda d, w: (d / "t.json").mkdir()),
    Case("validate-step-times-and-cost-ratio", ("validate", "{artifact}", "--step-times", "{case}/t.json",
                                                "--cost-ratio", "0.1"), ("--step-times", "--cost-ratio")),
    Case("validate-step-times-no-advice",
         ("validate", "{artifact}", "--step-times", "{case}/t.json", "--no-advice"),
         ("--step-times", "--no-advice")),
    # advise
    Case("advise-k-range-huge",
         ("advise", "--target", "{target}", "--draft", "{draft}", "--k-range", "2..100000000"),
         ("k range", "2..100000000")),
    Case("advise-k-range-words",
         ("advise", "--target", "{target}", "--draft", "{draft}", "--k-range", "a..b"), ("k range", "a..b")),
    Case("advise-k-range-reversed",  # was "every k must be at least 2", of a range whose every k is
         ("advise", "--target", "{target}", "--draft", "{draft}", "--k-range", "3..2"),
         ("k range '3..2' holds no k", "LO <= HI")),
    Case("advise-k-range-from-1",
         ("advise", "--target", "{target}", "--draft", "{draft}", "--k-range", "1..4"), ("k range", "k=1")),
    Case("advise-max-new-tokens-1",
         ("advise", "--target", "{target}", "--draft", "{draft}", "--max-new-tokens", "1"),
         ("--max-new-tokens",)),
    Case("advise-max-new-tokens-huge",
         ("advise", "--target", "{target}", "--draft", "{draft}", "--max-new-tokens", "1000000000"),
         ("--max-new-tokens",)),
    Case("advise-plot-not-png",
         ("advise", "--target", "{target}", "--draft", "{draft}", "--plot", "{case}/k.txt"),
         ("--plot", "png")),
    Case("advise-cost-ratio-zero",
         ("advise", "--target", "{target}", "--draft", "{draft}", "--cost-ratio", "0"), ("--cost-ratio",)),
    Case("advise-top-per-class-0",
         ("advise", "--target", "{target}", "--draft", "{draft}", "--top-per-class", "0"),
         ("--top-per-class 0", "matrix.top_per_class of a run config")),
    Case("advise-top-per-class-keeps-all",
         ("advise", "--target", "{target}", "--draft", "{draft}", "--k-range", "3..5",
          "--top-per-class", "3"),
         ("--top-per-class 3 keeps every (draft, k) of 1 draft(s) x 3 k",)),
    Case("advise-verify-slope-negative",
         ("advise", "--target", "{target}", "--draft", "{draft}", "--verify-slope", "-1"),
         ("--verify-slope",)),
    Case("advise-verify-slope-nan",  # NaN passed `< 0` and made every speedup NaN: "do not speculate"
         ("advise", "--target", "{target}", "--draft", "{draft}", "--verify-slope", "nan"),
         ("--verify-slope nan",)),
    Case("advise-dtype-int8", ("advise", "--target", "{target}", "--draft", "{draft}", "--dtype", "int8"),
         ("dtype", "int8")),
    Case("advise-target-missing", ("advise", "--target", "{case}/nope", "--draft", "{draft}"),
         ("{case}/nope",)),
    Case("advise-prompts-binary", ("advise", "--target", "{target}", "--draft", "{draft}", "--prompts",
                                   "{case}/p.jsonl"), ("{case}/p.jsonl",),
         setup=text_file("p.jsonl", BINARY)),
    # submit: refused by its plan here, before a run is created on any server
    Case("submit-k-is-1", ("submit", "{case}/run.yaml", "--watch"),
         ("matrix.speculation_length[0]: 1 is less than the minimum of 2",),
         setup=run_config(matrix={"speculation_length": [1]})),
    Case("submit-no-prefect-server", ("submit", "{case}/run.yaml"), ("PREFECT_API_URL", "fusedspec run"),
         setup=run_config()),  # cli_env has no PREFECT_API_URL: there is no server to send the run to
    # run: refused by its plan, before Prefect starts or any claim is written
    Case("run-bad-store-and-prompts", ("run", "{case}/run.yaml"),
         ("publish.uri", "s3://", "validation.prompts", "{case}/prompts.jsonl"),
         setup=run_config(publish={"uri": "s3://"}, validation={"prompts": "prompts.jsonl"})),
    Case("run-batch-1e9", ("run", "{case}/run.yaml"), ("batch_size",),
         setup=run_config(matrix={"batch_size": [1e9]})),
    Case("run-heads-four", ("run", "{case}/run.yaml"), ("{case}/model/config.json",),
         setup=model_config(num_attention_heads="four")),
    # publish
    Case("publish-empty-artifact-dir", ("publish", "{case}/empty", "{case}/store"),
         ("{case}/empty", "build.json"), setup=lambda d, w: (d / "empty").mkdir()),
    Case("publish-build-json-is-5", ("publish", "{case}/artifact", "{case}/store"),
         ("{case}/artifact/build.json",), setup=artifact_with("build.json", "5")),
    Case("publish-build-json-target-string", ("publish", "{case}/artifact", "{case}/store"),
         ("{case}/artifact/build.json", "target"), setup=build_json(lambda b: {**b, "target": "x"})),
    Case("publish-build-json-binary", ("publish", "{case}/artifact", "{case}/store"),
         ("{case}/artifact/build.json",), setup=artifact_with("build.json", BINARY)),
    Case("publish-not-validated", ("publish", "{case}/artifact", "{case}/store"),
         ("greedy gate", "--unvalidated"), setup=artifact_with("validation.json", None)),
    Case("publish-validation-json-garbage", ("publish", "{case}/artifact", "{case}/store"),
         ("{case}/artifact/validation.json",), setup=artifact_with("validation.json", "{}")),
    Case("publish-store-under-a-file", ("publish", "{artifact}", "{case}/file/store"), ("{case}/file",),
         setup=text_file("file", "x")),
    # a store root inside a store's own layout (a version, its .blobs): refused, the store it is in named
    Case("publish-into-a-version", ("publish", "{artifact}", "{version}"), ("{version}", "inside a store",
                                                                          "publish to {store}")),
    Case("publish-into-the-blobs", ("publish", "{artifact}", "{store}/.blobs"),
         ("{store}/.blobs", "inside a store", "publish to {store}")),
    Case("publish-s3-no-bucket", ("publish", "{artifact}", "s3://"), ("s3://", "bucket")),
    Case("publish-store-dotdot", ("publish", "{artifact}", "{case}/a/../b"), ("'..'",)),
    Case("publish-s3-endpoint-not-a-url", ("publish", "{artifact}", "s3://bucket/x"),
         ("FUSEDSPEC_S3_ENDPOINT_URL", "notaurl"), env={"FUSEDSPEC_S3_ENDPOINT_URL": "notaurl"}),
    Case("publish-symlink-in-artifact", ("publish", "{case}/artifact", "{case}/store"), ("symlink",),
         setup=both(artifact_with("programs/passwd", None),
                    lambda d, w: (d / "artifact" / "programs" / "passwd").symlink_to("/etc/passwd"))),
    # verify: bad arguments are exit 2; a damaged version is a failed check, exit 1, naming what is wrong
    Case("verify-mount-not-there", ("verify", "{version}", "--mount", "{case}/nowhere"), ("{case}/nowhere",)),
    Case("verify-unknown-scheme", ("verify", "gs://bucket/x"), ("gs",)),
    Case("verify-nothing-there", ("verify", "{case}/nothing"), ("nothing to verify",)),
    Case("verify-latest-garbage", ("verify", "{case}/store/{config}"), ("LATEST",), code=1,
         setup=store_latest("garbage")),
    Case("verify-manifest-file-entry-string", ("verify", "{case}/store/{config}/{key}"),
         ("manifest.json", "files"), code=1, setup=store_manifest(first_file("a string"))),
    Case("verify-manifest-dotdot-path", ("verify", "{case}/store/{config}/{key}"), ("../../etc/passwd",),
         code=1, setup=store_manifest(renamed_file("../../etc/passwd"))),
    Case("verify-manifest-absolute-path", ("verify", "{case}/store/{config}/{key}"), ("/etc/passwd",), code=1,
         setup=store_manifest(renamed_file("/etc/passwd"))),
    Case("verify-manifest-not-json", ("verify", "{case}/store/{config}/{key}"), ("manifest.json", "JSON"),
         code=1, setup=lambda d, w: (
             shutil.copytree(w.store, d / "store"),
             (d / "store" / w.version.relative_to(w.store) / "manifest.json").write_bytes(BINARY))),
    # ls: every version still listed; a damaged one named, exit 1 (as `ls` does for an unreadable entry)
    Case("ls-manifest-size-big", ("ls", "{case}/store"), ("manifest.json", "size", "big"), code=1,
         setup=store_manifest(first_file(lambda e: {**e, "size": "big"}))),
    Case("ls-manifest-lacks-spec", ("ls", "{case}/store"), ("manifest.json", "spec"), code=1,
         setup=store_manifest(without("spec"))),
    Case("ls-unknown-scheme", ("ls", "gs://bucket/x"), ("gs",)),
    Case("ls-s3-no-bucket", ("ls", "s3://"), ("s3://", "bucket")),
    Case("ls-a-regular-file", ("ls", "{case}/file"), ("{case}/file",), setup=text_file("file", "x")),
    Case("ls-no-such-dir", ("ls", "{case}/nope"), ("{case}/nope", "no such directory")),
    # k8s (S3 only)
    Case("k8s-local-store", ("k8s", "{version}"), ("S3",), json=False),
    Case("k8s-manifest-lacks-spec", ("k8s", "s3://{bucket}/{case_id}/{s3path}", "--s3-endpoint",
                                     "http://s3.cluster.svc:8333"), ("manifest.json", "spec"),
         json=False, s3=True, setup=s3_manifest(without("spec"))),
    Case("k8s-manifest-file-entry-string", ("k8s", "s3://{bucket}/{case_id}/{s3path}", "--s3-endpoint",
                                            "http://s3.cluster.svc:8333"), ("manifest.json", "files"),
         json=False, s3=True, setup=s3_manifest(first_file("a string"))),
    Case("k8s-manifest-dotdot-path", ("k8s", "s3://{bucket}/{case_id}/{s3path}", "--s3-endpoint",
                                      "http://s3.cluster.svc:8333"), ("../../etc/passwd",),
         json=False, s3=True, setup=s3_manifest(renamed_file("../../etc/passwd"))),
    Case("k8s-latest-garbage", ("k8s", "s3://{bucket}/{case_id}/{s3config}", "--s3-endpoint",
                                "http://s3.cluster.svc:8333"), ("LATEST", "JSON"), json=False,
         s3=True, setup=s3_latest("garbage")),
    Case("ls-s3-manifest-size-big", ("ls", "s3://{bucket}/{case_id}"), ("manifest.json", "size", "big"),
         code=1, s3=True, setup=s3_manifest(first_file(lambda e: {**e, "size": "big"}))),
    Case("verify-s3-manifest-file-entry-string", ("verify", "s3://{bucket}/{case_id}/{s3path}"),
         ("manifest.json", "files"), code=1, s3=True, setup=s3_manifest(first_file("a string"))),
    Case("k8s-endpoint-userinfo", ("k8s", "{s3version}"), ("FUSEDSPEC_S3_ENDPOINT_URL",), json=False, s3=True,
         env={"FUSEDSPEC_S3_ENDPOINT_URL": f"http://user:{SECRET}@127.0.0.1:9"}, absent=(SECRET, "user:")),
    Case("k8s-no-such-bucket", ("k8s", "s3://no-such-bucket-fs/x", "--s3-endpoint",
                                "http://s3.cluster.svc:8333"), ("no-such-bucket-fs",), json=False, s3=True),
    Case("k8s-replicas-negative", ("k8s", "s3://bucket/x", "--replicas", "-1"), ("replicas",), json=False),
    Case("k8s-image-invalid", ("k8s", "s3://bucket/x", "--image", "Fusedspec CPU"),
         ("image", "Fusedspec CPU"), json=False),
    Case("k8s-service-account-invalid", ("k8s", "s3://bucket/x", "--service-account", "Serve_SA"),
         ("service account", "Serve_SA"), json=False),
    Case("k8s-region-invalid", ("k8s", "s3://bucket/x", "--region", "us east 1"), ("region", "us east 1"),
         json=False),
    Case("k8s-s3-endpoint-not-http", ("k8s", "s3://bucket/x", "--s3-endpoint", "ftp://store"),
         ("--s3-endpoint",), json=False),
    Case("k8s-s3-secret-invalid", ("k8s", "s3://bucket/x", "--s3-secret", "Keys!"), ("secret", "Keys!"),
         json=False),
    # the world's S3 endpoint is this host's loopback, which no pod reaches
    Case("k8s-endpoint-loopback", ("k8s", "{s3version}"), ("loopback", "--s3-endpoint"), json=False, s3=True),
    # a Neuron version holds native code (model.pt): pods would refuse it without a verify key
    Case("k8s-native-without-verify-key",
         ("k8s", "{s3version}", "--s3-endpoint", "http://s3.cluster.svc:8333"),
         ("native code", "model.pt", "FUSEDSPEC_VERIFY_KEY"), json=False, s3=True),
    Case("k8s-port-too-high", ("k8s", "s3://bucket/x", "--port", "70000"), ("port",), json=False),
    Case("k8s-node-selector-no-value", ("k8s", "s3://bucket/x", "--node-selector", "zone"),
         ("--node-selector",), json=False),
    Case("k8s-toleration-bad-effect", ("k8s", "s3://bucket/x", "--toleration", "k:Sometimes"),
         ("--toleration",), json=False),
    # serve (refused before it loads anything or listens)
    Case("serve-port-too-high", ("serve", "{version}", "--port", "70000"), ("--port 70000",), json=False),
    Case("serve-queue-negative", ("serve", "{version}", "--queue-size", "-1"), ("--queue-size -1",),
         json=False),
    Case("serve-timeout-zero", ("serve", "{version}", "--request-timeout", "0"), ("--request-timeout",),
         json=False),
    Case("serve-max-connections-zero", ("serve", "{version}", "--max-connections", "0"),
         ("--max-connections 0",), json=False),
    Case("serve-no-version-there", ("serve", "{case}/nowhere"), ("{case}/nowhere",), json=False),
    Case("serve-endpoint-userinfo", ("serve", "{s3version}"), ("FUSEDSPEC_S3_ENDPOINT_URL",),
         json=False, s3=True,
         env={"FUSEDSPEC_S3_ENDPOINT_URL": f"http://user:{SECRET}@127.0.0.1:9"}, absent=(SECRET, "user:")),
    # gc, keygen, check-tokenizers, demo
    Case("gc-nothing-named", ("gc",), ("URI", "--work-dir")),
    Case("gc-unknown-scheme", ("gc", "gs://bucket/x"), ("gs",)),
    Case("gc-store-under-a-file", ("gc", "{case}/file/store"), ("{case}/file",),
         setup=text_file("file", "x")),
    Case("gc-no-such-dir", ("gc", "{case}/nope"), ("{case}/nope", "no such directory")),
    Case("keygen-keys-exist", ("keygen", "{case}/keys"), ("{case}/keys/signing-key.pem", "already exist"),
         setup=keys_in),
    Case("keygen-under-a-file", ("keygen", "{case}/file/keys"), ("{case}/file",),
         setup=text_file("file", "x")),
    Case("check-tokenizers-no-dir", ("check-tokenizers", "{case}/a", "{target}"), ("{case}/a",)),
    Case("check-tokenizers-no-tokenizer", ("check-tokenizers", "{case}/empty", "{target}"), ("{case}/empty",),
         setup=lambda d, w: (d / "empty").mkdir()),
    Case("check-tokenizers-garbage", ("check-tokenizers", "{case}/model", "{target}"),
         ("{case}/model/tokenizer.json",), setup=model_file("tokenizer.json", BINARY)),
    Case("check-tokenizers-hub-dotdot", ("check-tokenizers", "hf://a/..", "{target}"), ("hf://a/..",)),
    Case("demo-publish-unknown-scheme", ("demo", "--publish", "gs://bucket/x"), ("gs",)),
    Case("demo-publish-under-a-file", ("demo", "--publish", "{case}/file/store"), ("{case}/file",),
         setup=text_file("file", "x")),
]

# Cases whose refusal is also timed (must show 4): formerly unbounded work.
TIMED = ("plan-tp-huge", "compile-dry-run-tp-huge", "plan-batch-1e9", "run-batch-1e9", "advise-k-range-huge",
         "advise-max-new-tokens-huge",
         "plan-yaml-alias-bomb", "plan-prompts-alias-bomb")


# ---- running a case ------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its size and modification time (directories too)."""
    found = {}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        found[str(path.relative_to(root))] = (stat.st_size if path.is_file() else -1, stat.st_mtime_ns)
    return found


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Paths added, removed or changed between two snapshots (directories only when added or removed:
    a directory's time changes when a file in it is written, which the file itself shows)."""
    files = {p for p in before.keys() | after.keys()
             if before.get(p, (0,))[0] != -1 or after.get(p, (0,))[0] != -1}
    return sorted(p for p in before.keys() ^ after.keys()) + sorted(
        p for p in files & before.keys() & after.keys() if before[p] != after[p])


def allowed(path: str, patterns: tuple[str, ...]) -> bool:
    return any(path == p.rstrip("/") or (p.endswith("/") and path.startswith(p)) for p in patterns)


def bucket_listing(w: World) -> dict[str, str]:
    if w.bucket is None:
        return {}
    objects = {}
    for page in w.s3_client.get_paginator("list_objects_v2").paginate(Bucket=w.bucket):
        objects.update({item["Key"]: item["ETag"] for item in page.get("Contents", [])})
    return objects


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    seconds: float


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    started = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse ends a usage error so; the console script would exit with it
        code = int(exc.code or 0)
    seconds = time.perf_counter() - started
    out, err = capsys.readouterr()
    return Outcome(code, out, err, seconds)


def check_outcome(case: Case, result: Outcome, words: list[str], *, as_json: bool) -> None:
    text = result.out + result.err
    assert result.code == case.code, f"exit {result.code}, expected {case.code}:\n{text}"
    assert "Traceback" not in text and "internal error" not in text, text
    for word in words:
        assert word in text, f"{word!r} is not named:\n{text}"
    for secret in case.absent:
        assert secret not in text, text
    if case.code == 2:  # one line saying so: `fusedspec CMD: error: ...` (argparse prints its usage first)
        assert re.search(r"^fusedspec( [a-z0-9-]+)?: error: ", result.err, re.MULTILINE), result.err
    if as_json:
        document = json.loads(result.out)  # exactly one document: anything around it fails to parse
        assert isinstance(document, dict) and document["ok"] is False, result.out
        if "exit_code" in document:
            assert document["exit_code"] == case.code


def fill(text: str, names: Mapping[str, str]) -> str:
    for key, value in names.items():
        text = text.replace("{" + key + "}", value)
    return text


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_drafts: dict[str, Path]) -> World:
    from fusedspec.core.settings import Settings
    from fusedspec.registry.publish import publish_artifact
    from tests.fixtures.fake_artifacts import make_artifact

    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "in").mkdir()
    artifact = make_artifact(root / "in" / "artifact", tp=1, k=3, weight_mib=0.01)
    store = root / "store"
    result = publish_artifact(artifact, str(store), Settings(work_dir=root / "work"))
    w = World(root=root, target=tiny_target, draft=tiny_drafts["cut"], artifact=artifact, store=store,
              version=Path(result.version_uri))
    good = root / "in" / "good.yaml"
    good.write_text(yaml.safe_dump(w.good_config()))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FUSEDSPEC_WORK_DIR", str(w.work))
        assert main(["plan", str(good)]) == 0  # as a user's: the hash cache now holds the good models' files
    return w


@pytest.fixture
def cli_env(world: World, monkeypatch: pytest.MonkeyPatch) -> World:
    """The process environment of a user with a work dir of their own and no S3 or Hub settings."""
    for name in ("FUSEDSPEC_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "HF_ENDPOINT",
                 "HF_TOKEN", "FUSEDSPEC_SIGNING_KEY", "FUSEDSPEC_SIGNING_KEY_FILE", "FUSEDSPEC_VERIFY_KEY",
                 "FUSEDSPEC_VERIFY_KEY_FILE", "FUSEDSPEC_BUILDS_BUDGET", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(world.work))
    return world


def _case_dir(w: World, case: Case) -> Path:
    d = w.root / "in" / case.id
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


LOCAL_CASES = [c for c in CASES if not c.s3]
S3_CASES = [c for c in CASES if c.s3]


@pytest.mark.parametrize("case", LOCAL_CASES, ids=[c.id for c in LOCAL_CASES])
def test_bad_input_is_refused_plainly(case: Case, cli_env: World, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    refused_plainly(case, cli_env, capsys, monkeypatch)


@pytest.mark.parametrize("case", S3_CASES, ids=[c.id for c in S3_CASES])
def test_bad_s3_input_is_refused_plainly(case: Case, s3_world: World, seaweed: Any, cli_env: World,
                                         capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    refused_plainly(case, s3_world, capsys, monkeypatch)


def refused_plainly(case: Case, w: World, capsys: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the case as typed and with --json; check the outcome and that nothing was written."""
    d = _case_dir(w, case)
    if case.setup is not None:
        case.setup(d, w)
    names = w.names(d) | {"case_id": case.id, "config": str(w.version.parent.relative_to(w.store)),
                          "key": w.version.name, "s3path": w.s3_version.removeprefix(f"s3://{w.bucket}/"),
                          "s3config": w.s3_version.removeprefix(f"s3://{w.bucket}/").rsplit("/", 1)[0]}
    for key, value in case.env.items():
        monkeypatch.setenv(key, fill(value, names))
    argv = [fill(a, names) for a in case.argv]
    words = [fill(word, names) for word in case.words]
    runs = [argv] + ([argv + ["--json"]] if case.json else [])
    for run in runs:
        before, objects = snapshot(w.root), bucket_listing(w)
        result = run_cli(run, capsys)
        check_outcome(case, result, words, as_json=run[-1] == "--json")
        written = [p for p in changes(before, snapshot(w.root)) if not allowed(p, case.allowed)]
        assert not written, f"the refusal wrote: {written}"
        assert bucket_listing(w) == objects, "the refusal wrote to the bucket"
        if case.id in TIMED and run is runs[-1]:  # the second run: imports are warm, the refusal is timed
            assert result.seconds < 1.0, f"{case.id} took {result.seconds:.2f} s to refuse"


# ---- the deployment path (issue 24 must-show 4) ----------------------------------------------------------
# Every run config case whose mistake is in the schema (a refusal of `run_config_from_dict` before any
# model is read), sent as the `config` parameter of a compile-fused/local run: the server refuses it when
# the run is created, in the words `fusedspec plan` used for it (`config.FIELD` there, `FIELD` here).
# What JSON Schema cannot say (a k not below seq_len, a TP the models' heads refuse) is not among them:
# the plan names those, at once, and a deployment run ends Failed in its plan with the same words.


def _schema_case(case: Case) -> bool:
    from fusedspec.compile.runconfig import schema_problems

    changes = getattr(case.setup, "changes", None)
    placeholder = {"target": "/t", "draft": "/d", "backend": "cpu", "matrix": {"tp_degree": [1],
                   "seq_len": [64], "speculation_length": [3], "batch_size": [1], "dtype": ["float32"]},
                   "compile": {"aot_inductor": False}, "publish": {"uri": "/s"}}
    return changes is not None and not case.env and bool(schema_problems(_deep_update(placeholder, changes)))


DEPLOYMENT_CASES = [c for c in LOCAL_CASES if c.argv[0] == "plan" and _schema_case(c)]


def test_the_deployment_path_covers_the_schema_cases() -> None:
    assert len(DEPLOYMENT_CASES) >= 15, [c.id for c in DEPLOYMENT_CASES]


@pytest.mark.parametrize("case", DEPLOYMENT_CASES, ids=[c.id for c in DEPLOYMENT_CASES])
def test_a_deployment_refuses_at_creation_in_the_words_of_plan(case: Case, cli_env: World, deployed: Any,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import urllib.error
    import urllib.request

    d = _case_dir(cli_env, case)
    assert case.setup is not None
    case.setup(d, cli_env)
    config = yaml.safe_load((d / "run.yaml").read_text())
    cli = run_cli(["plan", str(d / "run.yaml")], capsys)
    assert cli.code == 2, cli.err

    deployment = deployed.get("/deployments/name/compile-fused/local")
    runs = deployed.post("/flow_runs/filter", {"deployments": {"id": {"any_": [deployment["id"]]}}})
    request = urllib.request.Request(f"{deployed.api_url}/deployments/{deployment['id']}/create_flow_run",
                                     data=json.dumps({"parameters": {"config": config}}).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    detail = json.loads(refused.value.read())["detail"]
    match = re.search(r"Validation failed for field '([^']*)'\. Failure reason: (.*)$", detail, re.S)
    assert refused.value.code == 409 and match, detail
    field_name = match.group(1).removeprefix("config").removeprefix(".") or "run config"
    assert f"{field_name}: {match.group(2)}" in cli.err, f"the server said {detail!r}; plan said:\n{cli.err}"
    after = deployed.post("/flow_runs/filter", {"deployments": {"id": {"any_": [deployment["id"]]}}})
    assert {r["id"] for r in after} == {r["id"] for r in runs}, "a refused run must not be created"


@pytest.fixture(scope="module")
def s3_world(world: World, seaweed: Any, qwen3_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[World]:
    """The world's bucket, holding one Neuron-shaped version (a layout fixture: no Neuron SDK here)."""
    from fusedspec.registry.publish import publish_artifact
    from tests.fixtures.fake_artifacts import make_neuron_artifact

    bucket = seaweed.new_bucket()
    artifact = make_neuron_artifact(tmp_path_factory.mktemp("neuron") / "a", qwen3_tokenizer, tp=4, k=5,
                                    batch=2, seq_len=512)
    result = publish_artifact(artifact, f"s3://{bucket}/good", seaweed.settings(world.work))
    world.bucket, world.s3_version, world.s3_client = bucket, result.version_uri, seaweed.client()
    try:
        yield world
    finally:
        seaweed.drop_bucket(bucket)
        world.bucket = None


@pytest.mark.parametrize("damage", ["nan", "truncated-20mb", "100-bytes"])
def test_bad_weights_are_refused_at_compile_and_nothing_is_staged(
        damage: str, cli_env: World, capsys: pytest.CaptureFixture[str]) -> None:
    """Must show 3: NaN weights and a truncated checkpoint end `fusedspec compile` with exit 2, the file and
    the tensor named (a 100-byte file holds no tensor to name), and no build or staging dir left."""
    w = cli_env
    d = _case_dir(w, Case(f"weights-{damage}", (), ()))
    content = {"nan": nan_weights, "truncated-20mb": truncated_to(20 << 20),
               "100-bytes": truncated_to(100)}[damage]
    model_file("model.safetensors", content)(d, w)
    result = run_cli(["compile", str(d / "run.yaml")], capsys)
    assert result.code == 2, result.err
    assert f"{d}/model/model.safetensors: " in result.err, result.err
    if damage != "100-bytes":
        assert "tensor 'model." in result.err, result.err
    builds = w.work / "builds"
    assert not builds.exists() or list(builds.iterdir()) == [], "a build or its staging dir was left"
