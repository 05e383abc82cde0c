"""ansible/roles/slurm_hycache: the files it installs, then a real slurmctld on them.

``ansible-playbook site.yml --tags slurm_hycache`` runs on localhost (connection local),
twice, against three ``[slurm_controller]`` hosts whose Slurm config directories are
temporary:

* ``ctl``: the config directory of a :class:`SlurmCluster` written without HyCache's
  plugins, ``slurm_hycache_manage_slurm_conf: true``; after the role, munged, slurmctld
  and one slurmd start on it, and Slurm must load both Lua plugins from what the role
  installed and run a job through them;
* ``ctl2``: the role's defaults (slurm.conf left alone, the lines printed; the URL taken
  from the ``[control_plane]`` host; a token file already there);
* ``ctl3``: a slurm.conf that sets ``JobSubmitPlugins`` already: the role stops there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hycache_harness import free_port, wait_for

from .slurmcluster import SlurmCluster, missing

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
SOURCES = REPO / "deploy" / "slurm"
BIN = Path(sys.executable).parent
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
TOKEN = "hca_slurm-token-for-the-role-test-0123456789"
INSTALLED = ("job_submit.lua", "burst_buffer.lua", "hycache_slurm.lua", "burst_buffer.conf")
BLOCK_KEYS = re.compile(r"^\s*(JobSubmitPlugins|BurstBufferType)\s*=", re.IGNORECASE | re.MULTILINE)


def _playbook(inv: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    exe = BIN / "ansible-playbook"
    if not exe.exists():
        pytest.skip("ansible-core is not installed in this environment (root dev group: uv sync)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), ANSIBLE_HOME=str(tmp / "ansible-home"),
               ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return subprocess.run([str(exe), "-i", str(inv), str(ANSIBLE / "site.yml"), "--limit", "ctl,ctl2,ctl3",
                           "--tags", "slurm_hycache", "--skip-tags", "slurm_hycache_packages"],
                          capture_output=True, text=True, env=env, cwd=ANSIBLE, timeout=300)


def _recap(out: str) -> dict[str, dict[str, int]]:
    return {m[1]: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m[2])}
            for m in re.finditer(r"^(ctl\d?)\s+:\s+(.*)$", out, re.MULTILINE)}


def settings(path: Path) -> dict[str, str]:
    """hycache-slurm.conf read as hycache_slurm.lua's M.config reads it: `key = value`
    lines (``^%s*([%w_]+)%s*=%s*(.-)%s*$``), comment lines skipped."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^\s*(\w+)\s*=\s*(.*?)\s*$", line)
        if m and not re.match(r"^\s*#", line):
            out[m[1]] = m[2]
    return out


@pytest.fixture(scope="module")
def role(tmp_path_factory):
    """The role run twice over ctl, ctl2, ctl3; yields {host: config dir} + the cluster
    (not started) and both runs' output; stops the cluster after the module."""
    why = missing()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("slurm-role")
    cluster = SlurmCluster(["n1"], hycache_conf=None)
    try:
        base_conf = (cluster.etc / "slurm.conf").read_text()
        assert not BLOCK_KEYS.search(base_conf)
        dirs = {"ctl": cluster.etc, "ctl2": tmp / "ctl2", "ctl3": tmp / "ctl3"}
        for name in ("ctl2", "ctl3"):
            dirs[name].mkdir()
        (dirs["ctl2"] / "slurm.conf").write_text(base_conf)
        (dirs["ctl2"] / "hycache.token").write_text("made-by-the-operator\n")
        (dirs["ctl3"] / "slurm.conf").write_text(base_conf + "JobSubmitPlugins = lua\n")
        local = {"ansible_connection": "local", "ansible_python_interpreter": PY, "ansible_become": False,
                 "slurm_hycache_user": "root", "slurm_hycache_restart_on_change": False}
        inventory = {"all": {"children": {
            "slurm_controller": {"hosts": {
                "ctl": {**local, "slurm_hycache_config_dir": str(dirs["ctl"]),
                        "slurm_hycache_manage_slurm_conf": True, "slurm_hycache_token": TOKEN,
                        # nothing listens there: every hook finds the control plane down
                        "slurm_hycache_control_plane": f"http://127.0.0.1:{free_port()}",
                        "slurm_hycache_stage_wait": 30, "slurm_hycache_poll_interval": 0.5},
                "ctl2": {**local, "slurm_hycache_config_dir": str(dirs["ctl2"])},
                "ctl3": {**local, "slurm_hycache_config_dir": str(dirs["ctl3"]),
                         "slurm_hycache_manage_slurm_conf": True, "slurm_hycache_token": TOKEN,
                         "slurm_hycache_control_plane": "http://cp.example:8080"},
            }},
            "control_plane": {"hosts": {"cp": {"ansible_host": "10.9.8.7", "control_plane_listen": "0.0.0.0:9090"}}},
        }}}
        inv = tmp / "inventory.yml"
        inv.write_text(yaml.safe_dump(inventory))
        first = _playbook(inv, tmp)
        second = _playbook(inv, tmp)
        for out in (first, second):
            assert TOKEN not in out.stdout + out.stderr, "the token leaked into ansible's output"
        yield {**dirs, "_cluster": cluster, "_first": first, "_second": second, "_base": base_conf}
    finally:
        cluster.stop()


