"""The run config's `neuron` section: every NxDI setting a user chooses, typed, with NxDI's own rules. Pure.

    NeuronOptions                       the section (run config, Prefect parameter schema, backend options)
    parse_options(data)                 NeuronOptions from the backend options dict, or ConfigError
    build_problems(opts, tp, seq, k)    what NxDI (or one node) would refuse for one build of the matrix
    PLATFORMS                           each Trainium/Inferentia generation's LNC and one serving instance

Everything else of the NeuronConfig is set by the translation (compile.neuron.translate) from the matrix,
so there is no free-form field list to mistype. Every option shapes the compiled NEFFs except
`async_mode`, which NxDI reads only at run time (see RUNTIME_ONLY), and `compile_cache_url`, which says
where Neuron's persistent compile cache lives and is in no key (compile/content_key.py UNKEYED_OPTIONS).

Sources (aws-neuron/neuronx-distributed-inference, "NxDI"; commits as in neuron_config_fields.json):
  - models/config.py `_get_lnc` (0.6.0 e07f056 to 0.9.0 c63afe0): NEURON_LOGICAL_NC_CONFIG wins over the
    field, else the platform's LNC: `get_platform_lnc` is 2 on trn2 (and trn3 from 0.7.0 fcb5a86), else 1;
    neuronx-distributed `utils/model_utils.py` LogicalNCConfig allows 1 and 2 only. The Neuron docs' "Logical
    NeuronCore configuration" page: LNC groups the NeuronCores of a Trainium2 device; a Trainium or
    Inferentia2 device (NeuronCore-v2, two per device) has LNC 1.
  - models/config.py `NeuronConfig.__init__`: context_encoding_buckets sorted, the largest asserted
    `<= max_context_length`; token_generation_buckets sorted, the largest asserted `<= max_length`.
  - modules/autobucketing.py: the lists are read only when enable_bucketing is true (otherwise one graph
    of max_context_length / max_length); without lists, `generate_buckets(128, limit)`.
  - models/model_wrapper.py `get_target_bucket` (0.6.0), `_get_seq_bucket` (0.8.0 on): a fused step at a
    sequence of L tokens takes the first bucket above L + k, or the largest when L + k equals it.
  - models/config.py: async_mode raises IncompatibleConfigError only with Medusa and warns only with
    unfused speculation; NeuronFusedSpecModel stores it and its traced forward never reads it
    (models/model_base.py, c63afe0); models/model_wrapper.py and modules/async_execution.py use it at run
    time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fusedspec.compile.documents.base import describe_errors
from fusedspec.compile.spec import MAX_SEQ_LEN
from fusedspec.core.errors import ConfigError


@dataclass(frozen=True)
class Platform:
    """A Neuron device generation: the LNC values it has, its default (NxDI get_platform_lnc), and the one
    instance size that serves a large model on it (its devices and physical NeuronCores per device)."""

    default_lnc: int
    lncs: tuple[int, ...]
    physical_cores_per_device: int
    devices_per_node: int
    instance_type: str

    def logical_cores_per_device(self, lnc: int) -> int:
        return self.physical_cores_per_device // lnc

    def logical_cores(self, lnc: int) -> int:
        return self.logical_cores_per_device(lnc) * self.devices_per_node


# trn2.48xlarge: 16 Trainium2 devices of 8 NeuronCores; trn1.32xlarge: 16 Trainium devices of 2 NeuronCores;
# inf2.48xlarge: 12 Inferentia2 devices of 2 NeuronCores (Neuron docs, architecture pages). NxDI compiles for
# the generation named here (NEURON_PLATFORM_TARGET_OVERRIDE and the `target` field: the compiler's --target).
PlatformName = Literal["trn2", "trn1", "inf2"]
PLATFORMS: dict[str, Platform] = {
    "trn2": Platform(2, (1, 2), 8, 16, "trn2.48xlarge"),
    "trn1": Platform(1, (1,), 2, 16, "trn1.32xlarge"),
    "inf2": Platform(1, (1,), 2, 12, "inf2.48xlarge"),
}
DEFAULT_PLATFORM: PlatformName = "trn2"
# Named by the SDK (2.27 on) but not built here: NxDI 0.6 of SDK 2.26, the stack whose vLLM serves draft-model
# fused speculation, does not know it (get_platform_lnc learns trn3 in 0.7.0, fcb5a86), and its instance
# sizes were not read from any source.
REFUSED_PLATFORMS = {
    "trn3": "trn3 needs NxDI 0.7 or later (SDK 2.27+), whose vLLM serves EAGLE speculation only; the SDK "
            "2.26.1 stack that serves draft-model fused speculation has no Trainium3 support, so fusedspec "
            "does not build for it (use trn2, trn1 or inf2)",
}
# NeuronConfig fields NxDI reads only at run time: they are written to neuron_config.json (which vLLM loads,
# so the artifact differs) but the compiled graphs are the same with either value. Everything else here
# shapes the NEFFs.
RUNTIME_ONLY = ("async_mode",)

Bucket = Annotated[int, Field(strict=True, ge=1, le=MAX_SEQ_LEN)]
BUCKET_HELP = ("bucket lengths, one compiled graph each; the largest must be the matrix's seq_len; null: "
               "NxDI's own (128, 256, ... doubling, then seq_len)")


class NeuronOptions(BaseModel):
    """The neuron backend's options: they enter every build's content key and are shown by the dry run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    platform: PlatformName = Field(
        default=DEFAULT_PLATFORM, description="the Neuron device generation compiled for: trn2 (Trainium2), "
                                              "trn1 (Trainium), inf2 (Inferentia2)")
    logical_nc_config: int | None = Field(
        default=None, strict=True, ge=1, le=2,
        description="physical NeuronCores per logical core: 1, or 2 (trn2 only); null: the platform's "
                    "default (2 on trn2, 1 elsewhere)")
    enable_bucketing: bool = Field(default=True, strict=True,
                                   description="compile one graph per bucket length (true, as vLLM's Neuron "
                                               "defaults) or one graph of seq_len (false)")
    context_encoding_buckets: list[Bucket] | None = Field(default=None, min_length=1, max_length=64,
                                                          description="prefill " + BUCKET_HELP)
    token_generation_buckets: list[Bucket] | None = Field(default=None, min_length=1, max_length=64,
                                                          description="fused-step " + BUCKET_HELP)
    async_mode: bool = Field(default=False, strict=True,
                             description="NxDI's async mode: the next fused step is launched before the host "
                                         "has the current one's tokens (runtime only; NxDI recommends it)")
    compile_cache_url: str | None = Field(
        default=None, min_length=1, max_length=1024,
        description="Neuron's persistent compile cache for this run's compiles (NEURON_COMPILE_CACHE_URL): "
                    "an absolute directory or s3://bucket/prefix that compile nodes share; null: the host's "
                    "NEURON_COMPILE_CACHE_URL, else Neuron's default. In no key: a cache location changes "
                    "no NEFF")

    @field_validator("platform", mode="before")
    @classmethod
    def _not_refused(cls, value: Any) -> Any:
        if isinstance(value, str) and value in REFUSED_PLATFORMS:
            raise ValueError(REFUSED_PLATFORMS[value])
        return value

    @field_validator("context_encoding_buckets", "token_generation_buckets")
    @classmethod
    def _distinct_sorted(cls, buckets: list[int] | None) -> list[int] | None:
        # NxDI sorts the lists itself (models/config.py); sorted here, two spellings of a list are one key.
        if buckets is not None and len(set(buckets)) != len(buckets):
            raise ValueError(f"{buckets} repeats a length (NxDI would compile that graph twice)")
        return sorted(buckets) if buckets is not None else None

    @model_validator(mode="after")
    def _consistent(self) -> NeuronOptions:
        problems = []
        lists = [name for name in ("context_encoding_buckets", "token_generation_buckets")
                 if getattr(self, name) is not None]
        if lists and not self.enable_bucketing:
            problems.append(f"neuron.{' and neuron.'.join(lists)} would be ignored: NxDI reads bucket lists "
                            "only with enable_bucketing true (modules/autobucketing.py); remove them or set "
                            "enable_bucketing: true")
        platform = PLATFORMS[self.platform]
        if self.logical_nc_config is not None and self.logical_nc_config not in platform.lncs:
            problems.append(f"neuron.logical_nc_config={self.logical_nc_config} needs trn2: LNC groups the "
                            f"NeuronCores of a Trainium2 device, a {self.platform} device has LNC 1 only; "
                            "use logical_nc_config: 1 or platform: trn2")
        if self.compile_cache_url is not None:
            problems += cache_url_problems(self.compile_cache_url)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def lnc(self) -> int:
        """The LNC the build uses (NxDI's _get_lnc: the field, else the platform's)."""
        return (self.logical_nc_config if self.logical_nc_config is not None
                else PLATFORMS[self.platform].default_lnc)

    def key_options(self) -> dict[str, Any]:
        """The options as they enter the content key: every field but the cache location, the LNC resolved
        (so `null` and the platform's default are one build)."""
        return {**self.model_dump(exclude={"compile_cache_url"}), "logical_nc_config": self.lnc}

    def backend_options(self) -> dict[str, Any]:
        """What the backend is given: the key options and, when set, the cache location (which
        compile/content_key.py leaves out of every key and build.json does not record)."""
        cache = {} if self.compile_cache_url is None else {"compile_cache_url": self.compile_cache_url}
        return {**self.key_options(), **cache}


