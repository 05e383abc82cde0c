"""Every Redis key of the DHT is built here, and only here.

Hash-tag policy (Redis Cluster hashes only the part between the first ``{`` and ``}``):

* ``<ns>:{<tag(D)>}:d`` - one hash per directory ``D``: field = child name (raw bytes),
  value = the child's packed entry. ``tag(D)`` is the hex BLAKE2b-128 of the directory's
  path, so every key of one directory - and nothing else - lives in one slot, and any
  name bytes (``{``, ``}``, non-UTF-8) are safe. Create/lookup/update/CAS/delete/lease of
  an entry and a same-directory rename of a non-directory are single-key operations.
* Reserved fields of a directory hash start with ``/`` (a name never contains ``/``):
  ``HEADER`` (``/``) = msgpack ``[dir path, state, owner id, since ms, extra]``, state
  ``live`` | ``moving`` (a rename has frozen the directory) | ``gone`` (an rmdir has
  claimed it); no header = no such directory (mkdir writes it);
  ``COUNTER`` (``/v``) = the directory's version counter; ``PINS`` (``/p``) = how many
  entries of the directory a rename has pinned.
* The root's own entry is field ``b""`` of the hash of the pseudo-directory ``b""``.
* ``<ns>:{<ns>:intents}:rec`` / ``:own`` - the intent log of cross-slot operations
  (id -> record, id -> owner and deadline): one slot, so claiming an intent is atomic.
"""

from __future__ import annotations

import hashlib
import re

HEADER = b"/"
COUNTER = b"/v"
PINS = b"/p"
RESERVED_PREFIX = b"/"

_NS_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def check_namespace(ns: str) -> str:
    """Namespaces prefix every key; they may not contain hash-tag braces or ``:``."""
    if not _NS_RE.match(ns):
        raise ValueError(f"namespace must match {_NS_RE.pattern}: {ns!r}")
    return ns


def dir_tag(dirpath: bytes) -> str:
    return hashlib.blake2b(dirpath, digest_size=16).hexdigest()


def dir_key(ns: str, dirpath: bytes) -> bytes:
    """The hash holding the entries of directory ``dirpath``."""
    return f"{ns}:{{{dir_tag(dirpath)}}}:d".encode()


def inval_channel(ns: str, dirpath: bytes) -> bytes:
    """The sharded pub/sub channel (SPUBLISH) that announces changes of names in
    directory ``dirpath``: in the slot of the directory's hash, so a change and its
    announcement go to the same master."""
    return f"{ns}:{{{dir_tag(dirpath)}}}:inv".encode()


def dir_key_pattern(ns: str) -> bytes:
    """SCAN MATCH pattern for every directory hash of the namespace."""
    return f"{ns}:{{*}}:d".encode()


def intent_records_key(ns: str) -> bytes:
    return f"{ns}:{{{ns}:intents}}:rec".encode()


def intent_owners_key(ns: str) -> bytes:
    return f"{ns}:{{{ns}:intents}}:own".encode()


def is_reserved_field(name: bytes) -> bool:
    return name.startswith(RESERVED_PREFIX)
