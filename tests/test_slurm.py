"""The SLURM profiles: both parse for snakemake-executor-plugin-slurm, and (opt-in,
STEREOLENS_SLURM_TEST=1, root) a real single-node SLURM cluster runs a small demo
through the executor with the same results as a local run.

The cluster comes from tools/slurm/slurm-up.sh (Debian SLURM 22.05, munge,
slurmdbd/MariaDB on localhost). The test uses a cluster that is already up; else
it starts one and stops exactly the daemons it started when it is done."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from polars.testing import assert_frame_equal

BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
ROOT = Path(__file__).resolve().parents[1]
SLURM_UP = ROOT / "tools" / "slurm" / "slurm-up.sh"
# Hard wall-clock limits (s). A lost SLURM job makes snakemake wait forever and
# ignore SIGTERM, hence `timeout -k 30`.
SLURM_RUN_TIMEOUT = 600
LOCAL_RUN_TIMEOUT = 600
# The demo through SLURM is 44 jobs of several seconds each (two snakemake start-ups
# per job) on 2 cores: too slow for CI. The comparison uses one role and one
# generator (about a third of the jobs), still every rule of the workflow.
SMALL = {"roles": ["nurse"], "generators": ["tiny-sd"]}


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def _copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for item in ("Snakefile", "workflow", "config", "profiles", "envs"):
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, dest / item, symlinks=True)
        else:
            shutil.copy2(src, dest / item)
    return dest


def _write_small_config(wd: Path) -> str:
    cfg = yaml.safe_load((wd / "config/demo.yaml").read_text())
    cfg["contextbias"].update(SMALL)
    cfg["run_label"] = "SLURM comparison (tiny models, one role, one generator)"
    (wd / "config/slurm-small.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return "config/slurm-small.yaml"


# ---------------------------------------------------------------- fast, no cluster


@pytest.mark.parametrize("profile", ["profiles/slurm", "profiles/slurm-ci"])
def test_slurm_profile_parses(tmp_path, profile):
    """The plugin accepts the profile: a dry run plans the demo (no sbatch needed)."""
    wd = _copy_workflow(tmp_path / "wf")
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--profile", profile, "--configfile", "config/demo.yaml"],
        cwd=wd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert re.search(r"generate_contextbias_images\s+[1-9]", log), log[-4000:]
    assert not (wd / "results").exists()


def test_slurm_ci_profile_mirrors_slurm_profile():
    """profiles/slurm-ci is profiles/slurm with local values: same keys and rules,
    no placeholders, nothing larger than the 2-core test node."""
    prod = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    ci = yaml.safe_load((ROOT / "profiles/slurm-ci/config.yaml").read_text())
    assert ci["executor"] == prod["executor"] == "slurm"
    assert set(ci["default-resources"]) == set(prod["default-resources"])
    assert set(ci["set-threads"]) == set(prod["set-threads"])
    assert set(ci["set-resources"]) == set(prod["set-resources"])
    for rule, res in prod["set-resources"].items():
        assert set(ci["set-resources"][rule]) == set(res), rule
    text = (ROOT / "profiles/slurm-ci/config.yaml").read_text()
    assert "YOUR_" not in text
    assert ci["jobs"] == 2
    for res in [ci["default-resources"], *ci["set-resources"].values()]:
        assert res.get("cpus_per_task", 1) <= 2
        assert res.get("mem_mb", 0) <= 20000
    assert max(ci["set-threads"].values()) <= 2


# ---------------------------------------------------------------- real cluster


def _cluster_ready() -> bool:
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
        state = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=20
        )
        acct = subprocess.run(
            ["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return (
        "UP" in ping.stdout
        and bool(re.search(r"^(idle|mixed|allocated)", state.stdout, re.M))
        and acct.returncode == 0
    )


@pytest.fixture(scope="module")
def slurm_cluster():
    """A running cluster; started (and afterwards stopped, by PID) only if none is up."""
    if os.environ.get("STEREOLENS_SLURM_TEST") != "1":
        pytest.skip(
            "real SLURM test is opt-in: set STEREOLENS_SLURM_TEST=1 (needs root and "
            "Debian's slurm packages; tools/slurm/slurm-up.sh installs and starts them)"
        )
    if _cluster_ready():
        print("slurm: using the cluster that is already up")
        yield {"started": False, "up_s": 0.0}
        return
    if os.geteuid() != 0:
        pytest.fail("STEREOLENS_SLURM_TEST=1, no cluster up, and not root to start one")
    t0 = time.monotonic()
    started = True
    try:
        up = subprocess.run(
            ["bash", str(SLURM_UP), "up"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=900,
        )
        up_s = time.monotonic() - t0
        print(f"slurm: cluster up in {up_s:.0f} s\n{up.stdout[-2000:]}")
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        yield {"started": started, "up_s": up_s}
    finally:
        t1 = time.monotonic()
        down = subprocess.run(
            ["bash", str(SLURM_UP), "down"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
        print(f"slurm: cluster down in {time.monotonic() - t1:.0f} s\n{down.stdout[-1500:]}")


def _run(cmd, wd, timeout_s):
    t0 = time.monotonic()
    out = subprocess.run(
        ["timeout", "-k", "30", str(timeout_s), *cmd],
        cwd=wd,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s + 60,
    )
    return out, time.monotonic() - t0


def _read(wd: Path, rel: str) -> pl.DataFrame:
    return pl.read_parquet(wd / "results/contextbias" / rel)


def _sorted(df: pl.DataFrame, cols) -> pl.DataFrame:
    return df.select(cols).sort(cols, nulls_last=True)


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_run_matches_local_run(slurm_cluster, tmp_path):
    # --- through SLURM
    swd = _copy_workflow(tmp_path / "slurm")
    cfg = _write_small_config(swd)
    out, slurm_s = _run(
        [SNAKEMAKE, "--profile", "profiles/slurm-ci", "--configfile", cfg],
        swd,
        SLURM_RUN_TIMEOUT,
    )
    slog = out.stdout + out.stderr
    (tmp_path / "slurm.log").write_text(slog)
    print(f"slurm: workflow through SLURM in {slurm_s:.0f} s")
    assert out.returncode == 0, f"rc={out.returncode} (124/137 = timeout)\n" + slog[-6000:]

    # SLURM really ran the jobs: sacct lists them COMPLETED under the run's job name
    run_id = re.search(r"SLURM run ID: (\S+)", slog)
    assert run_id, slog[-3000:]
    run_id = run_id.group(1)
    jobids = re.findall(r"submitted with SLURM jobid (\d+)", slog)
    assert len(jobids) >= 10, slog[-3000:]
    # (no check of .snakemake/slurm_logs: the plugin deletes the logs of successful
    # jobs unless --slurm-keep-successful-logs is given)
    states = {}
    for _ in range(30):  # slurmdbd records job ends a moment after they happen
        acct = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", ",".join(jobids), "-o", "JobID,JobName%64,State"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        states = {
            line.split("|")[0]: tuple(line.split("|")[1:])
            for line in acct.stdout.splitlines()
            if line.strip()
        }
        if len(states) == len(jobids) and all(s[1] == "COMPLETED" for s in states.values()):
            break
        time.sleep(1)
    assert set(states) == set(jobids), (jobids, states)
    assert all(s == (run_id, "COMPLETED") for s in states.values()), states

    # --- locally, same config
    lwd = _copy_workflow(tmp_path / "local")
    _write_small_config(lwd)
    out, local_s = _run(
        [SNAKEMAKE, "--profile", "profiles/local", "--cores", "2", "--configfile", cfg],
        lwd,
        LOCAL_RUN_TIMEOUT,
    )
    print(f"slurm: same workflow locally in {local_s:.0f} s")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]

    _assert_same_results(swd, lwd)


def _assert_same_results(swd: Path, lwd: Path):
    """Results of the SLURM run (swd) equal those of the local run (lwd)."""
    assert_frame_equal(_read(swd, "prompts.parquet"), _read(lwd, "prompts.parquet"))
    # image_sha256: the tiny CPU models with fixed seeds give byte-identical PNGs
    image_cols = [
        c
        for c in ("image_id", "status", "reason", "n_labels", "image_sha256")
        if c in _read(lwd, "images.parquet").columns
    ]
    assert_frame_equal(
        _sorted(_read(swd, "images.parquet"), image_cols),
        _sorted(_read(lwd, "images.parquet"), image_cols),
    )
    label_cols = [
        c
        for c in ("image_id", "extractor", "dimension", "label", "canonical_label")
        if c in _read(lwd, "attributes.parquet").columns
    ]
    assert {"image_id", "label"} <= set(label_cols)
    assert_frame_equal(
        _sorted(_read(swd, "attributes.parquet"), label_cols),
        _sorted(_read(lwd, "attributes.parquet"), label_cols),
    )
    metrics = sorted(p.name for p in (lwd / "results/contextbias/metrics").glob("*.parquet"))
    assert "bi.parquet" in metrics
    for name in metrics:
        local = _read(lwd, f"metrics/{name}")
        slurm = _read(swd, f"metrics/{name}")
        keys = [c for c, t in local.schema.items() if not (t.is_float() or t.is_nested())]
        assert_frame_equal(
            slurm.sort(keys, nulls_last=True),
            local.sort(keys, nulls_last=True),
            check_exact=False,
            rtol=0,
            atol=1e-9,
        )
