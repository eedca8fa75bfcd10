"""What serving clients send, field by field (issue 25, must-shows 3 and 4): the real `openai` client (and
raw bodies as guidellm and other clients write them) against the serve app in this process, over ASGI, on the
tiny serve build. Every answer is compared with transformers' greedy output of the target alone.

- accepted and exact: `prompt` as a list (one choice per prompt), no `model`, `ignore_eos: true` (the
  target's greedy continuation past EOS), `stop_token_ids`, `stream_options.continuous_usage_stats`, and the
  neutral or greedy values clients send in every body (`ignore_eos: false`, `top_k: -1`, `min_tokens: 0`,
  `repetition_penalty: 1`, `suffix: null`, `response_format: text`, chat `tools: []`, `tool_choice: none`,
  `chat_template_kwargs`);
- refused with 400 naming the field: every value that would change the greedy answer (REFUSED), and fields
  neither vLLM nor OpenAI has (the one rule for unknown fields, serve/protocol.py).

For ignore_eos the artifact must meet an EOS: the tiny random target never emits its own, so a copy of the
build records the 4th greedy token of a prompt as the target's EOS (build.json's arch: what the engine
stops on; the programs do not know EOS). Transformers' greedy output of the unchanged target is then both
answers: cut after that token without ignore_eos, and max_tokens long with it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from fusedspec.compile.backend import get_backend
from fusedspec.serve.app import ServerState, create_app
from fusedspec.serve.engine import Engine
from fusedspec.serve.metrics import ServeMetrics
from fusedspec.serve.text import ArtifactText
from tests.fixtures.serving import SERVE_BUILD

MODEL = "tiny"
PROMPT = "Once upon a time, in a land far away,"
NEW = 12


def serve_state(artifact: Path, runner: Any) -> ServerState:
    metrics = ServeMetrics(runner.spec.speculation_length)
    engine = Engine(runner, metrics, max_queue=8)
    engine.start()
    return ServerState(engine=engine, text=ArtifactText(artifact), metrics=metrics, model_name=MODEL, key="k",
                       seq_len=runner.layout.seq_len, request_timeout_s=60)


@pytest.fixture(scope="module")
def state(build_tiny: Callable[..., Path], cpu_runner: Callable[[Path], Any]) -> Iterator[ServerState]:
    artifact = build_tiny(**SERVE_BUILD)
    served = serve_state(artifact, cpu_runner(artifact))
    yield served
    served.engine.stop()


def call(state: ServerState, work: Callable[[AsyncOpenAI, httpx.AsyncClient], Any]) -> Any:
    """`work` with the real openai client and a raw HTTP client, both on the app in this process."""
    async def run() -> Any:
        transport = httpx.ASGITransport(app=create_app(state))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=60) as http:
            client = AsyncOpenAI(base_url="http://serve/v1", api_key="unused", http_client=http,
                                 max_retries=0)
            return await work(client, http)
    return asyncio.run(run())


def ids_of(state: ServerState, text: str) -> list[int]:
    return state.text.encode_prompt(text)


def test_what_clients_send_in_every_body_is_accepted_and_answered_greedily(
        state: ServerState, hf_greedy: Callable[[list[int], int], list[int]]) -> None:
    expected = hf_greedy(ids_of(state, PROMPT), NEW)
    ordinary = {"ignore_eos": False, "stop_token_ids": [], "top_k": -1, "min_tokens": 0,
                "repetition_penalty": 1, "suffix": None, "response_format": {"type": "text"}, "seed": 3,
                "top_p": 0.9, "min_p": 0.0, "skip_special_tokens": True,
                "spaces_between_special_tokens": True, "priority": 0}

    async def work(client: AsyncOpenAI, http: httpx.AsyncClient) -> None:
        # the openai client, with the extra fields as a client passes them (extra_body)
        answer = await client.completions.create(model=MODEL, prompt=[PROMPT], max_tokens=NEW, temperature=0,
                                                 extra_body=ordinary)
        [choice] = answer.choices
        assert (choice.model_extra or {})["token_ids"] == expected
        assert choice.text == state.text.decode(expected)
        # no `model`: the one served
        raw = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": NEW, **ordinary})
        assert raw.status_code == 200, raw.text
        assert raw.json()["choices"][0]["token_ids"] == expected and raw.json()["model"] == MODEL

    call(state, work)


def test_a_prompt_list_is_a_batch_of_choices_each_the_targets_greedy_output(
        state: ServerState, hf_greedy: Callable[[list[int], int], list[int]]) -> None:
    texts = ["def fibonacci(n):", "1, 2, 3, 4, 5, 6,", PROMPT]
    token_prompt = ids_of(state, "Hello world")

    async def work(client: AsyncOpenAI, _http: httpx.AsyncClient) -> None:
        answer = await client.completions.create(model=MODEL, prompt=texts, max_tokens=NEW)
        assert [c.index for c in answer.choices] == [0, 1, 2]
        for text, choice in zip(texts, answer.choices, strict=True):
            assert (choice.model_extra or {})["token_ids"] == hf_greedy(ids_of(state, text), NEW)
        assert answer.usage is not None and answer.usage.completion_tokens == 3 * NEW
        batch = await client.completions.create(model=MODEL, prompt=[token_prompt, token_prompt[:1]],
                                                max_tokens=4)
        assert [(c.model_extra or {})["token_ids"] for c in batch.choices] == \
            [hf_greedy(token_prompt, 4), hf_greedy(token_prompt[:1], 4)]
        # streamed: every choice's chunks, in any interleaving, add up to its own answer
        got: dict[int, list[int]] = {}
        async for chunk in await client.completions.create(model=MODEL, prompt=texts[:2], max_tokens=NEW,
                                                           stream=True):
            for choice in chunk.choices:
                got.setdefault(choice.index, []).extend((choice.model_extra or {}).get("token_ids", []))
        assert got == {i: hf_greedy(ids_of(state, t), NEW) for i, t in enumerate(texts[:2])}

    call(state, work)


def test_guidellms_body_streams_usage_in_every_chunk(
        state: ServerState, hf_greedy: Callable[[list[int], int], list[int]]) -> None:
    """guidellm 0.8.1 at its defaults (toolbox.md): stream, include_usage and continuous_usage_stats,
    ignore_eos, max_tokens, a text prompt."""
    prompt_ids = ids_of(state, PROMPT)
    body = {"model": MODEL, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_tokens": NEW, "ignore_eos": True, "prompt": PROMPT}

    async def work(_client: AsyncOpenAI, http: httpx.AsyncClient) -> list[dict[str, Any]]:
        answer = await http.post("/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        return [json.loads(line[6:]) for line in answer.text.splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"]

    chunks = call(state, work)
    tokens: list[int] = []
    for chunk in chunks[:-1]:
        tokens += chunk["choices"][0]["token_ids"]
        assert chunk["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": len(tokens),
                                  "total_tokens": len(prompt_ids) + len(tokens)}
    assert tokens == hf_greedy(prompt_ids, NEW)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == NEW


@pytest.fixture(scope="module")
def eos_state(build_tiny: Callable[..., Path], hf_greedy: Callable[[list[int], int], list[int]],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerState, int]]:
    """A copy of the serve build whose target's EOS is the 4th greedy token of PROMPT (see the docstring)."""
    original = build_tiny(**SERVE_BUILD)
    artifact = tmp_path_factory.mktemp("eos") / "artifact"
    shutil.copytree(original, artifact)
    text = ArtifactText(artifact)
    eos = hf_greedy(text.encode_prompt(PROMPT), NEW)[3]
    described = json.loads((artifact / "build.json").read_text())
    described["cpu"]["models"]["target"]["arch"]["eos_token_id"] = [eos]
    (artifact / "build.json").write_text(json.dumps(described))
    served = serve_state(artifact, get_backend("cpu").load(artifact))  # exported programs: no native code
    yield served, eos
    served.engine.stop()


