"""The FastAPI application: ``create_app(settings)``."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from . import __version__
from . import schemas as S
from .api import errors, plans, routes, slurm, stream
from .api.deps import auth_error
from .control import Control
from .loopwatch import LoopWatch
from .middleware import Audit, BodyLimit
from .prometheus import make_registry, render
from .settings import Settings

log = logging.getLogger(__name__)

REPO_UI = Path(__file__).resolve().parents[3] / "frontend" / "dist"

NOT_BUILT = """<!doctype html><html><head><title>HyCache control plane</title></head><body>
<h1>HyCache control plane</h1>
<p>The dashboard is not built. Build it with <code>cd frontend &amp;&amp; npm ci &amp;&amp; npm run build</code>
(or point <code>--ui-dir</code> at a built dashboard) and reload.</p>
<p>The API is at <a href="/api/v1/whoami">/api/v1</a>; its documentation at <a href="/docs">/docs</a>.</p>
</body></html>"""


#: gc.set_threshold of a serving process (Python's default: 700, 10, 10)
GC_THRESHOLDS = (10_000, 10, 100)

#: the settings of ``serve --workers N``'s processes (JSON, set by the parent)
SETTINGS_ENV = "HYCACHE_CONTROL_SERVE_SETTINGS"


def app_from_env() -> FastAPI:
    """The app of one worker process of ``serve --workers N`` (uvicorn's factory): the
    parent validated the settings and migrated the database.  A failure here is a start-up
    failure (uvicorn's status 3, which stops the parent; cli.py exits non-zero), not a
    worker to start again and again."""
    import json

    from uvicorn.config import STARTUP_FAILURE
    try:
        return create_app(Settings.model_validate(json.loads(os.environ[SETTINGS_ENV])), migrate=False, tune_gc=True)
    except Exception:
        log.exception("worker start-up failed")
        sys.exit(STARTUP_FAILURE)


def create_app(settings: Settings, control: Control | None = None, *, migrate: bool = True,
               tune_gc: bool = False) -> FastAPI:
    """``tune_gc``: the process serves only this app (``serve``): tune its garbage collector
    (see :func:`_lifespan`); not in a process that runs other things too (the tests)."""
    holder: dict = {"control": control}
    app = FastAPI(title="HyCache control plane", version=__version__,
                  lifespan=_lifespan(settings, holder, migrate=migrate, tune_gc=tune_gc),
                  description="REST API of the HyCache control plane (docs/control-plane.md).")
    app.include_router(routes.router)
    app.include_router(stream.router)
    app.include_router(plans.router)
    app.include_router(slurm.router)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes,
                       routes={("POST", "/api/v1/manifests"): settings.max_manifest_bytes})
    app.add_middleware(Audit, control_getter=lambda: holder["control"])
    errors.install(app)
    _health_routes(app, settings)
    _ui_route(app, settings.ui_dir or REPO_UI)
    return app


def _lifespan(settings: Settings, holder: dict, *, migrate: bool, tune_gc: bool):
    """The app's life: its Control made (unless given) and started, the loop watched, and
    everything stopped at the end."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if holder["control"] is None:
            holder["control"] = await run_in_threadpool(lambda: Control(settings, migrate=migrate))
        c = holder["control"]
        app.state.control = c
        watch = LoopWatch()
        app.state.registry = make_registry(c, watch)
        c.start()
        # the collector, tuned for a server whose garbage is acyclic (freed by reference
        # counts) and whose live data is big: what was loaded so far (modules, the stored
        # node table) lives as long as the process, out of the collector's sight, so a full
        # collection no longer walks it; and collections are rarer (a full one walks every
        # node's status; docs/scaling.md).  HYCACHE_CONTROL_GC_TUNE=0 runs with Python's
        # defaults (to measure the difference).
        if tune_gc and os.environ.get("HYCACHE_CONTROL_GC_TUNE", "1") != "0":
            gc.collect()
            gc.freeze()
            gc.set_threshold(*GC_THRESHOLDS)
        watch.install_gc()
        lag = asyncio.get_running_loop().create_task(watch.run(), name="loop-watch")
        try:
            yield
        finally:
            lag.cancel()
            watch.uninstall_gc()
            await run_in_threadpool(c.stop)

    return lifespan


def _health_routes(app: FastAPI, settings: Settings) -> None:
    @app.get("/healthz", response_model=S.Health, tags=["health"], operation_id="healthz")
    def healthz():
        return {"status": "ok"}

    @app.get("/readyz", response_model=S.Ready, responses={503: {"model": S.Ready}}, tags=["health"],
             operation_id="readyz")
    def readyz(request: Request):
        r = request.app.state.control.readiness()
        bad = any(v.startswith("unreachable") for v in r.values())
        return JSONResponse({"status": "unavailable" if bad else "ok", **r}, status_code=503 if bad else 200)

    @app.get("/metrics", tags=["health"], operation_id="prometheusMetrics",
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
                        401: {"model": S.ErrorOut}, 403: {"model": S.ErrorOut}},
             response_class=Response)
    def prometheus(request: Request):
        c = request.app.state.control
        if settings.metrics_require_token:
            h = request.headers.get("authorization", "")
            scheme, _, secret = h.partition(" ")
            caller = c.tokens.authenticate(secret.strip()) if scheme.lower() == "bearer" and secret.strip() else None
            if caller is None:
                raise auth_error(401, "GET /metrics needs a token (metrics_require_token)", "missing_token")
            if caller.scope not in ("read", "admin"):
                raise auth_error(403, "GET /metrics needs a read or admin token", "forbidden")
        return Response(render(request.app.state.registry), media_type="text/plain; version=0.0.4; charset=utf-8")


def _ui_route(app: FastAPI, ui_dir: Path) -> None:
    """The dashboard at / (its index for any path it does not hold: the client routes)."""

    @app.get("/{full_path:path}", include_in_schema=False)
    def ui(full_path: str):
        if full_path.startswith(("api/", "api")) and (full_path == "api" or full_path.startswith("api/")):
            raise HTTPException(404, [{"loc": ["path"], "msg": f"no such endpoint: /{full_path}", "type": "not_found"}])
        index = ui_dir / "index.html"
        if not index.is_file():
            return HTMLResponse(NOT_BUILT)
        if full_path:
            candidate = (ui_dir / full_path).resolve()
            if candidate.is_file() and candidate.is_relative_to(ui_dir.resolve()):
                return FileResponse(candidate)
        return FileResponse(index)
