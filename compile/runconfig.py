"""The run config: one pydantic model that is both the YAML file users write and the flow's parameters.

Unknown keys are errors (never warnings), every list of the matrix is non-empty and without repeats, and
every value carries its bounds and a description. Prefect turns this model into the deployment's
parameter schema, and the server checks a run's parameters against it when the run is created; every
rule of the model is in that schema, so what the server lets through the model accepts too. A file is
checked against the same JSON Schema first (`schema_problems`, every problem at once), so `fusedspec plan`
and a refused deployment run name a mistake in the same words. What JSON Schema cannot say (k below
seq_len, the number of builds, anything that needs the models) is the plan's (compile.matrix, flows).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonDict, JsonValue

from fusedspec.compile.documents.base import describe_errors
from fusedspec.compile.neuron.options import NeuronOptions, build_problems
from fusedspec.compile.spec import (
    DTYPE_ALIASES,
    DTYPES,
    MAX_BATCH,
    MAX_K,
    MAX_SEQ_LEN,
    MAX_TP,
    BatchSize,
    DType,
    SeqLen,
    SpeculationLength,
    TPDegree,
    explain,
)
from fusedspec.core.errors import ConfigError

MIN_NEW_TOKENS = 2  # the first new token comes from context encoding: a fused step needs a second
MAX_NEW_TOKENS = 4096  # validation tokens per prompt; each is a step of the artifact and of the reference
DEFAULT_MAX_NEW_TOKENS = 32
MAX_RUN_CONFIG_BYTES = 1 << 20
MAX_VALUES = 10_000  # values in one run config (a few dozen in practice); YAML aliases can expand to billions
MAX_REASON = 300  # characters of a schema reason shown: jsonschema puts the whole offending value in it


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The bounds of values a CLI option mirrors, shared by the run config (so the Prefect schema) and the CLI's
# options (check_option)
NewTokens = Annotated[int, Field(strict=True, ge=MIN_NEW_TOKENS, le=MAX_NEW_TOKENS)]
Tolerance = Annotated[float, Field(ge=0.0, le=10.0)]
CostRatio = Annotated[float, Field(gt=0, le=10.0)]
MAX_DRAFTS = 8  # each draft is one more matrix of builds
MAX_KS = 16  # values of k in one matrix
# (draft, k) kept per prompt class; the ranking of a class holds at most MAX_DRAFTS * MAX_KS of them
TopPerClass = Annotated[int, Field(strict=True, ge=1, le=MAX_DRAFTS * MAX_KS)]
# The aliases are accepted by the schema as by the model (which turns them into the full names)
ConfigDType = Annotated[DType, WithJsonSchema({"type": "string", "enum": [*DTYPES, *DTYPE_ALIASES]})]
DISTINCT: JsonDict = {"uniqueItems": True}  # a repeated value would plan the same build twice


class MatrixConfig(_Strict):
    """Every combination of these lists is one build."""

    tp_degree: list[TPDegree] = Field(min_length=1, max_length=16, json_schema_extra=DISTINCT,
                                      description=f"tensor-parallel degrees (1..{MAX_TP})")
    seq_len: list[SeqLen] = Field(min_length=1, max_length=16, json_schema_extra=DISTINCT,
                                  description="sequence lengths: prompt + generated tokens "
                                              f"(2..{MAX_SEQ_LEN})")
    speculation_length: list[SpeculationLength] = Field(
        min_length=1, max_length=MAX_KS, json_schema_extra=DISTINCT,
        description="k in NxDI's meaning: at most k tokens per fused "
                    f"step (2..{MAX_K}; k=1 is plain decoding)")
    batch_size: list[BatchSize] = Field(default=[1], min_length=1, max_length=16, json_schema_extra=DISTINCT,
                                    description="sequences served at once, continuous batching "
                                                f"(1..{MAX_BATCH})")
    dtype: list[ConfigDType] = Field(default=["bfloat16"], min_length=1, max_length=3,
                                     json_schema_extra=DISTINCT,
                                     description="float32, bfloat16 or float16 (bf16, fp16, fp32 accepted)")
    top_per_class: TopPerClass | None = Field(
        default=None,
        description="build only the (draft, k) that the k advice ranks among the first N of some prompt "
                    "class, predicted before any compile (the run downloads the weights and runs the "
                    "advice's forward passes first; docs/runs.md says "
                    "what a wrong prediction costs); null: every build")

    @field_validator("tp_degree", "seq_len", "speculation_length", "batch_size", "dtype")
    @classmethod
    def _distinct(cls, values: list[Any]) -> list[Any]:
        if len(set(values)) != len(values):
            raise ValueError(f"{values} has non-unique elements")  # the schema's words (uniqueItems)
        return values

    def size(self) -> int:
        return (len(self.tp_degree) * len(self.seq_len) * len(self.speculation_length) * len(self.batch_size)
                * len(self.dtype))


class ValidationConfig(_Strict):
    prompts: str = Field(default="default", min_length=1,
                         description="'default' (the shipped structured + "
                                     "prose set) or a .jsonl/.yaml prompt file")
    max_new_tokens: NewTokens = Field(
        default=DEFAULT_MAX_NEW_TOKENS,
        description=f"greedy tokens compared per prompt ({MIN_NEW_TOKENS}..{MAX_NEW_TOKENS}: the first comes "
                    "from context encoding, so a fused step needs a second)")
    near_tie_tolerance: Tolerance | None = Field(
        default=None,
        description="logit margin up to which (inclusive) a differing token is a tolerated near-tie; null: "
                    "the dtype's default (float32 1e-4, float16 0.03, bfloat16 0.5)")
    cost_ratio: CostRatio | Annotated[list[CostRatio], Field(min_length=1,
                                                             max_length=MAX_DRAFTS)] | None = Field(
        default=None, description="draft/target decode step cost for the k advice: one number for every "
                                  "draft, or a list of one per draft in the order of `draft`; null: measured")


class CompileOptions(_Strict):
    # The default since issue 14: exported programs took 79-108 s to load for a 1.5B + 0.5B pair and
    # decoded at 79% of the predicted speedup; AOTInductor packages load in ~6 s at 99.5% (bench/RESULTS.md)
    aot_inductor: bool = Field(default=True, description="cpu: package programs with AOTInductor, native "
                               "code for a portable CPU baseline (default; needs a C++ compiler; compiles "
                               "2-4x slower, loads in seconds, decodes faster). false: torch.export "
                               "programs, no compiler")
    target_alone: bool = Field(default=False, description="cpu: also export plain-greedy programs of the "
                               "target alone (the baseline a speedup is measured against)")


class PublishConfig(_Strict):
    uri: str | None = Field(default=None, min_length=1, max_length=1024,
                            description="s3://BUCKET/PREFIX or an absolute directory; null: the work dir's "
                                        "store (FUSEDSPEC_WORK_DIR/store)")
    unvalidated: bool = Field(default=False, description="publish builds that were not put through the "
                              "greedy gate (marked so in the manifest; LATEST never names them)")


class FanOutConfig(_Strict):
    """How the configs of a matrix are spread over workers."""

    mode: Literal["local", "dask", "deployment"] = Field(
        default="local", description="local threads | a Dask cluster | one compile-one flow run per config")
    max_workers: int = Field(default=1, strict=True, ge=1, le=64,
                             description="local and dask: configs compiled at once")
    dask_address: str | None = Field(default=None, description="dask: scheduler address; "
                                                               "null starts a LocalCluster")
    deployment: str = Field(default="compile-one/local", pattern=r"^[^/\s]+/[^/\s]+$",
                            description="deployment mode: the FLOW/DEPLOYMENT run once per config")
    claim_lease_seconds: float = Field(default=120.0, ge=1.0, le=86_400.0,
                                       description="a build claim not renewed for this long is taken over")


def _backend_choices(schema: JsonDict) -> None:
    """The backends as the schema's enum (a drop-down in the form), plugins included where they are set."""
    from fusedspec.compile.backend import backend_names

    choices: list[JsonValue] = [*backend_names()]  # JsonValue's list is invariant: a list[str] is not one
    schema["enum"] = choices


