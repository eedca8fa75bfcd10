"""The shared vocabulary: model references, model configs in both spellings, specs, matrices, keys."""

from __future__ import annotations

import gc

import pytest

from fusedspec.compile.matrix import plan_matrix
from fusedspec.compile.modelconfig import arch_from_dict
from fusedspec.compile.modelref import parse_model_ref
from fusedspec.compile.runconfig import run_config_from_dict
from fusedspec.compile.spec import BuildSpec
from fusedspec.core.errors import ConfigError, MatrixError, ModelRefError

QWEN3_32B = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 25600,
             "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
             "max_position_embeddings": 40960, "rope_theta": 1000000, "torch_dtype": "bfloat16",
             "tie_word_embeddings": False}
QWEN3_1_7B = {**QWEN3_32B, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
              "num_attention_heads": 16, "tie_word_embeddings": True}


@pytest.mark.parametrize("text, repo, rev", [
    ("hf://Qwen/Qwen3-32B@main", "Qwen/Qwen3-32B", "main"),
    ("hf://Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B", None),
    ("hf://Qwen/Qwen3-1.7B@" + "a" * 40, "Qwen/Qwen3-1.7B", "a" * 40),
])
def test_hub_refs_parse(text: str, repo: str, rev: str | None) -> None:
    ref = parse_model_ref(text)
    assert (ref.repo_id, ref.revision, ref.is_hub) == (repo, rev, True)


@pytest.mark.parametrize("text, words", [
    ("hf://Qwen/../etc", "'..'"),
    ("hf://Qwen//x", "empty"),
    ("hf://Qwen", "exactly one '/'"),
    ("hf:///abs/path", "absolute"),
    ("s3://bucket/model", "unknown scheme"),
    ("/no/such/dir/anywhere", "no such local directory"),
    ("hf://Qwen/Qwen3@", "revision"),
    ("hf://Qwen/Qwen3@../x", "revision"),
])
def test_bad_refs_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ModelRefError, match=words.replace("(", r"\(")):
        parse_model_ref(text)


def test_config_read_in_both_transformers_spellings() -> None:
    v4 = arch_from_dict({**QWEN3_32B, "rope_theta": 1e6, "torch_dtype": "bfloat16"})
    v5 = dict(QWEN3_32B)
    del v5["rope_theta"], v5["torch_dtype"]
    v5.update(rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, dtype="bfloat16")
    assert arch_from_dict(v5) == v4
    assert v4.rope_theta == 1e6 and v4.torch_dtype == "bfloat16" and v4.qk_norm


def test_spec_rejects_impossible_values() -> None:
    with pytest.raises(ConfigError, match="at least 2"):
        BuildSpec(tp_degree=1, seq_len=128, speculation_length=1, batch_size=1)
    with pytest.raises(ConfigError, match="smaller than seq_len"):
        BuildSpec(tp_degree=1, seq_len=8, speculation_length=8, batch_size=1)


def _config(**matrix: object) -> dict:
    base = {"tp_degree": [32], "seq_len": [1024], "speculation_length": [7], "batch_size": [4],
            "dtype": ["bfloat16"]}
    base.update(matrix)
    return {"target": "hf://Qwen/Qwen3-32B", "draft": "hf://Qwen/Qwen3-1.7B", "backend": "neuron",
            "matrix": base}


def test_a_config_names_every_value_out_of_bounds_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        run_config_from_dict(_config(tp_degree=[1048576], speculation_length=[1, 7], batch_size=[0]))
    for words in ("matrix.tp_degree[0]: 1048576 is greater than the maximum of 128",
                  "matrix.speculation_length[0]: 1 is less than the minimum of 2",
                  "matrix.batch_size[0]: 0 is less"):
        assert words in str(info.value)
    assert info.value.exit_code == 2


def test_the_model_accepts_what_its_schema_accepts_and_no_more() -> None:
    """One rule set: the JSON Schema a deployment enforces is the model's (aliases in both, repeats in
    neither, the backend a choice); a config the schema passes, the model passes."""
    from fusedspec.compile.runconfig import run_config_schema, schema_problems

    matrix = run_config_schema()["definitions"]["MatrixConfig"]["properties"]
    assert "bf16" in matrix["dtype"]["items"]["enum"] and matrix["speculation_length"]["uniqueItems"] is True
    assert run_config_schema()["properties"]["backend"]["enum"] == ["cpu", "neuron"]
    aliased = _config(dtype=["bf16"])
    assert schema_problems(aliased) == [] and run_config_from_dict(aliased).matrix.dtype == ["bfloat16"]
    for bad in (_config(speculation_length=[3, 3]), {**_config(), "backend": "neuronx"},
                {**_config(), "target": " "}):
        assert schema_problems(bad)
        with pytest.raises(ConfigError):
            run_config_from_dict(bad)


def test_matrix_reports_every_problem_with_the_models_at_once() -> None:
    cfg = run_config_from_dict(_config(tp_degree=[3, 32], seq_len=[50000, 1024]))
    with pytest.raises(MatrixError) as info:
        plan_matrix(cfg.matrix, "cpu", arch_from_dict(QWEN3_32B), arch_from_dict(QWEN3_1_7B))
    text = "\n".join(info.value.problems)
    for words in ("tp_degree=3", "seq_len=50000"):
        assert words in text
    assert info.value.exit_code == 2
    # NxDI shards a TP that fits neither KV-head count by converting to MHA: the neuron matrix keeps it.
    with pytest.raises(MatrixError) as info:
        plan_matrix(cfg.matrix, "neuron", arch_from_dict(QWEN3_32B), arch_from_dict(QWEN3_1_7B))
    assert "tp_degree=3" not in "\n".join(info.value.problems)


