"""`fusedspec serve` end to end as a pod runs it (issue 14, must-show 2): a tiny cpu version published to
SeaweedFS, `fusedspec k8s` renders its cpu Deployment, the version is copied to a local directory the way
the Mountpoint volume presents it, and the pod's two commands run as local processes: the init container's
verify, then the serving container's `fusedspec serve` (on a free loopback port instead of 0.0.0.0:8000).
The real `openai` client then asks for completions and chat completions, whole and streamed: every answer
is the target's own greedy output, computed by Hugging Face transformers on the target checkpoint alone
(the hf_greedy fixture, validate/reference.py's method)."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI

from fusedspec.core.settings import Settings
from fusedspec.flows.cli import main
from fusedspec.registry.publish import publish_artifact
from fusedspec.validate.prompts import load_tokenizer
from tests.fixtures.servers import free_port
from tests.fixtures.serving import FUSEDSPEC, serve_env
from tests.test_k8s import validate_object

pytestmark = pytest.mark.slow
NEW_TOKENS = 20


def mount_like_mountpoint(client: Any, bucket: str, prefix: str, mount: Path) -> None:
    """What the PV presents at the mount: every object under the version's prefix, as files."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            path = mount / item["Key"][len(prefix):]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())


def with_value(argv: list[str], flag: str, value: str) -> list[str]:
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """A chat prompt as validate/prompts.render_prompts renders its chat variant (what a chat server
    sends)."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def test_the_pods_commands_verify_then_serve_the_targets_greedy_answers(
        seaweed, s3_bucket: str, s3_settings: Settings, serve_artifact: Path,  # noqa: ANN001
        serve_process: Callable[..., Any], hf_greedy: Callable[[list[int], int], list[int]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    result = publish_artifact(serve_artifact, f"s3://{s3_bucket}/serving", s3_settings, unvalidated=True)
    monkeypatch.setenv("FUSEDSPEC_S3_ENDPOINT_URL", seaweed.endpoint)
    assert main(["k8s", result.version_uri, "--mount-root", str(tmp_path / "mdl"), "--s3-endpoint",
                 seaweed.endpoint]) == 0
    found = {d["kind"]: d for d in yaml.safe_load_all(capsys.readouterr().out)}
    pv, deployment = found["PersistentVolume"], found["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    [init], [serve] = pod["initContainers"], pod["containers"]

    # The volume: the version's prefix, mounted where both containers expect it.
    prefix = next(o for o in pv["spec"]["mountOptions"] if o.startswith("prefix "))[len("prefix "):]
    mount = Path(serve["volumeMounts"][0]["mountPath"])
    assert init["volumeMounts"][0]["mountPath"] == str(mount) and mount.name == result.key
    mount_like_mountpoint(seaweed.client(), s3_bucket, prefix, mount)

    # The init container: the version through the S3 API, and the mount.
    verify = subprocess.run([FUSEDSPEC, *init["command"][1:]], env=serve_env(seaweed.env()),
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["ok"] is True

    # The serving container, on loopback.
    port = free_port()
    argv = with_value(with_value(serve["command"], "--host", "127.0.0.1"), "--port", str(port))
    # the pod's environment, but for where it writes (its scratch volume): this test's own work dir
    env = {e["name"]: e["value"] for e in serve["env"]
           if e["name"] not in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "FUSEDSPEC_WORK_DIR")}
    server = serve_process([FUSEDSPEC, *argv[1:]], env=env, port=port)
    seconds_to_ready = server.wait_ready()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        with urllib.request.urlopen(f"{server.url}{serve[probe]['httpGet']['path']}", timeout=5) as answer:
            assert answer.status == 200

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=60, max_retries=0)
    [model] = client.models.list().data
    assert model.model_extra and model.model_extra["max_model_len"] == 128
    tokenizer = load_tokenizer(serve_artifact)

    def expect(prompt_ids: list[int]) -> tuple[list[int], str]:
        tokens = hf_greedy(prompt_ids, NEW_TOKENS)
        return tokens, tokenizer.decode(tokens, skip_special_tokens=True)

    # /v1/completions, whole: text, and token ids.
    for prompt in ("def fibonacci(n):", list(tokenizer("1, 2, 3, 4, 5, 6,")["input_ids"])):
        ids = prompt if isinstance(prompt, list) else list(tokenizer(prompt)["input_ids"])
        tokens, text = expect(ids)
        answer = client.completions.create(model=model.id, prompt=prompt, max_tokens=NEW_TOKENS,
                                           temperature=0)
        [choice] = answer.choices
        assert (choice.model_extra or {})["token_ids"] == tokens and choice.text == text
        assert answer.usage is not None and (answer.usage.prompt_tokens, answer.usage.completion_tokens) == \
            (len(ids), len(tokens))
        assert choice.finish_reason == ("length" if len(tokens) == NEW_TOKENS else "stop")

    # /v1/completions, streamed.
    tokens, text = expect(list(tokenizer("Once upon a time, in a land far away,")["input_ids"]))
    streamed_ids: list[int] = []
    streamed_text = ""
    for chunk in client.completions.create(model=model.id, prompt="Once upon a time, in a land far away,",
                                           max_tokens=NEW_TOKENS, stream=True):
        for choice in chunk.choices:
            streamed_text += choice.text
            streamed_ids += (choice.model_extra or {}).get("token_ids", [])
    assert streamed_ids == tokens and streamed_text == text

    # /v1/chat/completions with the artifact's chat template, whole and streamed.
    question = "Write a haiku about the sea."
    tokens, text = expect(chat_ids(tokenizer, question))
    messages: Any = [{"role": "user", "content": question}]
    reply = client.chat.completions.create(model=model.id, messages=messages, max_tokens=NEW_TOKENS)
    assert reply.choices[0].message.content == text
    assert (reply.choices[0].model_extra or {})["token_ids"] == tokens
    chunks = list(client.chat.completions.create(model=model.id, messages=messages, max_tokens=NEW_TOKENS,
                                                 stream=True, stream_options={"include_usage": True}))
    parts = [chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices]
    assert "".join(parts) == text and len([p for p in parts if p]) > 1  # it did stream, step by step
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(tokens)

    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as answer:
        metrics = answer.read().decode()
    assert 'fusedspec_requests_total{outcome="completed"} 5.0' in metrics
    assert "fusedspec_inter_token_latency_seconds_count" in metrics and "fusedspec_acceptance_rate" in metrics
    validate_object(deployment)
    print(f"time to ready: {seconds_to_ready:.1f} s")
