"""Prompt sets: the shipped set, user files (JSONL, YAML), errors naming line and field, rendering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusedspec.core.errors import ArtifactError, PromptError
from fusedspec.validate.prompts import (
    STRUCTURED_CLASSES,
    load_prompt_set,
    load_tokenizer,
    render_prompts,
    rendered_hash,
)


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer: Path):  # noqa: ANN201 - a transformers tokenizer
    return load_tokenizer(qwen3_tokenizer)


def test_shipped_set_has_structured_and_open_classes() -> None:
    ps = load_prompt_set()
    assert set(STRUCTURED_CLASSES) <= set(ps.classes)
    assert "prose" in ps.classes
    assert len({p.id for p in ps.prompts}) == len(ps.prompts)
    assert ps.hash == load_prompt_set("default").hash and ps.hash.startswith("sha256:")


def test_raw_and_chat_variants_use_the_targets_tokenizer(tokenizer) -> None:  # noqa: ANN001
    ps = load_prompt_set()
    rendered = render_prompts(ps, tokenizer)
    assert len(rendered) == 2 * len(ps.prompts)
    raw = {r.prompt_id: r for r in rendered if r.variant == "raw"}
    chat = {r.prompt_id: r for r in rendered if r.variant == "chat"}
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    for pid, r in raw.items():
        assert list(r.ids) == tokenizer(ps.prompts[[p.id for p in ps.prompts].index(pid)].text)["input_ids"]
        assert im_start not in r.ids
        c = chat[pid]
        assert c.ids[0] == im_start and c.text.endswith("<|im_start|>assistant\n")
        # The raw text's tokens appear inside the chat rendering.
        assert tokenizer.decode(list(r.ids)) in tokenizer.decode(list(c.ids))
    assert rendered_hash(rendered) != rendered_hash([r for r in rendered if r.variant == "raw"])


def test_user_jsonl_and_yaml_load_the_same_prompts(tmp_path: Path) -> None:
    rows = [{"id": "a", "class": "repeat", "text": "say a 5 times"},
            {"class": "prose", "text": "Once upon a time", "variants": ["raw"]}]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    yml = tmp_path / "p.yaml"
    yml.write_text("prompts:\n  - id: a\n    class: repeat\n    text: say a 5 times\n"
                   "  - class: prose\n    text: Once upon a time\n    variants: [raw]\n")
    a, b = load_prompt_set(jsonl), load_prompt_set(yml)
    assert [(p.cls, p.text, p.variants) for p in a.prompts] == \
        [(p.cls, p.text, p.variants) for p in b.prompts]
    assert a.prompts[1].id == "line2" and b.prompts[1].id == "item2"
    assert a.prompts[1].variants == ("raw",)
    changed = tmp_path / "q.jsonl"
    changed.write_text(json.dumps({**rows[0], "text": "say b 5 times"}) + "\n" + json.dumps(rows[1]))
    assert load_prompt_set(changed).hash != a.hash


@pytest.mark.parametrize("name, content, words", [
    ("empty.jsonl", "", "holds no prompts"),
    ("blank.jsonl", "\n  \n", "holds no prompts"),
    ("empty.yaml", "", "the file is empty"),
    ("bad.jsonl", '{"class": "x", "text": "ok"}\n{"class": "x", "text": }\n', "line 2: not valid JSON"),
    ("nofield.jsonl", '{"class": "x", "text": "ok"}\n\n{"class": "x"}\n', "line 3: field 'text' is missing"),
    ("noclass.jsonl", '{"text": "ok"}\n', "line 1: field 'class' is missing"),
    ("unknown.jsonl", '{"class": "x", "text": "ok", "temperature": 0}\n',
     "line 1: unknown field 'temperature'"),
    ("emptytext.jsonl", '{"class": "x", "text": "  "}\n', "line 1: field 'text' must be a non-empty"),
    ("variants.jsonl", '{"class": "x", "text": "t", "variants": ["html"]}\n', "line 1: field 'variants'"),
    ("dup.jsonl", '{"id": "a", "class": "x", "text": "t"}\n{"id": "a", "class": "x", "text": "u"}\n',
     "line 2: field 'id': 'a' is used twice"),
    ("notobj.jsonl", '["class", "text"]\n', "line 1: expected an object"),
    ("bad.yaml", "- class: x\n  text: [unclosed\n", "not valid YAML"),
    ("scalar.yaml", "just a string\n", "expected a list of prompts"),
    ("field.yaml", "- class: x\n  text: ok\n- class: y\n  txt: typo\n", "line 3: unknown field 'txt'"),
    ("prompt.txt", "hello\n", "unknown extension"),
])
def test_bad_prompt_files_name_line_and_field(tmp_path: Path, name: str, content: str, words: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(PromptError, match=words.replace("[", r"\[")) as info:
        load_prompt_set(path)
    assert str(path) in str(info.value)
    assert info.value.exit_code == 2


def test_missing_prompt_file_and_missing_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="no such file"):
        load_prompt_set(tmp_path / "nope.jsonl")
    with pytest.raises(ArtifactError, match="no tokenizer files"):
        load_tokenizer(tmp_path)


def test_chat_variant_needs_a_chat_template(tmp_path: Path, qwen3_tokenizer: Path) -> None:
    no_template = tmp_path / "tok"
    no_template.mkdir()
    (no_template / "tokenizer.json").write_bytes((qwen3_tokenizer / "tokenizer.json").read_bytes())
    config = json.loads((qwen3_tokenizer / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (no_template / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(no_template)
    with pytest.raises(PromptError, match="no chat template"):
        render_prompts(load_prompt_set(), tok)
    assert all(r.variant == "raw" for r in render_prompts(load_prompt_set(), tok, variants=["raw"]))