def cache_url_problems(url: str) -> list[str]:
    """Why `url` cannot be NEURON_COMPILE_CACHE_URL (empty when it can). Checked at the model level, so an
    error never echoes the value: a URL with a password in it must not reach a log."""
    where = "neuron.compile_cache_url"
    if any(c.isspace() for c in url):
        return [f"{where} contains white space; give an absolute directory or s3://bucket/prefix"]
    if url.startswith("s3://"):
        parts = urlsplit(url)
        if parts.username is not None or parts.password is not None:
            return [f"{where} carries a user name or password; remove them: the compile's process finds "
                    "S3 credentials through the AWS credential chain (AWS_* variables, a profile, the pod's "
                    "role)"]
        if not parts.hostname or parts.query or parts.fragment:
            return [f"{where}: an S3 cache is s3://bucket or s3://bucket/prefix, without ?query or #fragment"]
        return []
    if not url.startswith("/"):
        return [f"{where} must be an absolute directory (e.g. /work/neuron-compile-cache) or "
                "s3://bucket/prefix; a relative path would depend on the directory each compile runs in"]
    return []


def parse_options(options: dict[str, Any] | None) -> NeuronOptions:
    """The backend options dict (the run config's neuron section, or its key options) as NeuronOptions, or
    ConfigError naming each bad field."""
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"neuron backend options must be a mapping, not {options!r}")
    try:
        return NeuronOptions.model_validate(options or {})
    except ValidationError as exc:
        problems = [p if p.startswith("neuron.") else f"neuron.{p}" for p in describe_errors(exc)]
        raise ConfigError("neuron backend options: " + "; ".join(problems)) from None


