"""validate/reference.py's cache: a reference is computed once per key, and a cache entry that is not a
reference (damaged, or of an older format) is computed again rather than trusted or crashed on."""

from __future__ import annotations

from pathlib import Path

from fusedspec.validate.prompts import RenderedPrompt
from fusedspec.validate.reference import Reference, get_reference

PROMPTS = (RenderedPrompt(id="p:raw", prompt_id="p", cls="x", variant="raw", text="", ids=(9707, 1879, 11)),)


def test_a_cached_reference_is_reused_and_a_damaged_entry_computed_again(tiny_target: Path,
                                                                         tmp_path: Path) -> None:
    def reference() -> Reference:
        return get_reference(tiny_target, {"commit": "c" * 40}, PROMPTS, max_new_tokens=4, dtype="float32",
                             eos_token_ids=[151645], cache_dir=tmp_path)

    first = reference()
    path = tmp_path / "reference" / f"{first.key}.json"
    assert not first.from_cache and Reference.read(path).prompts == first.prompts
    second = reference()
    assert second.from_cache and second.prompts == first.prompts and second.key == first.key
    for damaged in ("[]", '{"key": 5}', "not json"):
        path.write_text(damaged)
        again = reference()
        assert not again.from_cache and again.prompts == first.prompts  # computed, the same greedy tokens
        assert Reference.read(path).key == first.key  # and the entry replaced
