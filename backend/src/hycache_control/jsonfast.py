"""JSON out, fast: orjson for the large answers (every node's view), the standard library
for what orjson refuses (integers beyond 64 bits that an agent's status may carry)."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj, default=str)
    except TypeError:
        return json.dumps(obj, separators=(",", ":"), default=str).encode()
