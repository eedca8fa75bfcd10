"""What `fusedspec serve` refuses, and how (issue 14): each bad request gets its status and a message that
says what to change, through the real `openai` client or raw HTTP; a version that fails verify is never
served; a full server answers 429 with Retry-After; a client that goes away frees its cache line.

One server for the module (a directory store, as a mount; 4 cache lines, --queue-size 0, so a fifth request
in flight is refused at once).
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from fusedspec.core.settings import Settings
from fusedspec.registry.publish import publish_artifact
from tests.fixtures.servers import free_port, stop_process
from tests.fixtures.serving import FUSEDSPEC, ServeProcess, serve_env
from tests.support.load_clients import client_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, serve_artifact: Path) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("serve-store")
    result = publish_artifact(serve_artifact, str(root), Settings(work_dir=root.parent / "work"),
                              unvalidated=True)
    return root, result.version_uri


@pytest.fixture(scope="module")
def server(store: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    _root, version = store
    port = free_port()
    process = ServeProcess([FUSEDSPEC, "serve", version, "--port", str(port), "--queue-size", "0"],
                           serve_env(), tmp_path_factory.mktemp("serve-log") / "serve.log", port)
    process.wait_ready()
    yield process
    stop_process(process.proc)


def model_of(server: ServeProcess) -> str:
    return client_for(server.url).models.list().data[0].id


def test_another_models_name_is_404_naming_the_served_one(server: ServeProcess) -> None:
    model = model_of(server)
    with pytest.raises(openai.NotFoundError,
                       match=f"model 'gpt-4o' does not exist; this server serves '{model}'"):
        client_for(server.url).completions.create(model="gpt-4o", prompt="hi", max_tokens=2)


@pytest.mark.parametrize("body, words", [
    (b'{"model": "M", "prompt": "hi"', "the body is not valid JSON"),
    (b'{"model": "M"}', "prompt: Field required"),
    (b'{"model": "M", "prompt": "hi", "max_tokens": "many"}', "max_tokens: Input should be a valid integer"),
    (b'{"model": "M", "prompt": "hi", "max_tokens": 0}',
     "max_tokens: Input should be greater than or equal to 1"),
    (b'{"model": "M", "prompt": "hi", "temprature": 0}', "temprature: Extra inputs are not permitted"),
    (b'{"model": "M", "prompt": []}', "the prompt is empty"),
])
def test_malformed_bodies_are_400_naming_the_field(server: ServeProcess, body: bytes, words: str) -> None:
    body = body.replace(b'"M"', f'"{model_of(server)}"'.encode())
    answer = httpx.post(f"{server.url}/v1/completions", content=body,
                        headers={"Content-Type": "application/json"}, timeout=10)
    assert answer.status_code == 400, answer.text
    assert words in answer.json()["error"]["message"]


def test_a_form_body_is_400_asking_for_json(server: ServeProcess) -> None:
    answer = httpx.post(f"{server.url}/v1/completions", data={"model": model_of(server), "prompt": "hi"},
                        timeout=10)
    assert answer.status_code == 400
    assert "the body must be a JSON object, sent with Content-Type: application/json" in \
        answer.json()["error"]["message"]


def test_sampling_parameters_are_refused_not_ignored(server: ServeProcess) -> None:
    client, model = client_for(server.url), model_of(server)
    with pytest.raises(openai.BadRequestError, match="temperature=0.7: this server decodes greedily"):
        client.completions.create(model=model, prompt="hi", max_tokens=2, temperature=0.7)
    with pytest.raises(openai.BadRequestError, match="n=3: greedy decoding has one answer"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], n=3)
    with pytest.raises(openai.BadRequestError, match="stop strings are not supported"):
        client.completions.create(model=model, prompt="hi", max_tokens=2, stop=["\n"])
    # Their greedy values are accepted.
    answer = client.completions.create(model=model, prompt="hi", max_tokens=2, temperature=0, top_p=1, n=1,
                                       seed=7)
    assert answer.usage is not None and answer.usage.completion_tokens == 2


def test_max_tokens_beyond_the_artifacts_seq_len_is_400_saying_the_bound(server: ServeProcess) -> None:
    client, model = client_for(server.url), model_of(server)
    with pytest.raises(openai.BadRequestError,
                       match=r"max_new_tokens=500 = \d+ > seq_len=128 of this artifact"):
        client.completions.create(model=model, prompt="def f(x):", max_tokens=500)
    with pytest.raises(openai.BadRequestError, match="compiled for prompts of at most"):
        client.completions.create(model=model, prompt=list(range(1000, 1200)), max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model=model, prompt=[10**7], max_tokens=1)
    # A chat without max_tokens gets what the seq_len leaves.
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert reply.usage is not None and reply.usage.total_tokens <= 128


def test_the_request_bound_is_the_rule_every_fused_server_applies(server: ServeProcess,
                                                                  serve_artifact: Path) -> None:
    """Issue 26, must-show 3: the cpu server admits prompt + max_tokens up to compile.fused_step.max_model_len
    of its artifact (the rule that sets the neuron Deployment's --max-model-len) and refuses one token
    more."""
    from fusedspec.compile.backend import read_build_description
    from fusedspec.compile.fused_step import max_model_len

    described = read_build_description(serve_artifact)
    assert described.cpu is not None
    longest = max_model_len(described.cpu["cache_len"], described.spec.k)
    client, model = client_for(server.url), model_of(server)
    assert httpx.get(f"{server.url}/v1/models", timeout=5).json()["data"][0]["max_model_len"] == longest
    prompt = list(range(1000, 1100))  # a long prompt: few tokens to generate up to the bound
    answer = client.completions.create(model=model, prompt=prompt, max_tokens=longest - len(prompt))
    assert answer.usage is not None and answer.usage.prompt_tokens + answer.usage.completion_tokens <= longest
    with pytest.raises(openai.BadRequestError,
                       match=rf"max_new_tokens={longest - len(prompt) + 1} = {longest + 1} > "):
        client.completions.create(model=model, prompt=prompt, max_tokens=longest - len(prompt) + 1)


def outcome_counts(server: ServeProcess) -> dict[str, float]:
    counts = {}
    for line in httpx.get(f"{server.url}/metrics", timeout=5).text.splitlines():
        if line.startswith("fusedspec_requests_total{"):
            name, value = line.split(" ")
            counts[name.split('"')[1]] = float(value)
        elif line.startswith("fusedspec_active_lines "):
            counts["active_lines"] = float(line.split(" ")[1])
    return counts


def test_requests_beyond_lines_and_queue_are_429_with_retry_after_never_queued_without_bound(
        server: ServeProcess) -> None:
    client, model = client_for(server.url), model_of(server)

    def one(_: int) -> str:
        try:
            answer = client.completions.create(model=model, prompt="Once upon a time", max_tokens=100)
            return f"ok:{answer.usage.completion_tokens if answer.usage else 0}"
        except openai.RateLimitError as exc:
            assert exc.response.headers["Retry-After"] == "1"
            assert "all 4 cache lines are decoding and 0 requests are waiting; retry later" in exc.message
            return "429"

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        outcomes = list(pool.map(one, range(12)))
    assert "429" in outcomes and set(outcomes) <= {"429", "ok:100"}, outcomes
    assert outcome_counts(server)["rejected_queue_full"] >= outcomes.count("429")


def test_a_client_that_goes_away_mid_stream_frees_its_line(server: ServeProcess) -> None:
    before = outcome_counts(server)
    body = {"model": model_of(server), "prompt": "Once upon a time", "max_tokens": 120, "stream": True}
    with httpx.Client(timeout=10) as http:
        streams = [http.stream("POST", f"{server.url}/v1/completions", json=body) for _ in range(4)]
        for stream in streams:
            response = stream.__enter__()
            assert response.status_code == 200
            next(response.iter_lines())  # the first chunk: this request holds a cache line
        for stream in streams:
            stream.__exit__(None, None, None)  # the client goes away
    gone = disconnected_once_settled(server, before, requests=4)
    assert gone >= 1  # streams still decoding when their client left were cancelled, not run to the end
    answer = client_for(server.url).completions.create(model=body["model"], prompt="hi", max_tokens=3)
    assert answer.usage is not None and answer.usage.completion_tokens == 3


def test_a_client_that_gives_up_on_a_whole_answer_frees_its_line(server: ServeProcess) -> None:
    before = outcome_counts(server)
    body = {"model": model_of(server), "prompt": "Once upon a time", "max_tokens": 120}

    def give_up(_: int) -> None:
        with pytest.raises(httpx.TimeoutException):  # the client closes its connection
            httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.05)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(give_up, range(4)))
    gone = disconnected_once_settled(server, before, requests=4)
    assert gone >= 1  # noticed within DISCONNECT_POLL_S and cancelled, not decoded to the end


def test_a_version_that_fails_verify_is_never_served(serve_artifact: Path, tmp_path: Path) -> None:
    version = publish_artifact(serve_artifact, str(tmp_path / "store"), Settings(work_dir=tmp_path / "work"),
                               unvalidated=True).version_uri
    [build_json] = Path(version).glob("*/build.json")
    build_json.write_bytes(build_json.read_bytes().replace(b'"cpu"', b'"CPU"', 1))  # same size, other bytes
    port = free_port()
    refused = subprocess.run([FUSEDSPEC, "serve", version, "--port", str(port)], env=serve_env(),
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"refusing to serve {version}: it failed verify against its manifest" in refused.stderr
    assert "  - build.json: changed since it was published" in refused.stderr
    assert "starting" not in refused.stdout  # it never loaded the artifact, never listened
    nothing = subprocess.run([FUSEDSPEC, "serve", str(tmp_path / "empty")], env=serve_env(),
                             capture_output=True, text=True, timeout=120)
    assert nothing.returncode == 2 and "nothing to verify" in nothing.stderr


def disconnected_once_settled(server: ServeProcess, before: dict[str, float], *, requests: int) -> float:
    """How many of `requests` ended as client disconnects, once each has ended (disconnected or completed)
    and no cache line is busy; fails after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        after = outcome_counts(server)
        gone = after["client_disconnected"] - before["client_disconnected"]
        finished = after["completed"] - before["completed"]
        if gone + finished == requests and after["active_lines"] == 0:
            return gone
        assert time.monotonic() < deadline, f"{before} -> {after}"
        time.sleep(0.1)
