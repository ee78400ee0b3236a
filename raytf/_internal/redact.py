"""Credentials a user puts in a storage URI, kept out of everything raytf shows.

pyarrow takes S3 keys only inside the URI (``s3://KEY:SECRET@bucket/prefix``), so a storage path
can hold a secret. raytf prints, logs, raises and returns the URI as :func:`redact` shows it, hides
the secrets in any text that may repeat them (:func:`scrub`: pyarrow's own errors do), and keeps
the whole URI only where a filesystem is opened with it. No Ray, TensorFlow or pyarrow import:
the configs use it too.
"""

from __future__ import annotations

import os
import re
import urllib.parse

# Query options whose values are secrets: pyarrow's (``secret_key``, ``session_token``, ...) and
# any other store's (``password``, ``sas_token``, a signed URL's ``X-Amz-Signature``).
_SECRET_OPTION = re.compile(r"secret|passw|token|credential|signature|(^|_)key$|^key|sig$", re.IGNORECASE)
HIDDEN = "***"


def _split(text: str) -> tuple[str, str, str, str]:
    """(scheme, user info, the rest before the query, query) of a URI. The user info runs to the
    last ``@`` before the query where it holds a ``:`` or no ``/``: an AWS secret may hold ``/``
    unescaped (``s3://KEY:abc/def@bucket``), which a plain URL parser would read as a path."""
    scheme, _, rest = text.partition("://")
    before, _, query = rest.partition("?")
    userinfo, at, after = before.rpartition("@")
    if at and (":" in userinfo or "/" not in userinfo):
        return scheme, userinfo, after, query
    return scheme, "", before, query


def _is_secret(key: str) -> bool:
    return bool(_SECRET_OPTION.search(urllib.parse.unquote(key)))


def redact(uri: str | os.PathLike) -> str:
    """``uri`` as raytf shows it: user info (pyarrow takes S3 keys as ``s3://KEY:SECRET@bucket``)
    and secret-like query values replaced by ``***``. A local path comes back unchanged.

    Every URI raytf prints, logs, raises or returns goes through this; the full URI stays only
    where a filesystem is opened with it."""
    text = os.fspath(uri)
    if "://" not in text:
        return text
    scheme, userinfo, rest, query = _split(text)
    if userinfo:
        rest = (f"{HIDDEN}:{HIDDEN}@" if ":" in userinfo else f"{HIDDEN}@") + rest
    pairs = [pair.partition("=") for pair in query.split("&") if pair]
    shown = "&".join(f"{key}={HIDDEN}" if value and _is_secret(key) else key + sep + value for key, sep, value in pairs)
    return f"{scheme}://{rest}" + (f"?{shown}" if shown else "")


def secrets_in(uri: str | os.PathLike) -> list[str]:
    """The secret parts of ``uri`` that :func:`redact` hides, as they may appear in other text
    (an error of pyarrow's that repeats them), longest first; each also percent-decoded."""
    text = os.fspath(uri)
    if "://" not in text:
        return []
    _, userinfo, _, query = _split(text)
    found = [userinfo, *userinfo.split(":", 1)] if userinfo else []
    found += [value for key, _, value in (p.partition("=") for p in query.split("&") if p) if value and _is_secret(key)]
    found += [urllib.parse.unquote(s) for s in found]
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


def scrub(text: str, uri: str | os.PathLike) -> str:
    """``text`` (an error message, a log line) with the secrets of ``uri`` hidden, wherever they
    appear in it: the whole URI first (so it reads as :func:`redact` shows it), then each secret."""
    full = os.fspath(uri)
    if "://" not in full:
        return text
    text = text.replace(full, redact(full))
    for secret in secrets_in(full):
        text = text.replace(secret, HIDDEN)
    return text
