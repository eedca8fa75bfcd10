"""The request bodies `fusedspec serve` answers, field by field against vLLM's OpenAI protocol models, and
the shape of its errors.

The server answers with the target's greedy output: what the greedy gate validated. Every field of vLLM's
`CompletionRequest`, `ChatCompletionRequest` and `StreamOptions` (vllm-project/vllm,
vllm/entrypoints/openai/protocol.py at 0052bed), and every request field of OpenAI's own API that vLLM
ignores, is known here by name, and is one of:

- supported exactly: `prompt` as a list (a batch: one choice per prompt), no `model` (the one served),
  `ignore_eos` (the target's greedy continuation past EOS, up to max_tokens), `stop_token_ids` (the
  greedy output cut at the first of them; as vLLM does, the text leaves out the token that ended it, EOS or
  a stop token, unless `include_stop_str_in_output`), `stream_options.continuous_usage_stats` (usage in every
  chunk), `truncate_prompt_tokens`, `skip_special_tokens`, `add_special_tokens`, `request_id`, and in chat the
  template's inputs (`add_generation_prompt`, `continue_final_message`, `documents`,
  `chat_template_kwargs`, `tools` with tool_choice "none", rendered into the template as vLLM renders them);
- NEUTRAL: accepted at any value, because under greedy decoding it cannot change the answer (`seed`;
  `top_k`, `top_p`, `min_p`, which keep the argmax whatever their value; `length_penalty`, used by beam
  search only; `priority`, `cache_salt`, `user`, ...);
- GREEDY_VALUES: accepted at the values that leave the greedy answer as it is (temperature 0, n 1, no
  penalties, no stop strings, no logprobs, no guided decoding, ...) and refused with 400 naming the field
  and why at any other.

Unknown fields are refused too (400 naming them). The choice, and why: vLLM accepts them with a warning
in its log, but every field vLLM knows is known here, so what is left is a field neither API has: most
often a misspelling (`temprature`), or a parameter of a newer API. Either way the client asked for
something the server would not do, and an answer computed without it would look like an answer to the
question asked. The choice is made once, in `ServeModel.model_config` (extra="forbid").

Responses carry each choice's generated token ids (`token_ids`, as vLLM's return_token_ids does).
Integers and booleans are strict: `true` is not token id 1, "3" is not 3 max_tokens, "yes" does not stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

TokenIds = list[StrictInt]
CHAT_TEMPLATE_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                                    "continue_final_message", "tokenize", "chat_template", "return_dict"})


def _none_or(*values: Any) -> Callable[[Any], bool]:
    """None or one of `values`, of the same type (False is not 0: completions' logprobs=0 asks for
    logprobs)."""
    return lambda value: value is None or any(type(value) is type(v) and value == v for v in values)


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value == ""


def _text_format(value: Any) -> bool:
    return value is None or value == {"type": "text"}


def _text_only(value: Any) -> bool:
    return value is None or value == ["text"]


# field -> (does this value leave the greedy answer as it is?, why another value cannot be honoured)
GREEDY_VALUES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (_none_or(0, 0.0), "this server decodes greedily (temperature 0), the output its greedy "
                                      "gate validated; send temperature 0 or leave it out"),
    "n": (_none_or(1), "greedy decoding has one answer per prompt; send n=1"),
    "best_of": (_none_or(1), "greedy decoding has one answer per prompt; send best_of=1"),
    "use_beam_search": (_none_or(False), "beam search is not greedy decoding; it is not supported"),
    "presence_penalty": (_none_or(0, 0.0), "penalties change the greedy output; they are not supported"),
    "frequency_penalty": (_none_or(0, 0.0), "penalties change the greedy output; they are not supported"),
    "repetition_penalty": (_none_or(1, 1.0), "penalties change the greedy output; send 1 or leave it out"),
    "min_tokens": (_none_or(0), "holding EOS back changes the greedy output; send 0 (or ignore_eos: true)"),
    "stop": (_empty, "stop strings are not supported; generation ends at EOS, a stop_token_ids token or "
                     "max_tokens"),
    "logprobs": (_none_or(False), "log probabilities are not returned by this server"),
    "top_logprobs": (_none_or(0), "log probabilities are not returned by this server"),
    "prompt_logprobs": (_none_or(), "log probabilities are not returned by this server"),
    "echo": (_none_or(False), "echo is not supported"),
    "logit_bias": (_empty, "logit_bias changes the greedy output; it is not supported"),
    "allowed_token_ids": (_none_or(), "restricting the vocabulary changes the greedy output; it is not "
                                      "supported"),
    "bad_words": (_empty, "banning words changes the greedy output; it is not supported"),
    "logits_processors": (_empty, "logits processors change the greedy output (and would run code named by "
                                  "the client); they are not supported"),
    "response_format": (_text_format, "structured output changes the greedy output; "
                                      "only {\"type\": \"text\"} is supported"),
    "guided_json": (_none_or(), "guided decoding changes the greedy output; it is not supported"),
    "guided_regex": (_none_or(), "guided decoding changes the greedy output; it is not supported"),
    "guided_choice": (_none_or(), "guided decoding changes the greedy output; it is not supported"),
    "guided_grammar": (_none_or(), "guided decoding changes the greedy output; it is not supported"),
    "structural_tag": (_none_or(), "guided decoding changes the greedy output; it is not supported"),
    "suffix": (_none_or(), "insertion (a suffix) changes the prompt the answer continues; it is not "
                           "supported"),
    "prompt_embeds": (_none_or(), "prompt embeddings are not supported; send text or token ids"),
    "chat_template": (_none_or(), "this server renders the artifact's own chat template, the one its greedy "
                                  "gate used; leave chat_template out (chat_template_kwargs are passed to "
                                  "it)"),
    "mm_processor_kwargs": (_empty, "this server serves a text model; there is no multimodal processor"),
    "kv_transfer_params": (_empty, "disaggregated serving (KV transfer) is not supported"),
    "vllm_xargs": (_empty, "vLLM extension arguments have no meaning here"),
    "modalities": (_text_only, "this server answers with text only"),
    "audio": (_none_or(), "this server answers with text only"),
    "web_search_options": (_none_or(), "web search is not supported"),
    "verbosity": (_none_or(), "verbosity changes the answer; it is not supported"),
    "functions": (_empty, "function calling is not supported (this server does not parse tool calls)"),
    "function_call": (_none_or("none"), "function calling is not supported (this server does not parse tool "
                                        "calls)"),
}

# Accepted at any value: under greedy decoding they cannot change the answer, or they only concern
# scheduling, caching, logging or formats this server does not produce.
NEUTRAL = ("seed", "user", "top_k", "top_p", "min_p", "length_penalty", "spaces_between_special_tokens",
           "priority", "cache_salt", "return_tokens_as_token_ids", "guided_decoding_backend",
           "guided_whitespace_pattern", "parallel_tool_calls", "reasoning_effort", "include_reasoning",
           "store", "metadata", "service_tier", "prediction", "prompt_cache_key", "safety_identifier")


class ServeModel(BaseModel):
    """Every request document: a field this server does not know is refused (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(ServeModel):
    include_usage: StrictBool | None = True  # vLLM's default: stream_options present means usage wanted
    continuous_usage_stats: StrictBool | None = False  # usage (so far) in every chunk


class _Request(ServeModel):
    model: str | None = None  # None: the one model this server serves
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    request_id: str | None = Field(default=None, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")
    # supported exactly
    ignore_eos: StrictBool = False
    stop_token_ids: TokenIds | None = None
    include_stop_str_in_output: StrictBool | None = None  # the text holds the EOS or stop token that ended it
    skip_special_tokens: StrictBool = True
    truncate_prompt_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    # neutral under greedy decoding (validated as vLLM validates them)
    seed: StrictInt | None = None
    user: str | None = None
    top_k: StrictInt | None = Field(default=None, ge=-1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    length_penalty: float | None = None
    spaces_between_special_tokens: StrictBool | None = None
    priority: StrictInt | None = None
    cache_salt: str | None = None
    return_tokens_as_token_ids: StrictBool | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    store: StrictBool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prediction: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # accepted at their greedy values only (GREEDY_VALUES)
    temperature: float | None = None
    n: StrictInt | None = None
    best_of: StrictInt | None = None
    use_beam_search: StrictBool | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: StrictInt | None = None
    stop: str | list[str] | None = None
    prompt_logprobs: StrictInt | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: TokenIds | None = None
    bad_words: list[str] | None = None
    logits_processors: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structural_tag: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    verbosity: str | None = None

    def unsupported(self) -> list[str]:
        """Each field set to a value that would change the greedy answer, with the reason."""
        found = []
        for name, (keeps_greedy, why) in GREEDY_VALUES.items():
            if name in type(self).model_fields and not keeps_greedy(getattr(self, name)):
                found.append(f"{name}={getattr(self, name)!r}: {why}")
        return found

    @property
    def include_usage(self) -> bool:
        """A final chunk with the usage (vLLM: stream_options given, include_usage not false)."""
        return self.stream_options is not None and self.stream_options.include_usage is not False

    @property
    def continuous_usage(self) -> bool:
        options = self.stream_options
        return self.include_usage and options is not None and bool(options.continuous_usage_stats)

    def eos_token_ids(self, target_eos: frozenset[int]) -> list[int]:
        """What ends generation early: the target's EOS (unless ignore_eos), and any stop_token_ids."""
        return sorted((set() if self.ignore_eos else set(target_eos)) | set(self.stop_token_ids or ()))

    def truncated(self, prompt: list[int]) -> list[int]:
        """vLLM's truncate_prompt_tokens: the prompt's last N tokens."""
        limit = self.truncate_prompt_tokens
        return prompt[-limit:] if limit is not None and len(prompt) > limit else prompt


class CompletionRequest(_Request):
    # text, texts (a batch), token ids, or a batch of token-id lists, as vLLM takes them
    prompt: str | list[str] | TokenIds | list[TokenIds]
    # OpenAI's default; null: as many as seq_len leaves
    max_tokens: StrictInt | None = Field(default=16, ge=1)
    add_special_tokens: StrictBool = True
    echo: StrictBool | None = None
    logprobs: StrictInt | None = None
    suffix: str | None = None
    prompt_embeds: str | list[str] | None = None

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per choice: a text or token ids (an empty list is one empty prompt, refused as such)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(item, int) for item in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class ContentPart(ServeModel):
    type: Literal["text"] = Field(description="this server serves a text model: text parts only")
    text: str


class ChatMessage(ServeModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    # what OpenAI's and vLLM's own responses carry on an assistant message, echoed back in a conversation's
    # history: accepted empty (vLLM's template rendering ignores them; a value is no message text here)
    refusal: None = None
    annotations: None = None
    audio: None = None
    function_call: None = None

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it (OpenAI's developer role is the system role)."""
        text = self.content if isinstance(self.content, str) or self.content is None else \
            "".join(part.text for part in self.content)
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": text}
        for extra in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
            if getattr(self, extra) is not None:
                message[extra] = getattr(self, extra)
        return message


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)  # None: as many as the artifact's seq_len leaves
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)  # the newer name of max_tokens
    add_special_tokens: StrictBool = False
    echo: StrictBool | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    reasoning_effort: str | None = None
    include_reasoning: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def unsupported(self) -> list[str]:
        found = super().unsupported()
        # tools without a tool_choice ask for "auto", OpenAI's and vLLM's default when tools are given
        choice = "auto" if self.tools and "tool_choice" not in self.model_fields_set else self.tool_choice
        if self.tools and choice not in ("none", None):
            given = "" if "tool_choice" in self.model_fields_set else " (not given: the default with tools)"
            found.append(f"tool_choice={choice!r}{given} with tools: this server does not parse tool "
                         "calls; send tool_choice \"none\" (the tools are then rendered into the chat "
                         "template, as vLLM does) or no tools")
        if self.continue_final_message and self.add_generation_prompt:
            found.append("continue_final_message=True with add_generation_prompt=True: give one of them "
                         "(add_generation_prompt: false to continue the last message)")
        reserved = sorted(CHAT_TEMPLATE_RESERVED & set(self.chat_template_kwargs or {}))
        if reserved:
            found.append(f"chat_template_kwargs {', '.join(reserved)}: set by the request's own fields, not "
                         "here")
        return found

    def template_inputs(self) -> dict[str, Any]:
        """Everything the chat template is rendered with besides the messages."""
        inputs: dict[str, Any] = dict(self.chat_template_kwargs or {})
        inputs["add_generation_prompt"] = self.add_generation_prompt
        inputs["continue_final_message"] = self.continue_final_message
        if self.tools:
            inputs["tools"] = self.tools
        if self.documents:
            inputs["documents"] = self.documents
        return inputs


def error_body(message: str, kind: str, *, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error document: the official client raises its typed error carrying this message."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
