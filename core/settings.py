"""The one place that reads the environment.

Everything else receives a `Settings` (or a value from it). Secrets are kept here and never printed:
`Settings.__repr__` leaves them out, and endpoint URLs are checked and stripped of user:password@.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from fusedspec.core.errors import ConfigError


def default_work_dir(environ: dict[str, str] | os._Environ[str]) -> Path:
    """A per-user cache outside any temporary directory (as huggingface_hub keeps ~/.cache/huggingface):
    `$XDG_CACHE_HOME/fusedspec`, else `~/.cache/fusedspec`. A Prefect process worker runs each flow in a
    temporary directory deleted afterwards, so nothing may default to the current directory."""
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "fusedspec"


class WorkSubdir:
    """A directory under the work dir, read as an attribute of Settings (`settings.models_dir`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, settings: Settings, owner: type[Settings]) -> Path:
        return settings.work_dir / self.name


@dataclass(frozen=True)
class Settings:
    work_dir: Path
    hf_endpoint: str | None = None
    hf_token: str | None = field(default=None, repr=False)
    s3_endpoint_url: str | None = None
    aws_region: str | None = None
    neuron_cc_flags: str | None = None
    # Neuron's persistent compile cache as this host sets it; a run config's neuron.compile_cache_url wins
    neuron_compile_cache_url: str | None = None
    builds_budget: int = 20 << 30  # bytes of builds the work dir keeps once they are published
    signing_key: str | None = field(default=None, repr=False)  # Ed25519 private key (PEM or base64 seed)
    verify_key: str | None = field(default=None, repr=False)  # Ed25519 public key (PEM or base64)
    # FUSEDSPEC_PROGRAMS_DIR: one program cache for several work dirs of this host (CI jobs, users of a
    # build box); compile/program_cache.py holds it to the trust rule of a cache of native code
    shared_programs_dir: Path | None = None

    # Where each kind of file lives under the work dir.
    models_dir = WorkSubdir("models")
    builds_dir = WorkSubdir("builds")
    cache_dir = WorkSubdir("cache")
    tmp_dir = WorkSubdir("tmp")
    logs_dir = WorkSubdir("logs")
    default_store = WorkSubdir("store")  # where versions are published when a run config names no store

    @property
    def programs_dir(self) -> Path:
        """Compiled programs by graph key (compile/program_cache.py): the work dir's own, or the shared
        one."""
        return self.shared_programs_dir or self.work_dir / "programs"


def checked_endpoint(name: str, url: str | None) -> str | None:
    """An http(s) endpoint URL, or ConfigError naming the variable. Credentials in the URL are refused:
    they would end up in logs and Kubernetes YAML; boto3's credential chain is the place for them."""
    if not url:
        return None
    example = "https://huggingface.co" if name == "HF_ENDPOINT" else \
        "http://127.0.0.1:8333 or https://s3.us-east-1.amazonaws.com"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsed here, so a port out of range is this error, not a crash later
    except ValueError as exc:  # the URL is not shown: it may hold a password
        raise ConfigError(f"{name} is not a valid URL ({exc}); write e.g. {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name}={redact_url(url)!r} is not an http(s) URL with a host; write e.g. "
                          f"{example}")
    if parts.username or parts.password:
        raise ConfigError(f"{name} carries a user name or password ({redact_url(url)}); remove them from the "
                          "URL and give credentials through AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a "
                          "profile")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")).rstrip("/")