def test_ignore_eos_is_the_targets_greedy_continuation_past_eos(
        eos_state: tuple[ServerState, int], hf_greedy: Callable[[list[int], int], list[int]]) -> None:
    state, eos = eos_state
    greedy = hf_greedy(ids_of(state, PROMPT), NEW)
    cut = greedy[:greedy.index(eos) + 1]
    assert len(cut) < NEW  # the EOS comes inside max_tokens: the two answers differ

    async def work(client: AsyncOpenAI, _http: httpx.AsyncClient) -> None:
        stopped = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NEW)
        assert (stopped.choices[0].model_extra or {})["token_ids"] == cut and \
            stopped.choices[0].finish_reason == "stop"
        past = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NEW,
                                               extra_body={"ignore_eos": True})
        assert (past.choices[0].model_extra or {})["token_ids"] == greedy and \
            past.choices[0].finish_reason == "length"
        streamed: list[int] = []
        async for chunk in await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NEW,
                                                           stream=True, extra_body={"ignore_eos": True}):
            for choice in chunk.choices:
                streamed += (choice.model_extra or {}).get("token_ids", [])
        assert streamed == greedy
        # stop_token_ids: the greedy output cut at the first of them, as EOS would cut it
        early = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NEW,
                                                extra_body={"ignore_eos": True,
                                                           "stop_token_ids": [greedy[1]]})
        assert (early.choices[0].model_extra or {})["token_ids"] == greedy[:2]

    call(state, work)


