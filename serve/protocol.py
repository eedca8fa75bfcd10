"""The request bodies of the OpenAI API subset `fusedspec serve` answers, and the shape of its errors.

Greedy only. The server generates what the greedy gate validated: the target's temperature-0 output.
A parameter that would change that output is refused with 400 naming it, unless it holds its greedy
value (temperature 0, top_p 1, n 1, no penalties, no stop strings, no logprobs); `seed` and `user`
are accepted and have nothing to change. An unknown field is refused too (it may be a sampling
parameter of a newer API), so a client never gets an answer computed without what it asked for.
Responses carry each choice's generated token ids (`token_ids`, as vLLM's return_token_ids does).
Integers and booleans are strict: `true` is not token id 1, "3" is not 3 max_tokens, "yes" does not stream.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

# (field, its greedy value, why the server cannot honour another one)
GREEDY_ONLY: tuple[tuple[str, Any, str], ...] = (
    ("temperature", 0, "this server decodes greedily (temperature 0), the output its greedy gate validated"),
    ("top_p", 1, "this server decodes greedily; nucleus sampling does not apply"),
    ("n", 1, "greedy decoding has one answer per prompt; send n=1"),
    ("best_of", 1, "greedy decoding has one answer per prompt; send best_of=1"),
    ("presence_penalty", 0, "penalties change the greedy output; they are not supported"),
    ("frequency_penalty", 0, "penalties change the greedy output; they are not supported"),
    ("stop", None, "stop strings are not supported; generation ends at EOS or max_tokens"),
    ("logprobs", None, "log probabilities are not returned by this server"),
    ("top_logprobs", None, "log probabilities are not returned by this server"),
    ("echo", False, "echo is not supported"),
    ("logit_bias", None, "logit_bias changes the greedy output; it is not supported"),
)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None  # greedy decoding is deterministic: nothing to seed
    user: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: StrictInt | None = None
    best_of: StrictInt | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: str | list[str] | None = None
    logprobs: StrictBool | StrictInt | None = None
    top_logprobs: StrictInt | None = None
    echo: StrictBool | None = None
    logit_bias: dict[str, float] | None = None

    def unsupported(self) -> list[str]:
        """Each parameter set to something other than its greedy value, with the reason."""
        found = []
        for name, greedy, why in GREEDY_ONLY:
            value = getattr(self, name, None)
            if value is None or value == greedy or (name in ("stop", "logit_bias") and not value) \
                    or (name == "logprobs" and value is False):
                continue
            found.append(f"{name}={value!r}: {why}")
        return found

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
    prompt: str | list[StrictInt] = Field(description="one prompt: text, or token ids")
    max_tokens: StrictInt | None = Field(default=16, ge=1)  # OpenAI's default for completions


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def for_template(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)  # None: as many as the artifact's seq_len leaves
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)  # the newer name of max_tokens

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def error_body(message: str, kind: str, *, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error document: the official client raises its typed error carrying this message."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
