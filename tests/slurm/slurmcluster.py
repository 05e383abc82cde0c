"""A real Slurm cluster in a temp dir (removed by :meth:`SlurmCluster.stop`): munged on its own key and socket, slurmctld, and one
slurmd per node on this host (``slurmd -N NODE``, each on its own port: Slurm's per-node
``Port=``), with HyCache's plugins (deploy/slurm) beside slurm.conf, or without them
(``hycache_conf=None``: the ansible role installs them before :meth:`SlurmCluster.start`).  Everything it starts
it stops, by pid, in :meth:`SlurmCluster.stop`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from hycache_harness import free_port, log_tail, spawn, stop_daemon, wait_for

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "deploy" / "slurm"
PLUGIN_DIR = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm")
PLUGIN_FILES = ("job_submit.lua", "burst_buffer.lua", "hycache_slurm.lua")


def missing() -> str | None:
    """Why this machine cannot run the cluster (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (slurmd runs jobs as their user)"
    for b in ("munged", "slurmctld", "slurmd", "sbatch", "curl"):
        if shutil.which(b) is None:
            return f"{b} is not installed (scripts/bootstrap.sh installs slurm-wlm 22.05 and munge)"
    for so in ("burst_buffer_lua.so", "job_submit_lua.so"):
        if not (PLUGIN_DIR / so).exists():
            return f"{PLUGIN_DIR / so} is missing"
    return None


class SlurmCluster:
    def __init__(self, nodes: list[str], *, hycache_conf: str | None, stage_timeout: int = 300) -> None:
        # every user reaches it: the jobs run as nobody, and sbatch reads slurm.conf as them
        base = Path(tempfile.mkdtemp(prefix="hycache-slurm-"))
        base.chmod(0o755)
        self.base, self.nodes = base, list(nodes)
        self.etc, self.logs = base / "etc", base / "log"
        for d in (self.etc, self.logs, base / "state", base / "spool"):
            d.mkdir(parents=True, exist_ok=True)
        self.out = base / "out"  # the jobs' stdout
        self.out.mkdir()
        self.out.chmod(0o1777)
        self.host = socket.gethostname()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.etc / "slurm.conf")}
        self._write_config(hycache_conf, stage_timeout)

    def _write_config(self, hycache_conf: str | None, stage_timeout: int) -> None:
        b = self.base
        node_lines = "\n".join(f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={free_port()} "
                               "CPUs=1 RealMemory=100 State=UNKNOWN" for n in self.nodes)
        (self.etc / "slurm.conf").write_text(f"""\
ClusterName=hycache
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={b}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/slurmctld.pid
SlurmdPidFile={b}/slurmd-%n.pid
SlurmctldLogFile={self.logs}/slurmctld.log
SlurmdLogFile={self.logs}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
PluginDir={PLUGIN_DIR}
{node_lines}
PartitionName=debug Nodes={",".join(self.nodes)} Default=YES MaxTime=10 State=UP
""")
        if hycache_conf is None:
            return
        with (self.etc / "slurm.conf").open("a") as f:
            f.write("BurstBufferType=burst_buffer/lua\nJobSubmitPlugins=lua\n")
        (self.etc / "burst_buffer.conf").write_text(
            f"StageInTimeout={stage_timeout}\nStageOutTimeout={stage_timeout}\nOtherTimeout={stage_timeout}\n")
        (self.etc / "hycache-slurm.conf").write_text(hycache_conf)
        for f in PLUGIN_FILES:
            shutil.copy(PLUGINS / f, self.etc / f)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        b = self.base
        key = b / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(["munged", "-F", "-f", f"--key-file={key}", f"--socket={b}/munge.sock",
                     f"--pid-file={b}/munged.pid", f"--seed-file={b}/munge.seed",
                     f"--log-file={self.logs}/munged.log"], "munged")
        wait_for(lambda: (b / "munge.sock").exists(), 30, "munged's socket")
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.etc / "slurm.conf")], "slurmctld")
        wait_for(lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0, 60, "slurmctld up")
        for n in self.nodes:
            self._spawn(["slurmd", "-D", "-N", n, "-f", str(self.etc / "slurm.conf")], f"slurmd-{n}")
        wait_for(lambda: self.idle() == set(self.nodes), 90, f"nodes {self.nodes} idle")
        return self

    def _spawn(self, argv: list[str], name: str) -> None:
        p = spawn(argv, self.logs / f"{name}.out", cwd=self.base, env=self.env)
        self.procs.append(p)
        time.sleep(0.2)
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited {p.returncode}\n{log_tail(self.logs / f'{name}.out')}")

    def stop(self) -> None:
        """Cancel the jobs left, then stop the daemons in reverse order (slurmd, slurmctld, munged)."""
        if self.procs:
            self.run("scancel", "--full", "-u", "nobody", check=False)
        for p in reversed(self.procs):
            stop_daemon(p, None, 15)
        self.procs.clear()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- commands -----------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True, user: str | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = (["runuser", "-u", user, "--"] if user else []) + list(argv)
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, check=check, timeout=60,
                              input=input)

    def sbatch(self, script: str, name: str) -> int:
        """Submit ``script`` (on stdin) as nobody; its job id."""
        r = self.run("sbatch", "--parsable", "--chdir=/tmp", "-J", name, user="nobody", check=False, input=script)
        assert r.returncode == 0, f"sbatch: {r.stderr}"
        return int(r.stdout.strip().split(";")[0])

    def idle(self) -> set[str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split("\n")
        return {line.split()[0] for line in out if line.strip() and line.split()[1] == "idle"}


    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (fields whose values hold spaces are cut at them)."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv) | {"_raw": out}

    def wait_done(self, job_id: int, timeout: float) -> dict[str, str]:
        return wait_for(lambda: (j := self.job(job_id))["JobState"] in ("COMPLETED", "FAILED", "CANCELLED")
                        and j, timeout, f"job {job_id} done\n{self.log_tail()}")

    def log_tail(self) -> str:
        return log_tail(self.logs / "slurmctld.log", 40)