NOT_BLANK = r"\S"  # at least one character that is not white space


ModelReference = Annotated[str, Field(min_length=1, max_length=4096, pattern=NOT_BLANK)]


class RunConfig(_Strict):
    target: ModelReference = Field(description="hf://ORG/NAME[@REVISION] or a local directory")
    draft: ModelReference | Annotated[list[ModelReference], Field(min_length=1, max_length=MAX_DRAFTS,
                                                                  json_schema_extra=DISTINCT)] = Field(
        description="the draft, sharing the target's tokenizer: hf://ORG/NAME[@REVISION] or a directory; or "
                    f"a list of up to {MAX_DRAFTS} drafts, each one more axis value of the matrix (the run's "
                    "advice ranks every (draft, k))")
    backend: str = Field(default="cpu", json_schema_extra=_backend_choices,
                         description="cpu (reference, runs anywhere) or neuron (NxDI on Trainium)")
    matrix: MatrixConfig
    validation: ValidationConfig = ValidationConfig()
    compile: CompileOptions = CompileOptions()
    publish: PublishConfig = PublishConfig()
    fan_out: FanOutConfig = FanOutConfig()
    neuron: NeuronOptions = Field(default=NeuronOptions(), description="backend neuron only: the NxDI "
                                  "settings every build of the matrix is compiled with (docs/trainium.md, "
                                  "The neuron section)")

    @field_validator("target")
    @classmethod
    def _stripped(cls, text: str) -> str:
        return text.strip()

    @field_validator("draft")
    @classmethod
    def _drafts_stripped(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, str):
            return value.strip()
        drafts = [text.strip() for text in value]
        if len(set(drafts)) != len(drafts):
            raise ValueError(f"{drafts} has non-unique elements")  # the schema's words (uniqueItems)
        return drafts

    @property
    def drafts(self) -> tuple[str, ...]:
        """The draft references of the run, in the order given (one for a run with a single draft)."""
        return (self.draft,) if isinstance(self.draft, str) else tuple(self.draft)

    def for_draft(self, draft: str) -> RunConfig:
        """This config with one draft, `draft`, and that draft's own given cost ratio (a run with several
        drafts is planned one draft at a time), without matrix.top_per_class: the limit ranks the run's drafts
        together (the run's config keeps it), and against this one draft's ks a limit the run needs (2 of 2
        drafts x 2 k) would be refused as limiting nothing, whenever the config is validated again."""
        validation = self.validation.model_copy(update={"cost_ratio": self.cost_ratio_of(draft)})
        matrix = self.matrix.model_copy(update={"top_per_class": None})
        return self.model_copy(update={"draft": draft, "validation": validation, "matrix": matrix})

    def cost_ratio_of(self, draft: str) -> float | None:
        """The cost ratio this config gives `draft` (None: measured): the one number, or the draft's own."""
        given = self.validation.cost_ratio
        return given[self.drafts.index(draft)] if isinstance(given, list) else given

    @model_validator(mode="after")
    def _one_cost_ratio_per_draft(self) -> RunConfig:
        given = self.validation.cost_ratio
        if isinstance(given, list) and len(given) != len(self.drafts):
            numbers, drafts = (f"{n} {word}{'s' if n > 1 else ''}"
                               for n, word in ((len(given), "number"), (len(self.drafts), "draft")))
            raise ValueError(f"validation.cost_ratio: {numbers} for {drafts}; give one per draft, in the "
                             "order of `draft`, or one number for every draft")
        return self

    @model_validator(mode="after")
    def _top_per_class_limits(self) -> RunConfig:
        top = self.matrix.top_per_class
        problem = (top_limits_nothing(top, len(self.drafts), len(self.matrix.speculation_length)) if top
                   else None)
        if problem is not None:
            raise ValueError(f"matrix.top_per_class: {problem}")
        return self

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, name: str) -> str:
        from fusedspec.compile.backend import backend_names

        if name not in backend_names():
            raise ValueError(f"{name!r} is not one of {backend_names()!r}")  # the schema's words (its enum)
        return name

    @model_validator(mode="after")
    def _neuron_section_fits(self) -> RunConfig:
        """The neuron section against every build of the matrix (NxDI's bucket and node rules need the
        seq_len, k and TP of each). Settings for another backend would be silently ignored, so they are
        refused (the defaults are not: a config round-tripped through JSON carries them)."""
        if self.backend != "neuron":
            if self.neuron != NeuronOptions():
                raise ValueError("neuron: the neuron section applies only to backend: neuron, and this "
                                 f"run's backend is {self.backend}; remove "
                                 "the section or set backend: neuron")
            return self
        problems: list[str] = []
        for tp in self.matrix.tp_degree:
            for seq_len in self.matrix.seq_len:
                for k in self.matrix.speculation_length:
                    problems += [p for p in build_problems(self.neuron, tp=tp, seq_len=seq_len, k=k)
                                 if p not in problems]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def backend_options(self) -> dict[str, Any]:
        """This run's options for its backend (Backend.build_options fills them in for the host): the neuron
        section for neuron (NeuronOptions.backend_options), the compile section for any other."""
        return self.neuron.backend_options() if self.backend == "neuron" else self.compile.model_dump()