def build_problems(opts: NeuronOptions, *, tp: int, seq_len: int, k: int) -> list[str]:
    """What NxDI would assert on, or no node could run, for one build with these options. Empty when fine."""
    problems = []
    platform = PLATFORMS[opts.platform]
    cores = platform.logical_cores(opts.lnc)
    if tp > cores:
        problems.append(f"tp_degree={tp} exceeds the {cores} logical NeuronCores of one "
                        f"{platform.instance_type} at logical_nc_config={opts.lnc}; NxDI serves a model on "
                        f"one node: use tp_degree <= {cores}"
                        + (" or logical_nc_config: 1" if opts.lnc > 1 else ""))
    for name, limit_name in (("context_encoding_buckets", "max_context_length"),
                             ("token_generation_buckets", "max_length")):
        buckets = getattr(opts, name)
        if buckets is None:
            continue
        if buckets[-1] > seq_len:
            problems.append(f"neuron.{name} {buckets}: the largest exceeds seq_len={seq_len}; NxDI asserts "
                            f"it is <= {limit_name}, which is seq_len here (models/config.py)")
        elif buckets[-1] < seq_len:
            problems.append(f"neuron.{name} {buckets}: the largest must be seq_len={seq_len}, or the server "
                            "admits sequences the compiled model has no graph for")
    tkg = opts.token_generation_buckets or []
    never = [b for b in tkg[:-1] if b <= k + 1]
    if never:
        problems.append(f"neuron.token_generation_buckets {never} would never run at k={k}: a fused step at "
                        "L >= 1 tokens needs a bucket above L + k (models/model_wrapper.py); remove them or "
                        f"give lengths above {k + 1}")
    return problems
