"""The tokenizer gate: do the target and the draft turn text into the same ids, with the same meaning?

Speculative decoding compares token ids between two models, so their tokenizers must agree on
everything that decides ids and their meaning:

    vocab          the full token -> id map of the model
    merges         the BPE merge list, in order (order is priority)
    model          the model's own settings (type, byte fallback, unk token, ...)
    added tokens   id, content and the special / normalized / lstrip / rstrip / single_word flags
    normalizer, pre-tokenizer, post-processor, decoder
    special tokens eos / pad / bos / unk (which string, and which id it encodes to)
    settings       tokenizer_config switches that change encoding (add_bos_token, ...)
    chat template  the Jinja template that turns messages into text
    embedding      config.json vocab_size: may differ between the models only above the tokenizer's last
                   id (Qwen pads 151,669 tokens to 151,936; other checkpoints to 152,064), and neither may
                   be smaller than the tokenizer

Files are compared as content (parsed JSON), not bytes, so formatting and key order do not matter.
The report names the first few differences of each kind in words, with the count of each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusedspec.compile.tokenizer_content import (
    ADDED_FLAGS,
    COMPONENTS,
    SPECIAL_ROLES,
    TokenizerContent,
    read_tokenizer_content,
)
from fusedspec.core.errors import TokenizerMismatchError

FIRST = 5  # differences shown per kind; the count says how many there are in all
KINDS = ("vocab", "merges", "model", "added tokens", *COMPONENTS, "special tokens", "settings",
         "chat template", "embedding")


@dataclass
class TokenizerReport:
    a_name: str
    b_name: str
    kinds: dict[str, list[str]] = field(default_factory=dict)  # kind -> first differences in words
    counts: dict[str, int] = field(default_factory=dict)  # kind -> number of differences of that kind
    notes: list[str] = field(default_factory=list)  # things that are fine but worth saying
    tokenizer_hash: str | None = None  # the first tokenizer's hash (equal to the second's when ok)
    hashes: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.counts

    @property
    def differences(self) -> list[str]:
        out: list[str] = []
        for kind in KINDS:
            if kind in self.counts:
                shown = self.kinds[kind]
                more = self.counts[kind] - len(shown)
                out.extend(f"{kind}: {line}" for line in shown)
                if more > 0:
                    out.append(f"{kind}: ... and {more} more ({self.counts[kind]} in all)")
        return out

    def add(self, kind: str, lines: list[str], count: int | None = None) -> None:
        if lines:
            self.kinds[kind] = lines[:FIRST]
            self.counts[kind] = len(lines) if count is None else count

    def summary(self) -> str:
        if self.ok:
            return f"tokenizers match ({self.a_name} and {self.b_name}): {self.tokenizer_hash}"
        kinds = ", ".join(f"{k} ({n})" for k, n in self.counts.items())
        return f"tokenizers of {self.a_name} and {self.b_name} differ in: {kinds}"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "names": [self.a_name, self.b_name], "summary": self.summary(),
                "differences": self.differences, "counts": dict(self.counts), "notes": list(self.notes),
                "tokenizer_hash": self.tokenizer_hash, "hashes": dict(self.hashes)}


def compare_tokenizers(a_dir: Path, b_dir: Path, *, a_name: str = "target",
                       b_name: str = "draft") -> TokenizerReport:
    """Compare two tokenizer directories kind by kind; never raises for a mismatch (see check_tokenizers)."""
    a, b = read_tokenizer_content(a_dir), read_tokenizer_content(b_dir)
    report = TokenizerReport(a_name, b_name)
    names = (a_name, b_name)
    report.add("vocab", *_vocab_differences(a, b, names))
    report.add("merges", *_merge_differences(a.merges, b.merges, names))
    report.add("model", _json_differences(a.model, b.model, "model", names))
    report.add("added tokens", _added_differences(a, b, names))
    for component in COMPONENTS:
        report.add(component, _json_differences(a.components[component], b.components[component],
                                                component, names))
    report.add("special tokens", _special_differences(a, b, names))
    report.add("settings", _json_differences(a.settings, b.settings, "tokenizer_config", names))
    report.add("chat template", _template_differences(a.chat_template, b.chat_template, names))
    embedding, notes = _embedding_problems(a, b, names)
    report.add("embedding", embedding)
    report.notes.extend(notes)
    for name, content in ((a_name, a), (b_name, b)):
        report.hashes[name] = content.content_hash()
    report.tokenizer_hash = report.hashes[a_name]
    return report


def check_tokenizers(a_dir: Path, b_dir: Path, *, a_name: str = "target",
                     b_name: str = "draft") -> TokenizerReport:
    """The gate: the report when the tokenizers match, TokenizerMismatchError (carrying it) when not."""
    report = compare_tokenizers(a_dir, b_dir, a_name=a_name, b_name=b_name)
    if not report.ok:
        lines = "\n".join(f"  - {d}" for d in report.differences)
        raise TokenizerMismatchError(f"{report.summary()}\n{lines}", report=report)
    return report


# -- one function per kind of difference ---------------------------------------------------------


def _vocab_differences(a: TokenizerContent, b: TokenizerContent,
                       names: tuple[str, str]) -> tuple[list[str], int]:
    if a.vocab == b.vocab:  # the common case, at C speed: a Qwen vocabulary is 151k entries
        return [], 0
    an, bn = names
    lines: list[str] = []
    moved = [t for t in a.vocab if t in b.vocab and a.vocab[t] != b.vocab[t]]
    only_a = [t for t in a.vocab if t not in b.vocab]
    only_b = [t for t in b.vocab if t not in a.vocab]
    moved.sort(key=lambda t: a.vocab[t])
    lines += [f"{bn} maps {t!r} to {b.vocab[t]}, {an} to {a.vocab[t]}" for t in moved[:FIRST]]
    lines += [f"{t!r} (id {a.vocab[t]} in {an}) is not in {bn}'s vocabulary" for t in only_a[:FIRST]]
    lines += [f"{t!r} (id {b.vocab[t]} in {bn}) is not in {an}'s vocabulary" for t in only_b[:FIRST]]
    if len(a.vocab) != len(b.vocab):
        lines.insert(0, f"{an} has {len(a.vocab):,} vocabulary tokens, {bn} has {len(b.vocab):,}")
    return lines, len(moved) + len(only_a) + len(only_b) + (len(a.vocab) != len(b.vocab))


def _merge_differences(a: list[str], b: list[str], names: tuple[str, str]) -> tuple[list[str], int]:
    an, bn = names
    differing = [i for i in range(min(len(a), len(b))) if a[i] != b[i]]
    lines = [f"merge #{i}: {an} {a[i]!r}, {bn} {b[i]!r}" for i in differing[:FIRST]]
    count = len(differing)
    if len(a) != len(b):
        lines.insert(0, f"{an} has {len(a):,} merges, {bn} has {len(b):,}")
        count += abs(len(a) - len(b))
    return lines, count


def _added_differences(a: TokenizerContent, b: TokenizerContent, names: tuple[str, str]) -> list[str]:
    """Added tokens matched by their text, so a moved token reads as a move, not as two unrelated ids."""
    an, bn = names
    ids_a = {entry["content"]: tid for tid, entry in a.added.items()}
    ids_b = {entry["content"]: tid for tid, entry in b.added.items()}
    lines: list[str] = []
    for text in sorted(set(ids_a) | set(ids_b), key=lambda t: (ids_a.get(t, ids_b.get(t)), t)):
        if text not in ids_b:
            lines.append(f"{an} has added token {text!r} (id {ids_a[text]}), {bn} does not")
        elif text not in ids_a:
            lines.append(f"{bn} has added token {text!r} (id {ids_b[text]}), {an} does not")
        elif ids_a[text] != ids_b[text]:
            lines.append(f"{bn} maps {text!r} to {ids_b[text]}, {an} to {ids_a[text]}")
        else:
            ea, eb = a.added[ids_a[text]], b.added[ids_b[text]]
            for flag in ADDED_FLAGS:
                if ea[flag] != eb[flag]:
                    lines.append(f"added token {text!r} (id {ids_a[text]}) has {flag}={ea[flag]} in {an}, "
                                 f"{flag}={eb[flag]} in {bn}")
    return lines


def _special_differences(a: TokenizerContent, b: TokenizerContent, names: tuple[str, str]) -> list[str]:
    an, bn = names
    lines = []
    for role in SPECIAL_ROLES:
        ta, tb = a.specials[role], b.specials[role]
        ia, ib = a.token_id(ta), b.token_id(tb)
        if (ta, ia) != (tb, ib):
            lines.append(f"{role.replace('_token', '')} token is {_describe_token(ta, ia)} in {an}, "
                         f"{_describe_token(tb, ib)} in {bn}")
    return lines


def _describe_token(token: str | None, tid: int | None) -> str:
    if token is None:
        return "not set"
    return f"{token!r} (id {tid})" if tid is not None else f"{token!r} (not in the vocabulary)"


def _template_differences(a: Any, b: Any, names: tuple[str, str]) -> list[str]:
    an, bn = names
    if a == b:
        return []
    if a is None or b is None:
        has, lacks = (an, bn) if b is None else (bn, an)
        return [f"{has} has a chat template, {lacks} has none"]
    ta, tb = json.dumps(a) if not isinstance(a, str) else a, json.dumps(b) if not isinstance(b, str) else b
    la, lb = ta.splitlines(), tb.splitlines()
    for i in range(max(len(la), len(lb))):
        xa = la[i] if i < len(la) else "(end)"
        xb = lb[i] if i < len(lb) else "(end)"
        if xa != xb:
            return [f"chat templates differ ({len(ta):,} vs {len(tb):,} characters); first at line {i + 1}: "
                    f"{an} {_clip(xa)!r}, {bn} {_clip(xb)!r}"]
    return ["chat templates differ in line endings or trailing "
            f"whitespace ({len(ta):,} vs {len(tb):,} characters)"]


def _clip(text: str, width: int = 80) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _json_differences(a: Any, b: Any, where: str, names: tuple[str, str]) -> list[str]:
    """The paths at which two JSON values differ, each with both values (shortened)."""
    an, bn = names
    found: list[str] = []

    def walk(x: Any, y: Any, path: str) -> None:
        if x == y:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for key in sorted(set(x) | set(y)):
                walk(x.get(key, _MISSING), y.get(key, _MISSING), f"{path}.{key}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (xi, yi) in enumerate(zip(x, y, strict=True)):
                walk(xi, yi, f"{path}[{i}]")
        else:
            found.append(f"{path}: {an} {_show(x)}, {bn} {_show(y)}")

    walk(a, b, where)
    return found


_MISSING = object()


def _show(value: Any) -> str:
    if value is _MISSING:
        return "(absent)"
    return _clip(json.dumps(value, ensure_ascii=False), 100)


def _embedding_problems(a: TokenizerContent, b: TokenizerContent,
                        names: tuple[str, str]) -> tuple[list[str], list[str]]:
    """Embedding rows must cover every id of the model's tokenizer; beyond that, padding may differ."""
    problems, notes = [], []
    for name, content in zip(names, (a, b), strict=True):
        rows = content.embedding_rows
        if rows is not None and rows < content.size:
            problems.append(f"{name}'s embedding has {rows:,} rows (config.json vocab_size) but its "
                            f"tokenizer produces ids up to {content.size - 1:,}")
    ra, rb = a.embedding_rows, b.embedding_rows
    if not problems and ra is not None and rb is not None and ra != rb:
        notes.append(f"embedding sizes differ ({names[0]} {ra:,}, {names[1]} {rb:,}) only above the last "
                     f"token id {max(a.size, b.size) - 1:,}: padding, fine")
    return problems, notes