def top_limits_nothing(top: int, drafts: int, ks: int) -> str | None:
    """Why a top N per class is a mistake for `drafts` x `ks` (draft, k), or None: as large as the ranking, it
    keeps every build (a count meant for another matrix) and would only cost the advice's forward passes."""
    if top < drafts * ks:
        return None
    return (f"{top} keeps every (draft, k) of {drafts} draft(s) x {ks} k = {drafts * ks}, so it limits "
            "nothing and would only cost the advice's forward "
            f"passes; give at most {drafts * ks - 1}, or none")


class RunConfigError(ConfigError):
    """A run config that does not parse; `problems` lists each (field, value, what is wrong)."""

    def __init__(self, source: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


def run_config_schema() -> dict[str, Any]:
    """The run config's JSON Schema as Prefect generates a flow parameter's (models under `definitions`)."""
    return _schema(tuple(_backend_names()))


def _backend_names() -> list[str]:
    from fusedspec.compile.backend import backend_names

    return backend_names()


@lru_cache(maxsize=4)
def _schema(backends: tuple[str, ...]) -> dict[str, Any]:  # keyed by the backends: the enum lists them
    schema = RunConfig.model_json_schema(ref_template="#/definitions/{model}")
    schema["definitions"] = schema.pop("$defs")
    return schema


def schema_problems(data: dict[str, Any]) -> list[str]:
    """Every way `data` breaks the run config's JSON Schema, each as `field: reason`. The reason is the
    one a Prefect server gives when it refuses the same value in a deployment run's parameters (it
    names the field `config.FIELD`): jsonschema's best match, which the server raises."""
    import jsonschema
    from jsonschema.exceptions import best_match

    oversized = [f"{key}: holds more than {MAX_VALUES:,} values (expanded YAML aliases?); a run config has a "
                 "few dozen" for key, value in data.items() if _exceeds(value, MAX_VALUES)]
    if oversized:  # jsonschema's messages show the whole value: never walk or print such a one
        return oversized
    validator = jsonschema.Draft202012Validator(run_config_schema())
    found = []
    for error in validator.iter_errors(data):
        best = best_match([error]) or error
        where = best.json_path.removeprefix("$").removeprefix(".")
        reason = _hint(best.message, where)
        reason = reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 3] + "..."
        found.append((where, f"{where or 'run config'}: {reason}"))
    return [problem for _, problem in sorted(found)]