def test_runs_are_idempotent_and_ctl3_is_refused(role):
    for out in (role["_first"], role["_second"]):
        recap = _recap(out.stdout)
        assert out.returncode == 2, out.stdout[-4000:] + out.stderr  # ctl3 failed, on purpose
        assert recap["ctl"]["failed"] == 0 and recap["ctl2"]["failed"] == 0, out.stdout[-4000:]
        assert recap["ctl3"]["failed"] == 1, out.stdout[-4000:]
        assert "already sets jobsubmitplugins" in out.stdout.lower(), out.stdout[-3000:]
    assert _recap(role["_first"].stdout)["ctl"]["changed"] > 0
    second = _recap(role["_second"].stdout)
    assert (second["ctl"]["changed"], second["ctl2"]["changed"]) == (0, 0), role["_second"].stdout[-4000:]
    # ctl3's slurm.conf is untouched
    assert (role["ctl3"] / "slurm.conf").read_text() == role["_base"] + "JobSubmitPlugins = lua\n"


def test_plugin_files_are_deploy_slurms(role):
    """One source of truth: the role installs deploy/slurm's files as they are."""
    for d in (role["ctl"], role["ctl2"]):
        for name in INSTALLED:
            assert (d / name).read_bytes() == (SOURCES / name).read_bytes(), name
            assert (d / name).stat().st_mode & 0o777 == 0o644
    for name in INSTALLED:
        link = ANSIBLE / "roles" / "slurm_hycache" / "files" / name
        assert link.is_symlink() and link.resolve() == SOURCES / name


def test_settings_and_token(role):
    ctl, ctl2 = role["ctl"], role["ctl2"]
    got = settings(ctl / "hycache-slurm.conf")
    assert got["url"].startswith("http://127.0.0.1:")
    assert got["token_file"] == str(ctl / "hycache.token")
    assert (float(got["stage_wait"]), float(got["poll_interval"])) == (30, 0.5)
    token = ctl / "hycache.token"
    assert token.read_text() == TOKEN + "\n" and token.stat().st_mode & 0o777 == 0o600
    assert (ctl / "hycache-slurm.conf").stat().st_mode & 0o777 == 0o600
    # the defaults are the example's; the URL is the [control_plane] host's
    example = settings(SOURCES / "hycache-slurm.conf.example")
    defaults = settings(ctl2 / "hycache-slurm.conf")
    assert defaults["url"] == "http://10.9.8.7:9090"
    assert defaults["token_file"] == str(ctl2 / "hycache.token")
    assert {k: float(v) for k, v in defaults.items() if k not in ("url", "token_file")} == \
        {k: float(v) for k, v in example.items() if k not in ("url", "token_file")}
    assert (ctl2 / "hycache.token").read_text() == "made-by-the-operator\n", "an operator's token is kept"


def test_slurm_conf_block(role):
    text = (role["ctl"] / "slurm.conf").read_text()
    assert text.startswith(role["_base"]), "the role only adds its block"
    block = text[len(role["_base"]):].splitlines()
    assert block[0].startswith("# BEGIN HYCACHE SLURM PLUGINS") and block[-1].startswith("# END HYCACHE")
    fragment = (SOURCES / "slurm.conf.fragment").read_text().splitlines()
    assert sorted(block[1:-1]) == ["BurstBufferType=burst_buffer/lua", "JobSubmitPlugins=lua"]
    assert set(block[1:-1]) <= set(fragment)
    # without the opt-in slurm.conf is not touched, and the lines are printed
    assert (role["ctl2"] / "slurm.conf").read_text() == role["_base"]
    assert "JobSubmitPlugins=lua" in role["_first"].stdout and "BurstBufferType=burst_buffer/lua" in \
        role["_first"].stdout


def test_slurmctld_loads_the_installed_plugins(role):
    """Real Slurm on what the role wrote: slurmctld starts with its block, both Lua plugins
    load from the installed files (and the helper beside them), and a job declaring its
    data completes with the control plane down (Slurm's own choice)."""
    c: SlurmCluster = role["_cluster"]
    c.start()
    config = c.run("scontrol", "show", "config").stdout
    assert re.search(r"^BurstBufferType\s*=\s*burst_buffer/lua$", config, re.MULTILINE), config
    assert re.search(r"^JobSubmitPlugins\s*=\s*lua$", config, re.MULTILINE), config
    # burst_buffer.lua ran, loaded hycache_slurm.lua and read the URL from hycache-slurm.conf
    bbstat = c.run("scontrol", "show", "bbstat").stdout
    assert "HyCache burst buffer: control plane unreachable" in bbstat, bbstat
    # job_submit.lua parses the directives: a bad one is refused with the reason
    bad = c.run("sbatch", "--chdir=/tmp", user="nobody", check=False,
                input="#!/bin/bash\n#BB_LUA hycache inputs=/in/a colour=blue\ntrue\n")
    assert bad.returncode != 0 and "unknown key colour" in bad.stderr, bad.stderr
    job = c.sbatch(f"#!/bin/bash\n#SBATCH -o {c.out}/%j.out\n#BB_LUA hycache inputs=/in/a outputs=/out/b\ntrue\n",
                   "declared")
    done = c.wait_done(job, 45)
    assert done["JobState"] == "COMPLETED", done["_raw"]
    log = wait_for(lambda: (t := (c.logs / "slurmctld.log").read_text()) and "stage-in" in t and t, 15,
                   "slurmctld's log names the stage-in")
    assert "no node from the control plane" in log and "control plane unreachable at stage-in" in log, log[-3000:]

