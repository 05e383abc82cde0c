"""The dashboard's static checks, so that the test command (CI) runs them: ESLint, the
TypeScript type check, the Vitest component tests, and the generated API client matching
what `hycache-control openapi` produces now (regenerated into a temp file and compared)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FRONTEND = REPO / "frontend"


def npm(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    if shutil.which("npm") is None or not (FRONTEND / "node_modules").is_dir():
        pytest.fail("npm or frontend/node_modules missing: run scripts/bootstrap.sh", pytrace=False)
    return subprocess.run(["npm", "run", "--silent", *args], cwd=FRONTEND, env={**os.environ, **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


@pytest.mark.parametrize("script", ["lint", "typecheck", "test"])
def test_frontend_script(script):
    r = npm(script)
    assert r.returncode == 0, f"npm run {script} failed:\n{r.stdout[-6000:]}"


def test_generated_api_client_does_not_drift(tmp_path):
    committed = FRONTEND / "src" / "api" / "schema.d.ts"
    fresh = tmp_path / "schema.d.ts"
    r = npm("gen:api", env={"SCHEMA_OUT": str(fresh),
                            "HYCACHE_CONTROL": str(REPO / ".venv" / "bin" / "hycache-control")})
    assert r.returncode == 0, r.stdout
    assert fresh.read_text() == committed.read_text(), (
        "frontend/src/api/schema.d.ts differs from the control plane's OpenAPI document: "
        "run `cd frontend && npm run gen:api` and commit the result")
