"""How a reference written as text names its kind: `scheme://body`, or no scheme for a local path.

Model references (`hf://`) and store URIs (`s3://`, `file://`) follow the same rule: surrounding space
is ignored, empty text is refused, and any `scheme://` not known to the caller is refused rather than
taken for a directory name, each with an error naming the forms that are accepted. A `scheme://` text with
a user name or password (`user:password@` before its first '/') is refused too, and no message ever shows
that part: credentials come from the environment, never from a URI.
"""

from __future__ import annotations

from fusedspec.core.errors import InputError


def split_scheme(text: str, known: tuple[str, ...], error: type[InputError], what: str,
                 forms: str) -> tuple[str | None, str]:
    """(scheme, body) for `scheme://body` with a scheme in `known` (each written like "hf://"), or
    (None, text) for a plain path; `error` naming `what` and the accepted `forms` otherwise."""
    text = text.strip()
    if not text:
        raise error(f"empty {what}: give {forms}")
    if "://" in text:
        scheme_part, body = text.split("://", 1)
        authority, slash, rest = body.partition("/")
        if "@" in authority:
            shown = f"{scheme_part}://***@{authority.rsplit('@', 1)[1]}{slash}{rest}"
            way = ("a token goes in HF_TOKEN, and a revision is written hf://ORG/NAME@REV" if "hf://" in known
                   else "they come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")
            raise error(f"{what} {shown!r} holds a user name or password (before '@'): credentials never go "
                        f"in a URI; {way}")
    for scheme in known:
        if text.startswith(scheme):
            return scheme, text[len(scheme):]
    if "://" in text:
        raise error(f"{what} {text!r}: unknown scheme {text.split('://', 1)[0]!r}; use {forms}")
    return None, text
