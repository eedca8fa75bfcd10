"""Prompt sets for validation and k advice: load, check, hash, and render to token ids.

A prompt set is a list of prompts, each with an `id`, a `class` and a `text`. The shipped set
(`validate/prompts/default.jsonl`) mirrors the AWS write-up in `shared/seeds/`: structured prompts
(repeat a line, continue a number sequence, simple code, a JSON/YAML skeleton) and open-ended prose,
because acceptance, and so the best k, depends mostly on how predictable the output is.

Users pass their own file, JSON Lines (one object per line) or YAML (a list of mappings, or a mapping
with a `prompts:` list). Fields:

    id        optional, unique; defaults to "line<N>" (JSONL) or "item<N>" (YAML)
    class     required, a short name (letters, digits, '-', '_'); results are grouped by it
    text      required, non-empty
    variants  optional, a subset of ["raw", "chat"]; default both

Every prompt is rendered as up to two variants with the target's tokenizer: `raw` (the text encoded
as is) and `chat` (the tokenizer's chat template around one user message, with the generation prompt).
Each entry is parsed by the pydantic model `PromptEntry`; unknown fields, empty files, malformed lines and
sets over the bounds (MAX_PROMPTS prompts, MAX_TEXT characters each) raise PromptError naming the line
and the field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fusedspec.compile.documents.base import describe_errors, short_repr
from fusedspec.compile.tokenizer_content import artifact_tokenizer_hash
from fusedspec.core.errors import ArtifactError, PromptError
from fusedspec.core.transformers_names import transformers_names

DEFAULT_PROMPTS = Path(__file__).parent / "prompts" / "default.jsonl"
VARIANTS = ("raw", "chat")
FIELDS = ("id", "class", "text", "variants")
# Classes of the shipped set that count as "structured" in summaries; anything else is open-ended.
STRUCTURED_CLASSES = ("repeat", "sequence", "code", "json")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_PROMPTS = 10_000  # validation runs every prompt through the artifact and the reference
MAX_TEXT = 100_000  # characters per prompt: far beyond any seq_len a backend builds
MAX_FILE_BYTES = 64 << 20


class PromptEntry(BaseModel):
    """One entry of a prompt file, as written."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    id: str | None = Field(default=None, pattern=NAME_PATTERN)
    cls: str = Field(alias="class", pattern=NAME_PATTERN,
                     description="a short name; results are grouped by it")
    text: str = Field(min_length=1, max_length=MAX_TEXT)
    variants: list[Literal["raw", "chat"]] = Field(default=list(("raw", "chat")), min_length=1, max_length=2)

    @field_validator("text")
    @classmethod
    def _not_blank(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("must be a non-empty string")
        return text

    @field_validator("variants")
    @classmethod
    def _distinct(cls, variants: list[str]) -> list[str]:
        if len(set(variants)) != len(variants):
            raise ValueError(f"variants {variants} repeat a name")
        return variants


@dataclass(frozen=True)
class Prompt:
    """One prompt as written in a prompt file."""

    id: str
    cls: str
    text: str
    variants: tuple[str, ...] = VARIANTS

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "class": self.cls, "text": self.text, "variants": list(self.variants)}


@dataclass(frozen=True)
class PromptSet:
    """A checked, ordered prompt set and where it came from."""

    prompts: tuple[Prompt, ...]
    source: str

    @property
    def hash(self) -> str:
        """sha256 over the prompts' content (not the file's bytes or path): caches key on it."""
        payload = json.dumps([p.to_json() for p in self.prompts], sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()

    @property
    def classes(self) -> list[str]:
        return list(dict.fromkeys(p.cls for p in self.prompts))


@dataclass(frozen=True)
class RenderedPrompt:
    """One variant of one prompt, as token ids of the target's tokenizer."""

    id: str  # "<prompt id>:<variant>"
    prompt_id: str
    cls: str
    variant: str
    text: str  # what was encoded (the chat-templated string for `chat`)
    ids: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "class": self.cls, "variant": self.variant, "n_prompt_tokens": len(self.ids)}


# ---- loading ------------------------------------------------------------------------------------


def load_prompt_set(source: str | Path | None = None) -> PromptSet:
    """The shipped set for None or "default"; otherwise the JSONL or YAML file at `source`."""
    if source is None or str(source) == "default":
        return _parse_jsonl(DEFAULT_PROMPTS.read_text(encoding="utf-8"), "default prompt set")
    path = Path(source)
    if not path.is_file():
        raise PromptError(f"prompt file {path}: no such file (give a .jsonl or .yaml file, or 'default')")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise PromptError(f"prompt file {path}: {path.stat().st_size} bytes; a prompt set is at most "
                          f"{MAX_FILE_BYTES >> 20} MiB")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PromptError(f"prompt file {path}: not UTF-8 text ({exc})") from exc
    if path.suffix.lower() in (".yaml", ".yml"):
        return _parse_yaml(text, str(path))
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        return _parse_jsonl(text, str(path))
    raise PromptError(f"prompt file {path}: unknown extension {path.suffix!r}; use .jsonl or .yaml")


