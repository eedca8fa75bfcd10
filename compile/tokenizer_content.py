"""What decides a tokenizer's ids and their meaning, read from its files into canonical form.

The tokenizer gate (validate.tokenizers) compares two of these; manifests record the hash of the one an
artifact ships (`tokenizer_hash`). Files are compared as content (parsed JSON), not bytes, so formatting
and key order do not matter. The files are untrusted input: a malformed one is a CheckpointError naming it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fusedspec.compile.model_files import parse_json_object
from fusedspec.core.errors import CheckpointError
from fusedspec.core.kept import KeptByContent

ADDED_FLAGS = ("special", "normalized", "lstrip", "rstrip", "single_word")
SPECIAL_ROLES = ("eos_token", "pad_token", "bos_token", "unk_token")
# tokenizer_config.json switches that change the ids a text encodes to, or how ids decode.
ENCODING_SETTINGS = ("add_bos_token", "add_eos_token", "add_prefix_space", "split_special_tokens",
                     "clean_up_tokenization_spaces", "do_lower_case", "legacy")
COMPONENTS = ("normalizer", "pre_tokenizer", "post_processor", "decoder")


@dataclass(frozen=True)
class TokenizerContent:
    """Everything that decides a tokenizer's ids and their meaning, in canonical form."""

    vocab: dict[str, int]
    merges: list[str]  # "left right", in priority order
    model: dict[str, Any]  # model settings other than vocab and merges
    added: dict[int, dict[str, Any]]  # id -> {"content", *ADDED_FLAGS}
    components: dict[str, Any]  # normalizer / pre_tokenizer / post_processor / decoder (JSON or None)
    specials: dict[str, str | None]  # role -> token string
    settings: dict[str, Any]
    chat_template: Any  # a string, a list of named templates, or None
    embedding_rows: int | None  # config.json vocab_size, when the directory has a config.json

    @property
    def size(self) -> int:
        """One more than the largest id the tokenizer can produce."""
        return max([*self.vocab.values(), *self.added.keys(), -1]) + 1

    def token_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        for tid, entry in self.added.items():
            if entry["content"] == token:
                return tid
        return self.vocab.get(token)

    def content_hash(self) -> str:
        return self._content_hash

    @functools.cached_property
    def _content_hash(self) -> str:
        """sha256 over the canonical content. The vocabulary goes in as a JSON list of (id, token) pairs in
        id order: as unambiguous as canonical JSON of the dict, several times faster to write."""
        digest = hashlib.sha256()
        rest = {k: v for k, v in self.canonical().items() if k not in ("vocab", "merges")}
        digest.update(json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
        pairs = sorted((tid, tok) for tok, tid in self.vocab.items())
        digest.update(json.dumps([pairs, self.merges], separators=(",", ":"), ensure_ascii=False).encode())
        return "sha256:" + digest.hexdigest()

    def canonical(self) -> dict[str, Any]:
        """The content as plain JSON (embedding rows excluded: they belong to the model,
        not the tokenizer)."""
        return {"vocab": self.vocab, "merges": self.merges, "model": self.model,
                "added": {str(k): v for k, v in sorted(self.added.items())}, "components": self.components,
                "specials": self.specials, "settings": self.settings, "chat_template": self.chat_template}


def _parse_json(text: bytes | None, path: Path) -> dict[str, Any]:
    if text is None:
        raise CheckpointError(f"{path}: removed while it was being read; run again")
    return parse_json_object(text, path, "re-save the tokenizer with transformers")


def _added_entry(entry: Any, path: Path) -> tuple[int, dict[str, Any]]:
    try:
        tid, content = int(entry["id"]) if "id" in entry else None, entry["content"]
    except (TypeError, KeyError, ValueError):
        tid, content = None, None
    if not isinstance(content, str):
        raise CheckpointError(f"{path}: an added token {entry!r:.80} lacks a string 'content'")
    return tid if tid is not None else -1, {"content": content,
                                           **{f: bool(entry.get(f, False)) for f in ADDED_FLAGS}}


def _token_text(value: Any) -> str | None:
    """tokenizer_config writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


SOURCE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json")
# Parsed content by the files' bytes: one tokenizer is read from many directories (a target checked against
# each draft, every artifact shipping a copy), and parsing its tokenizer.json is most of a gate's time.
_PARSED: KeptByContent[TokenizerContent] = KeptByContent(8)


def read_tokenizer_content(directory: Path) -> TokenizerContent:
    """Read tokenizer.json (required), tokenizer_config.json, chat_template.jinja and config.json.
    Content parsed from the same bytes before is reused; treat the result as read-only."""
    directory = Path(directory).resolve()
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such directory")
    if not (directory / "tokenizer.json").is_file():
        raise CheckpointError(
            f"{directory}: no tokenizer.json; the gate compares fast-tokenizer files. Write one with "
            "`AutoTokenizer.from_pretrained(dir).save_pretrained(dir)` (transformers)"
        )
    files = {name: _read_if_present(directory / name) for name in SOURCE_FILES}
    return _PARSED.get(list(files.values()), lambda: _parse_tokenizer_content(directory, files))


def _read_if_present(path: Path) -> bytes | None:
    """The bytes of a regular file; None for anything else (a FIFO or a device would block or never end)."""
    try:
        return path.read_bytes() if path.is_file() else None
    except FileNotFoundError:
        return None


def _parse_tokenizer_content(directory: Path, files: dict[str, bytes | None]) -> TokenizerContent:
    tok_path = directory / "tokenizer.json"
    tok = _parse_json(files["tokenizer.json"], tok_path)
    cfg_path = directory / "tokenizer_config.json"
    cfg_text = files["tokenizer_config.json"]
    cfg = _parse_json(cfg_text, cfg_path) if cfg_text is not None else {}
    model = tok.get("model") or {}
    if not isinstance(model, dict):
        raise CheckpointError(f"{tok_path}: 'model' is not an object; "
                              "re-save the tokenizer with transformers")
    model = dict(model)
    raw_vocab = model.pop("vocab", {})
    try:
        if isinstance(raw_vocab, list):  # Unigram: [[piece, score], ...], the id is the position
            vocab = {str(piece[0]): i for i, piece in enumerate(raw_vocab)}
        else:
            vocab = {str(token): int(tid) for token, tid in dict(raw_vocab).items()}  # as the file states it
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.pop("merges", None) or []]
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        raise CheckpointError(f"{tok_path}: the model's vocab or merges are malformed ({exc}); re-save the "
                              "tokenizer with transformers") from None

    added: dict[int, dict[str, Any]] = {}
    for entry in tok.get("added_tokens") or []:
        tid, record = _added_entry(entry, tok_path)
        added[tid] = record
    # transformers applies tokenizer_config's added_tokens_decoder on top of tokenizer.json's list.
    decoder = cfg.get("added_tokens_decoder") or {}
    for tid_text, entry in (decoder.items() if isinstance(decoder, dict) else []):
        _, record = _added_entry(entry, cfg_path)
        if not str(tid_text).isdigit():
            raise CheckpointError(f"{cfg_path}: added_tokens_decoder key {tid_text!r} is not a token id")
        added[int(tid_text)] = record

    template = files["chat_template.jinja"]  # transformers >= 4.47 saves the template apart
    chat_template = template.decode("utf-8") if template is not None else cfg.get("chat_template")
    config_path = directory / "config.json"
    config = files["config.json"]
    rows = _parse_json(config, config_path).get("vocab_size") if config is not None else None
    if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool)):
        raise CheckpointError(f"{config_path}: vocab_size={rows!r} is not an integer; fix the config.json")
    return TokenizerContent(
        vocab=vocab,
        merges=merges,
        model=model,
        added=added,
        components={name: tok.get(name) for name in COMPONENTS},
        specials={role: _token_text(cfg.get(role)) for role in SPECIAL_ROLES},
        settings={name: cfg.get(name) for name in ENCODING_SETTINGS if name in cfg},
        chat_template=chat_template,
        embedding_rows=int(rows) if rows is not None else None,
    )


def artifact_tokenizer_hash(directory: Path) -> str | None:
    """The tokenizer hash of what an artifact ships, or None when it ships no tokenizer.json."""
    return tokenizer_hash(directory) if (Path(directory) / "tokenizer.json").is_file() else None


def tokenizer_hash(directory: Path) -> str:
    """`sha256:<hex>` over the canonical tokenizer content: equal for tokenizers the gate calls identical,
    whatever the file formatting."""
    return read_tokenizer_content(directory).content_hash()


