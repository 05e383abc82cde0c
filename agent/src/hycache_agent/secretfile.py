"""Reading a credential file (the cluster secret, the control-plane token) safely.

One routine for both: open without following into a FIFO or a tty, refuse what is not a
regular file, refuse modes that let other users read it, optionally refuse a file another
user owns, and bound its size. Blocking: call it at start-up or from a worker thread."""

from __future__ import annotations

import os
import stat


def read_protected(path: str | os.PathLike[str], *, what: str, error: type[Exception], forbidden: int,
                   refusal: str, must_own: bool = False, limit: int = 1 << 20) -> bytes:
    """The bytes of ``path``; ``error(message)`` if it is unsafe or unreadable.

    ``forbidden``: permission bits that must be clear (e.g. ``0o007`` for "no access for
    others", ``0o177`` for "0600 or stricter"); ``refusal`` is the message when one is set,
    formatted with ``what``, ``path`` and ``mode``.
    ``must_own``: the file must belong to this process's effective user."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as e:
        raise error(f"{what} {path}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {path} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & forbidden:
            raise error(refusal.format(what=what, path=path, mode=f"{mode:04o}"))
        if must_own and st.st_uid != os.geteuid():
            raise error(f"{what} {path} is owned by uid {st.st_uid}, not by the agent's user "
                        f"(uid {os.geteuid()}); run: chown {os.geteuid()} {path}")
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
            if len(data) > limit:
                raise error(f"{what} {path} is larger than {limit} bytes")
    finally:
        os.close(fd)
    return data