def redact_url(url: str) -> str:
    """The URL for messages and logs, with any user:password@, query and fragment removed."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def backend_plugins(environ: dict[str, str] | os._Environ[str] | None = None) -> tuple[tuple[str, str], ...]:
    """Extra backends by name -> module (FUSEDSPEC_BACKEND_PLUGINS="name=module,..."; the tests plug in one).
    Not a field of Settings: the run config's schema lists the backends (Prefect's form is generated when the
    flow module is imported), and every backend lookup needs them, where no entry point's settings are at
    hand; reading this one variable there costs nothing and reads no secret."""
    env = os.environ if environ is None else environ
    pairs = []
    for item in (env.get("FUSEDSPEC_BACKEND_PLUGINS") or "").split(","):
        if item.strip():
            name, _, module = item.partition("=")
            if not name.strip() or not module.strip():
                raise ConfigError(f"FUSEDSPEC_BACKEND_PLUGINS item {item!r}: write NAME=MODULE")
            pairs.append((name.strip(), module.strip()))
    return tuple(pairs)


SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(name: str, text: str | None, default: int) -> int:
    """`20G`, `500M`, `0` or a byte count; ConfigError naming the variable otherwise."""
    if not text:
        return default
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1] if value and value[-1] in SIZE_UNITS else ""
    number = value[: -1] if unit else value
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if amount < 0:
        raise ConfigError(f"{name}={text!r} is not a size; write e.g. 20G, 500M or 0")
    return int(amount * SIZE_UNITS[unit])


MAX_KEY_FILE_BYTES = 64 * 1024  # an Ed25519 key in PEM is under 200 bytes


def _secret(env: dict[str, str] | os._Environ[str], name: str) -> str | None:
    """A secret from NAME, or from the file NAME_FILE names (a mounted Kubernetes secret)."""
    if env.get(name):
        return env[name]
    path = env.get(f"{name}_FILE")
    if not path:
        return None
    try:
        if Path(path).exists() and not Path(path).is_file():  # a FIFO would block the read forever
            raise ConfigError(f"{name}_FILE={path}: not a regular file; point it at the key file")
        if Path(path).is_file() and Path(path).stat().st_size > MAX_KEY_FILE_BYTES:
            raise ConfigError(f"{name}_FILE={path}: {Path(path).stat().st_size} bytes, more than a key "
                              f"file's {MAX_KEY_FILE_BYTES}; point it at the key file")
        return Path(path).read_text().strip() or None
    except OSError as exc:
        raise ConfigError(f"{name}_FILE={path}: cannot be read ({exc.strerror})") from None


def checked_work_dir(path: Path) -> Path:
    """`path`, unless it or a directory above it is a regular file (then nothing could ever be written
    there: ConfigError now, not an OSError in the middle of a compile). Not checked for writing: a
    reader (a pod's `fusedspec verify`) may run with a read-only one."""
    for part in [path, *path.parents]:
        if part.exists():
            if not part.is_dir():
                raise ConfigError(f"FUSEDSPEC_WORK_DIR={path}: {part} is a file, not a directory; point it "
                                  "at a directory (it is made if missing)")
            return path
    return path


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    work = checked_work_dir(Path(env.get("FUSEDSPEC_WORK_DIR")
                                 or default_work_dir(env)).expanduser().absolute())
    programs = env.get("FUSEDSPEC_PROGRAMS_DIR")
    backend_plugins(env)  # a malformed plugin list is refused at the entry point, before any work
    s3_name = next((n for n in ("FUSEDSPEC_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
                    if env.get(n)), "FUSEDSPEC_S3_ENDPOINT_URL")
    return Settings(
        work_dir=work,
        hf_endpoint=checked_endpoint("HF_ENDPOINT", env.get("HF_ENDPOINT")),
        hf_token=env.get("HF_TOKEN") or None,
        s3_endpoint_url=checked_endpoint(s3_name, env.get(s3_name)),
        aws_region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
        neuron_cc_flags=env.get("NEURON_CC_FLAGS") or None,
        neuron_compile_cache_url=env.get("NEURON_COMPILE_CACHE_URL") or None,
        builds_budget=parse_size("FUSEDSPEC_BUILDS_BUDGET", env.get("FUSEDSPEC_BUILDS_BUDGET"), 20 << 30),
        signing_key=_secret(env, "FUSEDSPEC_SIGNING_KEY"),
        verify_key=_secret(env, "FUSEDSPEC_VERIFY_KEY"),
        shared_programs_dir=Path(programs).expanduser().absolute() if programs else None,
    )


PREFECT_EXTRA_LOGGERS = "PREFECT_LOGGING_EXTRA_LOGGERS"


def export_prefect_settings(environ: dict[str, str] | os._Environ[str] | None = None) -> None:
    """The Prefect settings fusedspec's flows need, put into the environment before Prefect starts (so the
    processes it starts inherit them too): `fusedspec` among Prefect's extra loggers, so what the pipeline
    logs is filed under the run that logged it (flows.logs). A value the user set is extended, not
    replaced."""
    env = os.environ if environ is None else environ
    names = [n.strip() for n in env.get(PREFECT_EXTRA_LOGGERS, "").split(",") if n.strip()]
    if "fusedspec" not in names:
        env[PREFECT_EXTRA_LOGGERS] = ",".join([*names, "fusedspec"])