def test_the_token_that_ended_a_choice_is_left_out_of_its_text_as_vllm_answers(
        eos_state: tuple[ServerState, int], hf_greedy: Callable[[list[int], int], list[int]]) -> None:
    """vLLM's text leaves out the EOS or stop token that ended a choice (its token ids keep it) unless
    include_stop_str_in_output; the server had returned its text, so "a, b<stop>" where vLLM says "a, b"."""
    state, eos = eos_state
    greedy = hf_greedy(ids_of(state, PROMPT), NEW)
    cut = greedy[:greedy.index(eos) + 1]
    stop = greedy[1]

    async def work(_client: AsyncOpenAI, http: httpx.AsyncClient) -> None:
        for fields, ids in (({}, cut), ({"ignore_eos": True, "stop_token_ids": [stop]}, greedy[:2])):
            body = {"prompt": PROMPT, "max_tokens": NEW, **fields}
            whole = (await http.post("/v1/completions", json=body)).json()["choices"][0]
            assert whole["token_ids"] == ids and whole["finish_reason"] == "stop"
            assert whole["text"] == state.text.decode(ids[:-1])
            kept = (await http.post("/v1/completions", json={**body, "include_stop_str_in_output": True}))
            assert kept.json()["choices"][0]["text"] == state.text.decode(ids)
            streamed = await http.post("/v1/completions", json={**body, "stream": True})
            chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
            assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == \
                state.text.decode(ids[:-1])

    call(state, work)


def test_chat_with_the_fields_clients_send_renders_the_template_and_answers_greedily(
        state: ServerState, hf_greedy: Callable[[list[int], int], list[int]]) -> None:
    messages: Any = [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Name a colour."}]
    tokenizer = state.text.tokenizer
    kwargs = {"enable_thinking": False}
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    prompt_ids = list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    expected = hf_greedy(prompt_ids, NEW)

    async def work(client: AsyncOpenAI, _http: httpx.AsyncClient) -> None:
        reply = await client.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=NEW, temperature=0,
            extra_body={"tools": [], "tool_choice": "none", "chat_template_kwargs": kwargs, "top_k": -1,
                        "min_tokens": 0, "repetition_penalty": 1, "response_format": {"type": "text"},
                        "parallel_tool_calls": False})
        assert (reply.choices[0].model_extra or {})["token_ids"] == expected
        assert reply.choices[0].message.content == state.text.decode(expected)
        assert reply.usage is not None and reply.usage.prompt_tokens == len(prompt_ids)

    call(state, work)