def _parse_jsonl(text: str, source: str) -> PromptSet:
    items: list[tuple[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        try:
            items.append((where, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise PromptError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); "
                              "write one JSON object per line") from exc
    return _check(items, source, default_id="line")


def _parse_yaml(text: str, source: str) -> PromptSet:
    # Compose first, so every item keeps the line it started on for error messages.
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise PromptError(f"{source}: not valid YAML ({exc})") from exc
    finally:
        loader.dispose()
    if isinstance(data, dict) and set(data) == {"prompts"}:
        assert isinstance(node, yaml.MappingNode)
        node = node.value[0][1]
        data = data["prompts"]
    if data is None:
        raise PromptError(f"{source}: the file is empty; write a list of prompts with class and text")
    if not isinstance(data, list) or not isinstance(node, yaml.SequenceNode):
        raise PromptError(f"{source}: expected a list of prompts (or a mapping with a 'prompts' list), "
                          f"got {type(data).__name__}")
    items = [(f"{source}, line {item.start_mark.line + 1}", value)
             for item, value in zip(node.value, data, strict=True)]
    return _check(items, source, default_id="item")


def _check(items: Sequence[tuple[str, Any]], source: str, default_id: str) -> PromptSet:
    if not items:
        raise PromptError(f"{source}: the file holds no prompts; write at least one with class and text")
    if len(items) > MAX_PROMPTS:
        raise PromptError(f"{source}: {len(items)} prompts; a validation set holds at most {MAX_PROMPTS} "
                          "(every prompt runs through the artifact and the reference)")
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for index, (where, obj) in enumerate(items, start=1):
        prompt = _prompt(obj, where, f"{default_id}{index}")
        if prompt.id in seen:
            raise PromptError(f"{where}: field 'id': {prompt.id!r} is used twice (first at "
                              f"{seen[prompt.id]}); ids must be unique")
        seen[prompt.id] = where
        prompts.append(prompt)
    return PromptSet(prompts=tuple(prompts), source=source)


def _prompt(obj: Any, where: str, default_id: str) -> Prompt:
    if not isinstance(obj, dict):
        raise PromptError(f"{where}: expected an object with fields class and text, got {type(obj).__name__}")
    try:
        entry = PromptEntry.model_validate(obj)
    except ValidationError as exc:
        raise PromptError(f"{where}: {_entry_problem(exc, obj)}") from None
    return Prompt(id=entry.id or default_id, cls=entry.cls, text=entry.text, variants=tuple(entry.variants))


def _entry_problem(exc: ValidationError, obj: dict[str, Any]) -> str:
    """The first problem of an entry, in the words a prompt-file author needs."""
    # an unknown field first: it is usually a misspelt known one, which is then also "missing"
    err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    name = str(err["loc"][0]) if err["loc"] else "?"
    if err["type"] == "extra_forbidden":
        return f"unknown field {name!r}; allowed fields are {', '.join(FIELDS)}"
    if err["type"] == "missing":
        return f"field {name!r} is missing"
    if name in ("id", "class") and err["type"] in ("string_pattern_mismatch", "string_type"):
        return (f"field {name!r} must be a short name of letters, digits, '-', '_' or '.', "
                f"got {short_repr(err.get('input'))}")
    if name == "text":
        return f"field 'text' must be a non-empty string of at most {MAX_TEXT} characters"
    if name == "variants":
        return (f"field 'variants' must be a non-empty list drawn from {list(VARIANTS)}, got "
                f"{short_repr(obj.get('variants'))}")
    return describe_errors(exc)[0]


# ---- rendering ----------------------------------------------------------------------------------


def load_tokenizer(tokenizer_dir: Path):  # noqa: ANN201 - a transformers tokenizer
    """The tokenizer in `tokenizer_dir` (an artifact or a checkpoint), offline, never remote code."""
    tokenizer_dir = Path(tokenizer_dir)
    if (not (tokenizer_dir / "tokenizer.json").is_file()
            and not (tokenizer_dir / "tokenizer_config.json").is_file()):
        raise ArtifactError(f"{tokenizer_dir}: no tokenizer files (tokenizer.json, tokenizer_config.json); "
                            "an artifact must carry its target's tokenizer: "
                            "rebuild it with `fusedspec compile`")
    # tokenizer.json parsed first: a bad file is named (exit 2), not a crash
    artifact_tokenizer_hash(tokenizer_dir)
    (AutoTokenizer,) = transformers_names("AutoTokenizer")
    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True, trust_remote_code=False)


def render_prompts(prompt_set: PromptSet, tokenizer: Any,
                   variants: Iterable[str] = VARIANTS) -> list[RenderedPrompt]:
    """Every prompt in every requested variant it allows, encoded with `tokenizer`, in file order.

    `chat` wraps the text as one user message with the tokenizer's own chat template and the generation
    prompt (what a chat server sends); the rendered string is then encoded without adding special tokens,
    since the template already holds them.
    """
    wanted = tuple(variants)
    for v in wanted:
        if v not in VARIANTS:
            raise PromptError(f"variant {v!r} is not one of {', '.join(VARIANTS)}")
    if "chat" in wanted and not getattr(tokenizer, "chat_template", None):
        raise PromptError("the target's tokenizer has no chat template (tokenizer_config.json "
                          "'chat_template'); render raw prompts only (--variants raw)")
    rendered: list[RenderedPrompt] = []
    for prompt in prompt_set.prompts:
        for variant in (v for v in wanted if v in prompt.variants):
            if variant == "chat":
                text = tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt.text}], tokenize=False, add_generation_prompt=True
                )
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            else:
                text = prompt.text
                ids = tokenizer(text)["input_ids"]
            rendered.append(RenderedPrompt(id=f"{prompt.id}:{variant}", prompt_id=prompt.id, cls=prompt.cls,
                                           variant=variant, text=text, ids=tuple(int(i) for i in ids)))
    if not rendered:
        raise PromptError(f"{prompt_set.source}: no prompt has any of the variants {list(wanted)}")
    return rendered


def rendered_hash(rendered: Sequence[RenderedPrompt]) -> str:
    """sha256 over the rendered ids and their ids/classes: what a reference is actually computed on."""
    payload = json.dumps([[r.id, r.cls, list(r.ids)] for r in rendered], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()
