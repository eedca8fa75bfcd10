"""Text in and out with the artifact's own tokenizer (the target's files, copied in at compile time).

    text = ArtifactText(artifact_dir)
    text.encode_prompt("def f(x):")               # a completion prompt: encoded as is (as `validate` does)
    text.encode_chat([{"role": "user", ...}])     # the chat template, generation prompt, no extra specials
    decoder = text.decoder(); decoder.add(ids)    # the new text of a stream, never half a character

Prompts are rendered exactly as validate/prompts.py renders its raw and chat variants, so what the greedy
gate checked is what the server answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusedspec.core.errors import PromptError
from fusedspec.validate.prompts import load_tokenizer

REPLACEMENT = "\ufffd"  # what decoding yields for a multi-byte character cut in two


class ArtifactText:
    def __init__(self, artifact_dir: Path):
        self.tokenizer = load_tokenizer(artifact_dir)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode_prompt(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        return [int(i) for i in self.tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]]

    def encode_chat(self, messages: Sequence[dict[str, Any]], template_inputs: dict[str, Any] | None = None,
                    add_special_tokens: bool = False) -> list[int]:
        """The messages rendered with the chat template (`template_inputs`: add_generation_prompt, tools,
        documents, the request's chat_template_kwargs; default: the generation prompt, as the gate
        renders), then encoded without extra special tokens unless asked (the template holds them)."""
        if not self.has_chat_template:
            raise PromptError("this artifact's tokenizer has no chat template; use /v1/completions")
        inputs = {"add_generation_prompt": True, **(template_inputs or {})}
        try:
            rendered = self.tokenizer.apply_chat_template(list(messages), tokenize=False, **inputs)
        except Exception as exc:  # noqa: BLE001 - jinja raises its own types for a message it cannot render
            raise PromptError(f"the chat template cannot render these messages: {exc}") from None
        return [int(i) for i in self.tokenizer(rendered, add_special_tokens=add_special_tokens)["input_ids"]]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def decoder(self, skip_special_tokens: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens)


class StreamDecoder:
    """The text a stream has not sent yet. Decoding all tokens so far and sending the new suffix keeps
    word joins right (a token's text depends on its neighbours); a trailing replacement character is
    held back until the token completing the character arrives."""

    def __init__(self, text: ArtifactText, skip_special_tokens: bool = True):
        self.text, self.skip_special_tokens = text, skip_special_tokens
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already sent

    def add(self, ids: Sequence[int], *, final: bool = False, drop_last: bool = False) -> str:
        """The new text of `ids`; `drop_last`: without the last token (the EOS or stop token that ended the
        stream, which vLLM leaves out of the text)."""
        self.ids += ids
        decoded = self.text.decode(self.ids[:-1] if drop_last else self.ids, self.skip_special_tokens)
        if not final and decoded.endswith(REPLACEMENT):
            return ""
        new, self.sent = decoded[self.sent:], len(decoded)
        return new
