"""How an untrusted JSON document becomes a typed value, once, at the edge.

Every document fusedspec reads back (build.json, validation.json, manifests, LATEST, claims, download
markers, config.json, the Hub-tree and reference caches) is a pydantic model parsed here. A document that
does not parse is one InputError naming the file, the field and what to do (`read`), or, for a cache
entry, a miss (`read_cached`); nothing downstream indexes a raw dict.
"""

from __future__ import annotations

import json
import re
import reprlib
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from fusedspec.core.errors import ArtifactError, InputError

D = TypeVar("D", bound="Document")
MAX_DOCUMENT_BYTES = 64 << 20  # manifests of a TP-128 build are ~100 kB; anything near this is not ours


# scheme://user:password@ in a URL; an error shows the URL without it (errors reach logs)
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#@\s]*@")


class _ShortRepr(reprlib.Repr):
    def repr_str(self, x: str, level: int) -> str:
        return super().repr_str(_USERINFO.sub(r"\1", x), level)


_SHORT = _ShortRepr()  # (keyword arguments only from Python 3.12)
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict = 3, 4, 4, 4
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 40


def short_repr(value: Any, limit: int = 60) -> str:
    """A value as an error shows it: at most `limit` characters, made in bounded time whatever the value
    (a YAML file's aliases can make a list of a billion items from a few hundred bytes), and without the
    user name and password of any URL in it."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe_errors(exc: ValidationError, where: str = "") -> list[str]:
    """pydantic's errors as sentences naming the field and the value it had: `tp_degree=0: ...`."""
    problems = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        message = err["msg"]
        if message.startswith(("Value error, ", "Assertion failed, ")):
            message = message.split(", ", 1)[1]
        else:
            message = message[0].lower() + message[1:]
        if err["type"] == "extra_forbidden":
            problems.append(f"{where}{field}: unknown field (a typo?); remove it")
        elif err["type"] == "missing":
            problems.append(f"{where}{field}: required field is missing")
        elif not field:
            problems.append(f"{where}{message}")
        else:
            shown = short_repr(err.get("input"))
            problems.append(f"{where}{field}={shown}: {message}")
    return problems


class Document(BaseModel):
    """A JSON document between stages: strict (unknown fields are errors), frozen, parsed at the edge.

    Subclasses say what a reader should do about a broken one (`FIX`) and which error it is (`ERROR`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    FIX: ClassVar[str] = "rebuild it"
    ERROR: ClassVar[type[InputError]] = ArtifactError

    @classmethod
    def parse(cls: type[D], data: Any, where: str) -> D:
        """`data` (already decoded JSON) as this document, or ERROR naming `where`, the fields and the fix."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = describe_errors(exc)
            shown = "; ".join(problems[:4]) + (f" (and {len(problems) - 4} more)"
                                               if len(problems) > 4 else "")
            raise cls.ERROR(f"{where}: {shown}; {cls.FIX}") from None

    @classmethod
    def parse_bytes(cls: type[D], data: bytes, where: str) -> D:
        if len(data) > MAX_DOCUMENT_BYTES:
            raise cls.ERROR(f"{where}: {len(data)} bytes is far too large for this document; {cls.FIX}")
        try:
            decoded = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise cls.ERROR(f"{where}: not valid JSON ({exc}); {cls.FIX}") from None
        return cls.parse(decoded, where)

    @classmethod
    def read(cls: type[D], path: Path) -> D:
        """The document in file `path`; ERROR when it is missing, unreadable or malformed."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise cls.ERROR(f"{path}: no such file; {cls.FIX}") from None
        except OSError as exc:
            raise cls.ERROR(f"{path}: cannot be read ({exc.strerror}); {cls.FIX}") from None
        return cls.parse_bytes(data, str(path))

    @classmethod
    def read_cached(cls: type[D], path: Path) -> D | None:
        """The document in cache file `path`, or None when there is none or it is not this document: a
        damaged, foreign or older-format cache entry is a miss (the caller computes it again)."""
        try:
            return cls.read(path)
        except InputError:
            return None

    def to_bytes(self) -> bytes:
        """Canonical encoding: sorted keys, so equal documents are equal bytes (and sign the same)."""
        return (json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()

    def write(self, path: Path) -> None:
        from fusedspec.core.files import atomic_write

        atomic_write(Path(path), self.to_bytes())
