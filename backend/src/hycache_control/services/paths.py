"""What a path in the namespace may hold, as the API and the services check it."""

from __future__ import annotations

import re

#: the longest path the API accepts (bytes of UTF-8), as Linux's PATH_MAX
MAX_PATH = 4096

#: what no name in the namespace holds: a control character (C0, DEL) or a lone UTF-16
#: surrogate (no UTF-8 encodes it: neither the DHT, the database nor a JSON answer could)
_BAD_CHAR = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def check_name(value: str) -> str:
    """A file name as a manifest or a placement gives it (relative names are under /): no
    NUL, control character or lone surrogate."""
    bad = _BAD_CHAR.search(value)
    if bad is not None:
        c = bad.group()
        if c == "\x00":
            raise ValueError("path must not contain NUL")
        if "\ud800" <= c <= "\udfff":
            raise ValueError(f"path must not contain a lone UTF-16 surrogate (U+{ord(c):04X})")
        raise ValueError(f"path must not contain a control character (U+{ord(c):04X})")
    return value


def check_path(value: str) -> str:
    """An absolute path inside the namespace: ``/``-rooted, no ``..``/``.`` component, no
    NUL, control character or lone surrogate, at most MAX_PATH bytes.  A trailing ``/``
    (but the root's) is dropped."""
    check_name(value)
    if len(value.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise ValueError(f"path is longer than {MAX_PATH} bytes")
    if not value.startswith("/"):
        raise ValueError("path must be absolute (start with /)")
    parts = [p for p in value.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError("path must not contain . or .. components")
    return "/" + "/".join(parts)
