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
Unknown fields, empty files and malformed lines raise PromptError naming the line and the field.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from compile.errors import ArtifactError, PromptError
from compile.transformers_names import transformers_names

DEFAULT_PROMPTS = Path(__file__).parent / "prompts" / "default.jsonl"
VARIANTS = ("raw", "chat")
FIELDS = ("id", "class", "text", "variants")
# Classes of the shipped set that count as "structured" in summaries; anything else is open-ended.
STRUCTURED_CLASSES = ("repeat", "sequence", "code", "json")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


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
    items = [(f"{source}, line {item.start_mark.line + 1}", value) for item, value in zip(node.value, data, strict=True)]
    return _check(items, source, default_id="item")


def _check(items: Sequence[tuple[str, Any]], source: str, default_id: str) -> PromptSet:
    if not items:
        raise PromptError(f"{source}: the file holds no prompts; write at least one with class and text")
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for index, (where, obj) in enumerate(items, start=1):
        prompt = _prompt(obj, where, f"{default_id}{index}")
        if prompt.id in seen:
            raise PromptError(f"{where}: field 'id': {prompt.id!r} is used twice (first at {seen[prompt.id]}); "
                              "ids must be unique")
        seen[prompt.id] = where
        prompts.append(prompt)
    return PromptSet(prompts=tuple(prompts), source=source)


def _prompt(obj: Any, where: str, default_id: str) -> Prompt:
    if not isinstance(obj, dict):
        raise PromptError(f"{where}: expected an object with fields class and text, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise PromptError(f"{where}: unknown field {unknown[0]!r}; allowed fields are {', '.join(FIELDS)}")
    for name in ("class", "text"):
        if name not in obj:
            raise PromptError(f"{where}: field {name!r} is missing")
    text, cls = obj["text"], obj["class"]
    if not isinstance(text, str) or not text.strip():
        raise PromptError(f"{where}: field 'text' must be a non-empty string")
    if not isinstance(cls, str) or not _NAME.match(cls):
        raise PromptError(f"{where}: field 'class' must be a short name of letters, digits, '-', '_' or '.', "
                          f"got {cls!r}")
    pid = obj.get("id", default_id)
    if not isinstance(pid, str) or not _NAME.match(pid):
        raise PromptError(f"{where}: field 'id' must be a short name of letters, digits, '-', '_' or '.', "
                          f"got {pid!r}")
    variants = obj.get("variants", list(VARIANTS))
    if (not isinstance(variants, list) or not variants
            or any(v not in VARIANTS for v in variants) or len(set(variants)) != len(variants)):
        raise PromptError(f"{where}: field 'variants' must be a non-empty list drawn from {list(VARIANTS)}, "
                          f"got {variants!r}")
    return Prompt(id=pid, cls=cls, text=text, variants=tuple(variants))


# ---- rendering ----------------------------------------------------------------------------------


def load_tokenizer(tokenizer_dir: Path):  # noqa: ANN201 - a transformers tokenizer
    """The tokenizer in `tokenizer_dir` (an artifact or a checkpoint), offline, never remote code."""
    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "tokenizer.json").is_file() and not (tokenizer_dir / "tokenizer_config.json").is_file():
        raise ArtifactError(f"{tokenizer_dir}: no tokenizer files (tokenizer.json, tokenizer_config.json); "
                            "an artifact must carry its target's tokenizer: rebuild it with `fusedspec compile`")
    (AutoTokenizer,) = transformers_names("AutoTokenizer")
    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True, trust_remote_code=False)


def render_prompts(prompt_set: PromptSet, tokenizer: Any, variants: Iterable[str] = VARIANTS) -> list[RenderedPrompt]:
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
