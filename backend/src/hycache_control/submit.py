"""``hycache-control submit JOBSCRIPT``: Snakemake's generic cluster executor's submit
command, placing each ready job by its data.

Snakemake writes one job script per job: a ``# properties = {json}`` line (the job's
``input`` files, relative to the working directory) and a ``cd WORKDIR && … snakemake …``
line.  The working directory is in the global namespace through one node's mount; the
same paths exist under every node's mount.  This command asks the control plane where a
job that reads those inputs should run (``POST /api/v1/placements``, the inputs' DHT
locations), rewrites the script's paths from the working directory's mount onto the
chosen node's mount (so the job's reads and writes go through that node), starts it in
the background (its own session, output to a log file) and prints ``NODE-PID``: the job
id Snakemake tracks (the script touches Snakemake's ``jobfinished``/``jobfailed`` marker
files itself, through the chosen mount).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

_PROPS = re.compile(r"^# properties = (\{.*\})\s*$", re.M)
_CD = re.compile(r"^cd ('[^']*'|\"[^\"]*\"|\S+) &&", re.M)


def _mounts(specs: list[str]) -> dict[str, Path]:
    out = {}
    for m in specs:
        node, sep, mp = m.partition("=")
        if not sep or not node or not mp:
            raise ValueError(f"--mount {m!r}: expected NODE=MOUNTPOINT")
        out[node] = Path(mp).resolve()
    return out


def plan(script: str, mounts: dict[str, Path]) -> tuple[str, Path, list[str]]:
    """``(home node, working directory, the inputs' namespace paths)`` of a job script."""
    props = _PROPS.search(script)
    cd = _CD.search(script)
    if props is None or cd is None:
        raise ValueError("not a Snakemake job script: no '# properties =' or 'cd DIR &&' line")
    workdir = Path(cd.group(1).strip("'\""))
    home = next((n for n, mp in mounts.items() if workdir == mp or mp in workdir.parents), None)
    if home is None:
        raise ValueError(f"the job's working directory {workdir} is under none of the --mount points")
    inputs = []
    for f in json.loads(props.group(1)).get("input", []):
        path = (workdir / f) if not os.path.isabs(f) else Path(f)
        try:
            inputs.append("/" + str(path.relative_to(mounts[home])))
        except ValueError:
            continue  # a file outside the namespace: no node holds it
    return home, workdir, inputs


def rewrite(script: str, src: Path, dst: Path) -> str:
    """Every path under the mount ``src`` moved under ``dst``."""
    return re.sub(re.escape(str(src)) + r"(?=[/'\" ]|$)", str(dst).replace("\\", "\\\\"), script, flags=re.M)


def submit(args: argparse.Namespace) -> int:
    try:
        mounts = _mounts(args.mount)
        script = Path(args.jobscript).read_text()
        home, _, inputs = plan(script, mounts)
    except (OSError, ValueError) as e:
        print(f"hycache-control submit: {e}", file=sys.stderr)
        return 2
    token = Path(args.token_file).read_text().strip()
    try:
        r = httpx.post(args.api.rstrip("/") + "/api/v1/placements", json={"inputs": inputs, "nodes": list(mounts)},
                       headers={"Authorization": f"Bearer {token}"}, timeout=60.0)
    except httpx.HTTPError as e:
        print(f"hycache-control submit: {args.api}: {e}", file=sys.stderr)
        return 1
    if r.status_code != 200:
        print(f"hycache-control submit: {r.status_code}: {r.text[:500]}", file=sys.stderr)
        return 1
    node = r.json()["node"]
    if node != home:
        script = rewrite(script, mounts[home], mounts[node])
    log_dir = Path(args.log_dir or tempfile.gettempdir())
    log_dir.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"hycache-job-{node}-", suffix=".sh", dir=log_dir)
    with os.fdopen(fd, "w") as fh:
        fh.write(script)
    with open(path + ".log", "ab") as log:
        proc = subprocess.Popen(["/bin/sh", path], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    print(f"{node}-{proc.pid}")
    return 0