def test_an_assistant_message_echoed_from_an_openai_or_vllm_response_is_accepted(
        state: ServerState, hf_greedy: Callable[[list[int], int], list[int]]) -> None:
    """A conversation's history holds the assistant messages earlier answers returned, with the empty fields
    OpenAI's and vLLM's responses carry (refusal, annotations, audio, function_call: null); vLLM accepts
    them, and they were refused as unknown fields."""
    history: Any = [{"role": "user", "content": "Name a colour."},
                    {"role": "assistant", "content": "Blue.", "refusal": None, "annotations": None,
                     "audio": None, "function_call": None, "tool_calls": None},
                    {"role": "user", "content": "Another."}]
    tokenizer = state.text.tokenizer
    plain = [{"role": m["role"], "content": m["content"]} for m in history]
    rendered = tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    expected = hf_greedy(list(tokenizer(rendered, add_special_tokens=False)["input_ids"]), 4)

    async def work(_client: AsyncOpenAI, http: httpx.AsyncClient) -> None:
        answer = await http.post("/v1/chat/completions", json={"messages": history, "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["token_ids"] == expected
        refused = await http.post("/v1/chat/completions", json={"max_tokens": 4, "messages": [
            *history[:1], {**history[1], "refusal": "I cannot."}]})
        assert refused.status_code == 400 and "messages.1.refusal" in refused.json()["error"]["message"]

    call(state, work)


# (body fields, the words the 400 must hold: the field and why). Every value that would change the greedy
# answer stays refused (issue 25, must-show 4).
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"temperature": 0.7}, "temperature=0.7: this server decodes greedily"),
    ({"n": 2}, "n=2: greedy decoding has one answer per prompt"),
    ({"best_of": 3}, "best_of=3"),
    ({"use_beam_search": True}, "use_beam_search=True: beam search is not greedy decoding"),
    ({"presence_penalty": 0.5}, "presence_penalty=0.5: penalties change the greedy output"),
    ({"frequency_penalty": 0.5}, "frequency_penalty=0.5"),
    ({"repetition_penalty": 1.1}, "repetition_penalty=1.1"),
    ({"min_tokens": 4}, "min_tokens=4: holding EOS back changes the greedy output"),
    ({"stop": ["\n"]}, "stop=['\\n']: stop strings are not supported"),
    ({"logprobs": 1}, "logprobs=1: log probabilities are not returned"),
    ({"logprobs": 0}, "logprobs=0: log probabilities are not returned"),
    ({"prompt_logprobs": 1}, "prompt_logprobs=1"),
    ({"echo": True}, "echo=True: echo is not supported"),
    ({"logit_bias": {"100": 5}}, "logit_bias="),
    ({"allowed_token_ids": [1, 2]}, "allowed_token_ids=[1, 2]"),
    ({"bad_words": ["x"]}, "bad_words=['x']"),
    ({"logits_processors": ["mod.Proc"]}, "logits_processors=['mod.Proc']"),
    ({"response_format": {"type": "json_object"}},
     "response_format={'type': 'json_object'}: structured output"),
    ({"guided_regex": "a+"}, "guided_regex='a+': guided decoding"),
    ({"guided_json": {"type": "object"}}, "guided_json="),
    ({"suffix": "end"}, "suffix='end'"),
    ({"vllm_xargs": {"a": 1}}, "vllm_xargs="),
    # a misspelling: unknown fields are refused
    ({"temprature": 0}, "temprature: Extra inputs are not permitted"),
    ({"frobnicate": True}, "frobnicate: Extra inputs are not permitted"),
    ({"top_p": 0}, "top_p: Input should be greater than 0"),
    ({"stream_options": {"include_usage": True, "usage_every": 2}},
     "stream_options.usage_every: Extra inputs"),
]
CHAT_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
     "tool_choice='auto' with tools: this server does not parse tool calls"),
    # no tool_choice with tools is "auto" (OpenAI's and vLLM's default): it was answered as "none", with the
    # model's tool call left unparsed in the text
    ({"tools": [{"type": "function", "function": {"name": "f"}}]},
     "tool_choice='auto' (not given: the default with tools) with tools: this server does not parse tool "
     "calls"),
    ({"top_logprobs": 2, "logprobs": True}, "top_logprobs=2"),
    ({"chat_template": "{{ messages }}"}, "chat_template="),
    ({"chat_template_kwargs": {"add_generation_prompt": False}},
     "chat_template_kwargs add_generation_prompt"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content"),
]


@pytest.mark.parametrize("fields, words", REFUSED, ids=[next(iter(f)) + "-" + str(i) for i, (f, _) in
                                                       enumerate(REFUSED)])
def test_a_value_that_would_change_the_greedy_answer_is_400_naming_the_field(
        state: ServerState, fields: dict[str, Any], words: str) -> None:
    async def work(_client: AsyncOpenAI, http: httpx.AsyncClient) -> httpx.Response:
        return await http.post("/v1/completions",
                               json={"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields})

    answer = call(state, work)
    assert answer.status_code == 400, answer.text
    assert words in answer.json()["error"]["message"], answer.json()["error"]["message"]


@pytest.mark.parametrize("fields, words", CHAT_REFUSED, ids=[next(iter(f)) for f, _ in CHAT_REFUSED])
def test_a_chat_value_that_would_change_the_answer_is_400_naming_the_field(
        state: ServerState, fields: dict[str, Any], words: str) -> None:
    async def work(client: AsyncOpenAI, _http: httpx.AsyncClient) -> None:
        body = {"messages": [{"role": "user", "content": "hi"}], **fields}
        messages = body.pop("messages")
        with pytest.raises(openai.BadRequestError) as refused:  # the client's own error, carrying our message
            await client.chat.completions.create(model=MODEL, max_tokens=2, messages=messages,
                                                 extra_body=body)
        assert words in refused.value.message, refused.value.message

    call(state, work)