def _oversized(data: dict[str, Any]) -> bool:
    return any(_exceeds(value, MAX_VALUES) for value in data.values())


def _with_model_reasons(problems: list[str], data: dict[str, Any]) -> list[str]:
    """Each schema problem with the model's reason for the same field appended, where a validator of the
    model says more than the schema
    (`neuron.platform: 'trn3' is not one of [...] (trn3 needs NxDI 0.7 ...)`)."""
    try:
        RunConfig.model_validate(data)
        return problems
    except ValidationError as exc:
        reasons = {".".join(str(part) for part in error["loc"]): error["msg"].removeprefix("Value error, ")
                   for error in exc.errors() if error["type"] == "value_error"}
    found = []
    for problem in problems:
        where = problem.split(": ", 1)[0].replace("[", ".").replace("]", "")
        reason = reasons.get(where)
        found.append(problem if reason is None or reason in problem else f"{problem} ({reason})")
    return found


def _nan_fields(value: Any, where: str = "") -> list[str]:
    """Where `value` holds a NaN (YAML's .nan), in the schema's words: `validation.cost_ratio[1]`."""
    if isinstance(value, float) and math.isnan(value):
        return [where or "run config"]
    if isinstance(value, dict):
        return [f for key, item in value.items() for f in _nan_fields(item, f"{where}.{key}".lstrip("."))]
    if isinstance(value, list):
        return [f for i, item in enumerate(value) for f in _nan_fields(item, f"{where}[{i}]")]
    return []


