"""Absolute byte paths: validation and splitting (no key building here; see keys.py)."""

from __future__ import annotations

ROOT = b"/"
#: the parent "directory" that holds the root's own entry (under the empty name)
ROOT_PARENT = b""


def check(path: bytes) -> bytes:
    """Return ``path`` if it is an absolute, normalised byte path, else raise ValueError."""
    if not isinstance(path, bytes):
        raise TypeError(f"paths are bytes, not {type(path).__name__}")
    if path == ROOT:
        return path
    if not path.startswith(b"/") or path.endswith(b"/") or b"\0" in path:
        raise ValueError(f"not an absolute normalised path: {path!r}")
    for part in path[1:].split(b"/"):
        if part in (b"", b".", b".."):
            raise ValueError(f"not an absolute normalised path: {path!r}")
    return path


def split(path: bytes) -> tuple[bytes, bytes]:
    """``b"/a/b"`` -> ``(b"/a", b"b")``; the root -> ``(ROOT_PARENT, b"")``."""
    if path == ROOT:
        return ROOT_PARENT, b""
    i = path.rindex(b"/")
    return (path[:i] or ROOT), path[i + 1 :]


def join(parent: bytes, name: bytes) -> bytes:
    """``(b"/a", b"b")`` -> ``b"/a/b"``; ``(b"/", b"b")`` -> ``b"/b"``."""
    return (parent if parent != ROOT else b"") + b"/" + name


def is_within(path: bytes, ancestor: bytes) -> bool:
    """True if ``path`` is ``ancestor`` or below it."""
    if ancestor == ROOT:
        return True
    return path == ancestor or path.startswith(ancestor + b"/")


def rebase(path: bytes, old: bytes, new: bytes) -> bytes:
    """``path`` (at or below ``old``) moved to below ``new``."""
    if path == old:
        return new
    return join(new, path[len(old) + 1 :]) if old != ROOT else join(new, path[1:])