def test_run_config_rejects_unknown_keys_and_empty_lists() -> None:
    with pytest.raises(ConfigError, match="colour"):
        run_config_from_dict({**_config(), "colour": "red"})
    with pytest.raises(ConfigError, match="matrix.tp_degree"):
        run_config_from_dict(_config(tp_degree=[]))


@pytest.mark.parametrize("section, field, flag, bad, good, minimum", [
    ("validation", "max_new_tokens", "--max-new-tokens", 1, 2, ("minimum", 2)),
    ("validation", "near_tie_tolerance", "--tolerance", -0.5, 0.0, ("minimum", 0.0)),
    ("validation", "cost_ratio", "--cost-ratio", 0.0, 0.01, ("exclusiveMinimum", 0)),
    ("matrix", "top_per_class", "--top-per-class", 0, 1, ("minimum", 1)),
])
def test_a_bound_is_one_rule_for_the_run_config_the_cli_and_the_prefect_schema(
        section: str, field: str, flag: str, bad: float, good: float, minimum: tuple[str, float]) -> None:
    from prefect.utilities.callables import parameter_schema

    from fusedspec.compile.runconfig import check_option
    from fusedspec.flows.compile_fused import compile_fused

    config = _config(speculation_length=[5, 7])  # two k: a limit of one (draft, k) per class limits something
    with pytest.raises(ConfigError, match=f"{section}.{field}"):
        run_config_from_dict({**config, section: {**config.get(section, {}), field: bad}})
    with pytest.raises(ConfigError, match=f"^{flag} {bad}: .*{section}.{field} of a run config"):
        check_option(flag, bad, field, section)
    run_config_from_dict({**config, section: {**config.get(section, {}), field: good}})
    check_option(flag, good, field, section)
    model = {"validation": "ValidationConfig", "matrix": "MatrixConfig"}[section]
    schema = parameter_schema(compile_fused.fn).model_dump()["definitions"][model]["properties"][field]
    bounds = schema["anyOf"][0] if "anyOf" in schema else schema  # an optional field: its number branch
    assert bounds[minimum[0]] == minimum[1]  # what a deployment refuses a run for


def test_kept_by_content_makes_a_value_once_per_content_and_drops_the_least_recently_used() -> None:
    from fusedspec.core.kept import KeptByContent

    kept: KeptByContent[str] = KeptByContent(2)
    made: list[str] = []

    def make(value: str) -> str:
        made.append(value)
        return value

    assert kept.get([b"a", None], lambda: make("a")) == "a"
    assert kept.get([b"a", None], lambda: make("again")) == "a"  # the same bytes: kept
    assert kept.get([b"a", b""], lambda: make("a+empty")) == "a+empty"  # an empty part is not a missing one
    kept.get([b"a", None], lambda: make("again"))  # used last: kept when the next one comes
    kept.get([b"b"], lambda: make("b"))  # drops the least recently used: (b"a", b"")
    assert kept.get([b"a", None], lambda: make("again")) == "a"
    assert kept.get([b"a", b""], lambda: make("a+empty, made again")) == "a+empty, made again"
    assert made == ["a", "a+empty", "b", "a+empty, made again"]


def test_the_heap_is_collected_after_dropping_large_weights_only() -> None:
    """A full collection after an export or a validation gives a large model's freed memory back (a real pair
    was OOM-killed without it); for a tiny one it would cost a tenth of an export and give back little."""
    from fusedspec.core.memory import RELEASE_FROM_BYTES, release_freed_memory

    full = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(info)

    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between
    gc.callbacks.append(seen)
    try:
        release_freed_memory(RELEASE_FROM_BYTES - 1)
        assert full == []
        release_freed_memory(RELEASE_FROM_BYTES)
        assert len(full) == 1
    finally:
        gc.callbacks.remove(seen)
        if was_enabled:
            gc.enable()


def test_a_fusedspec_process_collects_young_objects_less_often() -> None:
    """Importing fusedspec.flows (what the CLI, a flow run and a dask worker do first) raises the collector's
    generation-0 threshold: a sixth of a tiny validation's CPU went to collections at CPython's default. How
    often the older generations follow is kept."""
    import json
    import subprocess
    import sys

    from fusedspec.core.memory import GEN0_THRESHOLD

    script = ("import gc, json; before = gc.get_threshold(); import fusedspec.flows.cli; "
              "print(json.dumps([before, gc.get_threshold()]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert after == [GEN0_THRESHOLD, *before[1:]] and before[0] < GEN0_THRESHOLD


@pytest.mark.parametrize("owners", [(0, 10, 10), (50_000, 5, 5)], ids=["collection-off", "higher"])
def test_the_collector_is_left_as_the_process_owner_set_it(owners: tuple[int, int, int]) -> None:
    """An embedding process that turned automatic collection off, or collects less often still, keeps it."""
    from fusedspec.core.memory import tune_collector

    kept = gc.get_threshold()
    try:
        gc.set_threshold(*owners)
        tune_collector()
        assert gc.get_threshold() == owners
    finally:
        gc.set_threshold(*kept)