def _exceeds(value: Any, budget: int) -> bool:
    """Whether `value` holds more than `budget` values, counted as far as the budget (not all of them)."""
    stack = [value]
    while stack:
        item = stack.pop()
        budget -= 1
        if budget < 0:
            return True
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    return False


def _hint(message: str, where: str) -> str:
    """The schema's reason, with what to do where the reason alone does not say it."""
    if where.startswith("matrix.speculation_length") and "less than the minimum of 2" in message:
        return message + " (k=1 is plain decoding: k must be at least 2)"
    if (where in ("target", "draft") or where.startswith("draft[")) and "does not match" in message:
        return message + " (it is blank: give hf://ORG/NAME[@REVISION] or a local directory)"
    if "has non-unique elements" in message:
        return message + " (each build would be planned twice)"
    return message


def run_config_from_dict(data: Any, source: str = "run config") -> RunConfig:
    """The run config of `data`, or RunConfigError naming every problem: the schema's (in the words a
    deployment refuses them with, each with the model's own reason for that field where it has one), else
    the model's rules the schema cannot say (the neuron section against the matrix)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with target, draft and matrix, got "
                          f"{type(data).__name__}")
    problems = schema_problems(data)
    if problems:
        raise RunConfigError(source, problems if _oversized(data) else _with_model_reasons(problems, data))
    # NaN (YAML's .nan) meets the schema's bounds, every comparison being false, and the model's words for it
    # were its union's: "validation.cost_ratio.constrained-float=nan: input should be less than or equal..."
    not_numbers = [f"{where}: nan is not a number; give a number (or null where the field takes it)"
                   for where in _nan_fields(data)]
    if not_numbers:
        raise RunConfigError(source, not_numbers)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise RunConfigError(source, [explain(p) for p in describe_errors(exc)]) from None


# The run config sections whose fields CLI options mirror
SECTIONS: dict[str, type[_Strict]] = {"validation": ValidationConfig, "matrix": MatrixConfig}


def check_option(flag: str, value: Any, field: str, section: str = "validation") -> None:
    """ConfigError naming the CLI option `flag` unless `value` is within the bounds of the run config's
    `<section>.<field>`: an option and the run config field it mirrors share one definition."""
    model = SECTIONS[section]
    info = model.model_fields[field]
    shape: Any = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    try:
        TypeAdapter(shape).validate_python(value)
    except ValidationError as exc:
        message = exc.errors()[0]["msg"]
        raise ConfigError(f"{flag} {value}: {message[0].lower() + message[1:]} ({section}.{field} of a run "
                          f"config: {model.model_fields[field].description})") from None


def read_run_config_file(path: Path) -> Any:
    """The run config file's YAML, parsed but not yet checked."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"run config {path}: no such file")
    if path.stat().st_size > MAX_RUN_CONFIG_BYTES:
        raise ConfigError(f"run config {path}: {path.stat().st_size} bytes is not a run config")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"run config {path}: not valid YAML ({exc})") from exc
