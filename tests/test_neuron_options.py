"""The run config's typed `neuron` section (issue 26): what it accepts, how it enters the content key, what
it refuses against the matrix, and the Prefect parameter schema generated from it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fusedspec.compile.neuron.options import RUNTIME_ONLY, NeuronOptions, parse_options
from fusedspec.compile.runconfig import RunConfig, RunConfigError, run_config_from_dict
from fusedspec.core.errors import ConfigError


def config(neuron: dict[str, Any] | None = None, backend: str = "neuron", **matrix: list[int]) -> RunConfig:
    data: dict[str, Any] = {"target": "/m/Qwen3-32B", "draft": "/m/Qwen3-1.7B", "backend": backend,
                            "matrix": {"tp_degree": [32], "seq_len": [1024], "speculation_length": [7],
                                       **matrix}}
    if neuron is not None:
        data["neuron"] = neuron
    return run_config_from_dict(data)


def refusal(neuron: dict[str, Any] | None = None, backend: str = "neuron", **matrix: list[int]) -> str:
    with pytest.raises(RunConfigError) as info:
        config(neuron, backend, **matrix)
    return str(info.value)


def test_the_section_defaults_to_what_the_backend_always_built() -> None:
    opts = config().neuron
    assert opts == NeuronOptions() and opts.lnc == 2
    assert opts.key_options() == {"platform": "trn2", "logical_nc_config": 2, "enable_bucketing": True,
                                  "context_encoding_buckets": None, "token_generation_buckets": None,
                                  "async_mode": False}
    assert config({"platform": "trn1"}).neuron.lnc == 1
    assert config({"platform": "inf2"}, tp_degree=[24]).neuron.lnc == 1


def test_key_options_differ_per_option_and_name_the_lnc_the_build_uses() -> None:
    variants = [{}, {"platform": "trn1"}, {"logical_nc_config": 1}, {"enable_bucketing": False},
                {"async_mode": True}, {"context_encoding_buckets": [512, 1024]},
                {"token_generation_buckets": [512, 1024]}]
    keyed = [json.dumps(config(v).neuron.key_options(), sort_keys=True) for v in variants]
    assert len(set(keyed)) == len(variants)
    # One build, however it is spelt: the platform's default LNC written out, lists in another order.
    assert config({"logical_nc_config": 2}).neuron.key_options() == config().neuron.key_options()
    assert config({"context_encoding_buckets": [1024, 512]}).neuron.key_options() == \
        config({"context_encoding_buckets": [512, 1024]}).neuron.key_options()
    # The key options parse back to the same options (they are what the backend is given).
    opts = config({"platform": "trn1", "async_mode": True}).neuron
    assert parse_options(opts.key_options()).key_options() == opts.key_options()
    # async_mode alone does not shape the compiled graphs (for the graph key to leave out).
    assert RUNTIME_ONLY == ("async_mode",)


@pytest.mark.parametrize("neuron, matrix, words", [
    ({"platform": "trn1"}, {"tp_degree": [16, 64]},
     "tp_degree=64 exceeds the 32 logical NeuronCores of one trn1.32xlarge at logical_nc_config=1"),
    ({}, {"tp_degree": [128]}, "tp_degree=128 exceeds the 64 logical NeuronCores of one trn2.48xlarge at "
                               "logical_nc_config=2; NxDI serves a model on one node: use tp_degree <= 64 or "
                               "logical_nc_config: 1"),
    ({"token_generation_buckets": [512, 1024]}, {"seq_len": [1024, 2048]},
     "neuron.token_generation_buckets [512, 1024]: the largest must be seq_len=2048"),
    ({"context_encoding_buckets": [512, 1024]}, {"seq_len": [512]},
     "the largest exceeds seq_len=512; NxDI asserts it is <= max_context_length"),
    ({"token_generation_buckets": [16, 1024]}, {"speculation_length": [7, 15]},
     "neuron.token_generation_buckets [16] would never run at k=15"),
])
def test_the_section_is_checked_against_every_build_of_the_matrix(neuron: dict[str, Any],
                                                                  matrix: dict[str, Any], words: str) -> None:
    assert words in refusal(neuron, **matrix)


def test_a_neuron_section_for_another_backend_is_refused_but_its_defaults_round_trip() -> None:
    assert "the neuron section applies only to backend: neuron, and this run's backend is cpu" in \
        refusal({"async_mode": True}, backend="cpu")
    cpu = config(backend="cpu")
    # A config sent through JSON (a Prefect parameter, a plan crossing to a worker) carries the defaults.
    again = RunConfig.model_validate(json.loads(cpu.model_dump_json()))
    assert again == cpu and again.neuron == NeuronOptions()


def test_backend_options_outside_a_run_config_are_refused_the_same_way() -> None:
    with pytest.raises(ConfigError, match="neuron.platfrom: unknown field"):
        parse_options({"platfrom": "trn1"})
    with pytest.raises(ConfigError, match="neuron.logical_nc_config=2 needs trn2"):
        parse_options({"platform": "inf2", "logical_nc_config": 2})


def test_the_prefect_parameter_schema_holds_the_section_with_its_choices_and_help() -> None:
    # The schema Prefect enforces on the deployments' runs, generated as `prefect deploy` does.
    from prefect.utilities.callables import parameter_schema

    from fusedspec.flows.compile_fused import compile_fused

    definitions = parameter_schema(compile_fused).model_dump_for_openapi()["definitions"]
    section, schema = definitions["NeuronOptions"], definitions["RunConfig"]
    assert section["additionalProperties"] is False
    props = section["properties"]
    assert set(props) == {"platform", "logical_nc_config", "enable_bucketing", "context_encoding_buckets",
                          "token_generation_buckets", "async_mode", "compile_cache_url"}
    assert props["platform"]["enum"] == ["trn2", "trn1", "inf2"]
    lnc = props["logical_nc_config"]["anyOf"][0]
    assert (lnc["minimum"], lnc["maximum"]) == (1, 2)
    assert all(props[name].get("description") for name in props)
    assert "backend neuron only" in schema["properties"]["neuron"]["description"]


# ---- issue 21: the compile cache's location, in no key ---------------------------------------------------

def test_the_compile_cache_location_is_given_to_the_backend_but_enters_no_key_and_no_build_json() -> None:
    from fusedspec.compile.content_key import key_options, recorded_options
    from fusedspec.flows.planning import key_options as run_options

    plain, cached = config(), config({"compile_cache_url": "s3://neuron-cache/fusedspec"})
    assert cached.neuron.key_options() == plain.neuron.key_options()
    given = run_options(cached)  # what the plan hands the backend
    assert given == {**plain.neuron.key_options(), "compile_cache_url": "s3://neuron-cache/fusedspec"}
    assert key_options(given) == key_options(run_options(plain))  # so every key is the same
    assert "compile_cache_url" not in recorded_options(given)  # and build.json does not name the bucket
    assert parse_options(given).compile_cache_url == "s3://neuron-cache/fusedspec"
    assert config({"compile_cache_url": "/work/neuron-compile-cache"}).neuron.compile_cache_url


@pytest.mark.parametrize("url, words", [
    ("neuron-cache", "must be an absolute directory"),
    ("s3://", "an S3 cache is s3://bucket"),
    ("s3://bucket/x?versionId=1", "without ?query"),
    ("/work/neuron cache", "white space"),
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/cache", "carries a user name or password"),
])
def test_a_cache_location_that_cannot_work_is_refused_without_echoing_credentials(url: str,
                                                                                  words: str) -> None:
    message = refusal({"compile_cache_url": url})
    assert words in message and "neuron.compile_cache_url" in message
    assert "wJalrXUtnFEMI" not in message and "AKIAEXAMPLE" not in message
