"""The SLURM profiles: both parse for snakemake-executor-plugin-slurm, and a real
single-node SLURM cluster runs a small two-round adaptive config through the executor with
the same results as a local run.

The real-cluster test runs when STEREOLENS_SLURM_TEST=1 or CI is set (.ci/run sets both;
STEREOLENS_SLURM_TEST=0 turns it off). It needs root and Debian's SLURM packages: under CI
a missing piece fails the test instead of skipping it. The cluster comes from
tools/slurm/slurm-up.sh (Debian SLURM 22.05, munge, slurmdbd/MariaDB on localhost). The
test uses a cluster that is already up; else it starts one and stops exactly the daemons
it started (by PID) when it is done, also after a failure or a timeout."""

import inspect
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import (
    SLURM_CONF_OUTSIDE,
    built_once,
    copy_workflow,
    dry_run_jobs,
    skip_unless_ci,
    workflow_env,
)
from polars.testing import assert_frame_equal
from test_faults import _ok, _seeded, _snakemake, _workdir

from stereolens.design.rounds import BUDGET_COLUMNS
from stereolens.throughput import measured_throughput

BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
ROOT = Path(__file__).resolve().parents[1]
SLURM_UP = ROOT / "tools" / "slurm" / "slurm-up.sh"
# Hard wall-clock limit (s) of the SLURM run. A lost SLURM job makes snakemake wait
# forever and ignore SIGTERM, hence `timeout -k 30`. Measured on the 2-core test machine
# (shared with other work): the two-round config through SLURM 356 s alone, 627 s at load
# 8-12, cluster up 5-9 s (tests/README.md). The limit leaves 3x the idle run and 1.9x the
# loaded one (a slower machine can raise it through the environment); the local run has
# its own limit.
SLURM_RUN_TIMEOUT = int(os.environ.get("STEREOLENS_SLURM_RUN_TIMEOUT", "1200"))
# Every SLURM job starts snakemake twice and loads torch on 2 cores, and the plugin's
# status checks back off by 10 s per round while jobs run, so the test runs the smallest
# config that still goes through every core rule of the workflow over SLURM (prompts,
# tiny-model builds, generation, extraction, the adaptive design's interim analyses,
# merge, canonicalisation without embedding or LLM, metrics, report) in two rounds: the
# fault suite's config in the adaptive design (.test/config/faults_adaptive.yaml: one
# role, one generator, the tiny VLM greedy and short, two seeds in two rounds of one
# shard; validation, annotation, BiasIG and the LVLM off; few bootstrap replicates). Its
# local run (adaptive_local_run) is built once per pytest run while the SLURM jobs wait
# in the plugin's status checks, and is the run the SLURM results are compared with.
CONFIG_FILE = ".test/config/faults_adaptive.yaml"
CONFIG = "config/faults_adaptive.yaml"  # where test_faults._workdir writes it
# the rules whose jobs must have run as SLURM jobs (check_models and `all` are local)
SLURM_RULES = {
    "build_tiny_model",
    "write_contextbias_prompts",
    "generate_images",
    "extract_contextbias_attributes",
    "adaptive_round",
    "collect_adaptive_decisions",
    "merge_contextbias_model_attributes",
    "merge_contextbias_attributes",
    "canonicalise_contextbias_labels",
    "compute_contextbias_metrics",
    "collect_job_timings",
    "render_report",
}
ADAPTIVE = "results/contextbias/adaptive"


def _slurm_test_enabled() -> bool:
    flag = os.environ.get("STEREOLENS_SLURM_TEST")
    if flag is not None:
        return flag == "1"
    return bool(os.environ.get("CI"))


@pytest.mark.parametrize("profile", ["profiles/slurm", "profiles/slurm-ci"])
def test_slurm_profile_parses(tmp_path, profile):
    """The plugin accepts the profile: a dry run plans the demo (no sbatch needed)."""
    wd = copy_workflow(tmp_path / "wf")
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--profile", profile, "--configfile", "config/demo.yaml"],
        cwd=wd,
        env=workflow_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert re.search(r"generate_\w*images\s+[1-9]", log), log[-4000:]
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


def _cancel_jobs(jobids=None) -> None:
    """Cancel jobs of this test's cluster (the given IDs, else every job of this user) and
    wait until none is left, so that no job step outlives the daemons."""
    args = [",".join(jobids)] if jobids else ["-u", pwd.getpwuid(os.geteuid()).pw_name]
    try:
        subprocess.run(["scancel", *args], capture_output=True, timeout=30)
        for _ in range(30):
            q = subprocess.run(
                ["squeue", "-h", "-o", "%i", *(["-j", args[0]] if jobids else args)],
                capture_output=True,
                text=True,
                timeout=20,
            )
            if q.returncode != 0 or not q.stdout.strip():
                return
            time.sleep(1)
    except (OSError, subprocess.TimeoutExpired):
        pass


@pytest.fixture(scope="module")
def slurm_client_conf():
    """The SLURM client configuration from outside the test run (conftest.py gives every
    other test one without a controller), for the cluster and the runs that use it."""
    no_controller = os.environ["SLURM_CONF"]
    if SLURM_CONF_OUTSIDE is None:
        del os.environ["SLURM_CONF"]
    else:
        os.environ["SLURM_CONF"] = SLURM_CONF_OUTSIDE
    try:
        yield
    finally:
        os.environ["SLURM_CONF"] = no_controller


@pytest.fixture(scope="module")
def slurm_cluster(slurm_client_conf):
    """A running cluster; started (and afterwards stopped, by PID) only if none is up."""
    if not _slurm_test_enabled():
        pytest.skip(
            "real SLURM test is off: set STEREOLENS_SLURM_TEST=1 (CI runs it; needs root "
            "and Debian's slurm packages; tools/slurm/slurm-up.sh installs and starts them)"
        )
    if _cluster_ready():
        print("slurm: using the cluster that is already up")
        yield {"started": False, "up_s": 0.0}
        return
    if os.geteuid() != 0:
        reason = "no SLURM cluster is up and this is not root, so none can be started"
        if os.environ.get("STEREOLENS_SLURM_TEST") == "1":
            pytest.fail(f"STEREOLENS_SLURM_TEST=1, but {reason}")
        skip_unless_ci(reason)
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        skip_unless_ci("SLURM is not installed and there is no apt-get to install it")
    t0 = time.monotonic()
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
        yield {"started": True, "up_s": up_s}
    finally:
        # Also after a failed `up`, a failed test or a timeout: nothing of ours stays up.
        t1 = time.monotonic()
        _cancel_jobs()
        down = subprocess.run(
            ["bash", str(SLURM_UP), "down"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
        print(f"slurm: cluster down in {time.monotonic() - t1:.0f} s\n{down.stdout[-1500:]}")
        assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]


def _start(cmd, wd: Path, timeout_s: int, log: Path) -> tuple[subprocess.Popen, float]:
    """cmd started under a hard limit (`timeout` sends SIGTERM at timeout_s, SIGKILL 30 s
    later: rc 124/137), its output in ``log``; returns the process and its start time."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            ["timeout", "-k", "30", str(timeout_s), *cmd],
            cwd=wd,
            env=workflow_env(),
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return proc, time.monotonic()


def _finish(proc: subprocess.Popen, t0: float, timeout_s: int, log: Path) -> tuple[int, str, float]:
    """Wait for a _start-ed command (the limit above guards only against `timeout`
    itself): its return code, its output and its wall time."""
    try:
        rc = proc.wait(timeout=max(1.0, timeout_s + 60 - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = 137
    return rc, log.read_text(errors="replace"), time.monotonic() - t0


def _record_timing(up_s: float, **times: float) -> None:
    """Append the measured times to $STEREOLENS_SLURM_TIMINGS (.ci/run prints them)."""
    path = os.environ.get("STEREOLENS_SLURM_TIMINGS")
    if path:
        line = ", ".join(f"{k} {v:.0f} s" for k, v in {"cluster_up": up_s, **times}.items())
        with open(path, "a") as fh:
            fh.write(f"test_slurm: {line}\n")


def _read(wd: Path, rel: str) -> pl.DataFrame:
    return pl.read_parquet(wd / "results/contextbias" / rel)


def _sorted(df: pl.DataFrame, cols) -> pl.DataFrame:
    return df.select(cols).sort(cols, nulls_last=True)


def adaptive_local_run(repo_root: Path, tmp_path_factory, tiny_models) -> Path:
    """CONFIG run locally (profiles/local, 2 cores) on the session's tiny checkpoints,
    once per pytest run (conftest.built_once; the folder is shared: read it only)."""

    def run(dest: Path) -> None:
        _seeded(repo_root, dest, tiny_models, config_file=CONFIG_FILE)
        _ok(_snakemake(dest, config=CONFIG))

    return built_once(tmp_path_factory, "faults-adaptive-run", run)


def _slurm_jobs(slog: str) -> list[dict]:
    """The jobs the run submitted to SLURM: rule, wildcards, Snakemake's jobid and
    ``slurm`` (the SLURM jobid), from the executor's log."""
    submitted = dict(re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", slog))
    jobs = [
        dict(j, slurm=submitted[j["jobid"]]) for j in dry_run_jobs(slog) if j["jobid"] in submitted
    ]
    assert len(jobs) == len(submitted) == len(set(submitted.values())), slog[-3000:]
    return jobs


def _sacct(jobids: list[str]) -> dict[str, dict]:
    """sacct's records of the jobs (-X: the allocations), by SLURM jobid, once every job
    has one and is COMPLETED (slurmdbd records a job's end a moment after it)."""
    fields = ("JobID", "JobName%64", "State", "Submit", "Start", "End")
    names = [f.split("%")[0] for f in fields]
    rows: dict[str, dict] = {}
    for _ in range(30):
        acct = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", ",".join(jobids), "-o", ",".join(fields)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        rows = {
            line.split("|")[0]: dict(zip(names, line.split("|"), strict=True))
            for line in acct.stdout.splitlines()
            if line.strip()
        }
        if len(rows) == len(jobids) and all(r["State"] == "COMPLETED" for r in rows.values()):
            break
        time.sleep(1)
    return rows


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_run_matches_local_run(
    slurm_cluster, repo_root, tmp_path, tmp_path_factory, tiny_models
):
    # --- through SLURM, two rounds; the local run is built meanwhile: SLURM's jobs wait in
    # the plugin's status checks, the local run uses the cores
    swd = _workdir(repo_root, tmp_path / "slurm", config_file=CONFIG_FILE)
    proc, t0 = _start(
        [SNAKEMAKE, "--profile", "profiles/slurm-ci", "--configfile", CONFIG],
        swd,
        SLURM_RUN_TIMEOUT,
        tmp_path / "slurm.log",
    )
    t_local = time.monotonic()
    try:
        lwd = adaptive_local_run(repo_root, tmp_path_factory, tiny_models)
    finally:
        local_s = time.monotonic() - t_local
        rc, slog, slurm_s = _finish(proc, t0, SLURM_RUN_TIMEOUT, tmp_path / "slurm.log")
    print(f"slurm: workflow through SLURM in {slurm_s:.0f} s; the local run {local_s:.0f} s")
    _record_timing(slurm_cluster["up_s"], slurm_s=slurm_s, local_s=local_s)
    if rc != 0:  # a timed-out or failed run leaves no job behind
        _cancel_jobs(re.findall(r"submitted with SLURM jobid (\d+)", slog))
    assert rc == 0, f"rc={rc} (124/137 = timeout)\n" + slog[-6000:]

    # SLURM really ran the jobs: sacct lists them COMPLETED under the run's job name
    run_id = re.search(r"SLURM run ID: (\S+)", slog)
    assert run_id, slog[-3000:]
    jobs = _slurm_jobs(slog)
    assert {j["rule"] for j in jobs} == SLURM_RULES, slog[-3000:]
    # (no check of .snakemake/slurm_logs: the plugin deletes the logs of successful
    # jobs unless --slurm-keep-successful-logs is given)
    acct = _sacct([j["slurm"] for j in jobs])
    assert set(acct) == {j["slurm"] for j in jobs}, (jobs, acct)
    assert {(r["JobName"], r["State"]) for r in acct.values()} == {
        (run_id.group(1), "COMPLETED")
    }, acct
    _assert_rounds_ran_in_order(jobs, acct)
    _assert_decisions(swd, lwd)
    _assert_measured_throughput(swd)
    _assert_same_results(swd, lwd)


def _assert_rounds_ran_in_order(jobs: list[dict], acct: dict[str, dict]):
    """Two rounds of SLURM jobs: round 1 (shard 0 of each condition) and its interim
    analysis, then round 2 (shard 1), submitted after round 1's decision had ended."""
    by_rule: dict[str, list[dict]] = {}
    for job in jobs:
        by_rule.setdefault(job["rule"], []).append(job)
    interims = {j["wildcards"]["round"]: j for j in by_rule["adaptive_round"]}
    assert sorted(interims) == ["1", "2"], by_rule["adaptive_round"]
    assert {j["wildcards"]["model"] for j in interims.values()} == {"tiny-sd"}
    for rule, key in (("generate_images", "cell"), ("extract_contextbias_attributes", "condition")):
        shards = sorted((j["wildcards"]["shard"], j["wildcards"][key]) for j in by_rule[rule])
        assert shards == [(s, c) for s in "01" for c in ("CA-R", "CA-U", "CF")], (rule, shards)

    def when(job, field):
        return acct[job["slurm"]][field]

    decided = when(interims["1"], "End")
    round_1 = [j for j in jobs if j["wildcards"].get("shard") == "0"]
    round_2 = [j for j in jobs if j["wildcards"].get("shard") == "1"] + [interims["2"]]
    # sacct's times are ISO 8601 to the second: string order is time order
    assert all(when(j, "End") <= when(interims["1"], "Start") for j in round_1), acct
    assert all(when(j, "Submit") >= decided for j in round_2), (decided, round_2, acct)


def _assert_decisions(swd: Path, lwd: Path):
    """results/contextbias/adaptive/ holds each round's decision table and the table of
    all rounds: one role has no interval, so round 1 leaves the cell open and round 2
    stops it at the cap; the SLURM run's tables equal the local run's."""
    table = pl.read_parquet(swd / ADAPTIVE / "decisions.parquet")
    assert table.select("round", "decision", "reason", "shards", "model", "extractor").rows() == [
        (1, "continue", "open", 1, "tiny-sd", "fault-vlm"),
        (2, "stop", "cap reached", 2, "tiny-sd", "fault-vlm"),
    ], table
    assert table["cell"].n_unique() == 1
    assert table["effect"].to_list() == ["contextbias.bi_shift:tiny-sd"] * 2
    parts = sorted(p.relative_to(swd / ADAPTIVE) for p in (swd / ADAPTIVE).rglob("*.parquet"))
    assert [str(p) for p in parts] == [
        "decisions.parquet",
        "round_1/tiny-sd/decisions.parquet",
        "round_2/tiny-sd/decisions.parquet",
    ]
    for part in parts:
        assert_frame_equal(
            pl.read_parquet(swd / ADAPTIVE / part),
            pl.read_parquet(lwd / ADAPTIVE / part),
            check_exact=False,
            **TOLERANCE,
        )
    # the table of all rounds is the rounds' tables plus the run's budget (no cap: the
    # configured 2 shards per cell are the cap's, the GPU-hours null)
    rounds = pl.concat(pl.read_parquet(swd / ADAPTIVE / p) for p in parts[1:])
    assert_frame_equal(rounds, table.drop(BUDGET_COLUMNS))
    assert table.select(BUDGET_COLUMNS).unique().rows() == [(None,) * 4 + (2, 2)]


def _assert_measured_throughput(wd: Path):
    """The SLURM jobs' timing records and benchmark files reach the report."""
    summary = measured_throughput(wd / "results")
    by_stage = {row["stage"]: row for row in summary.to_dicts()}
    assert set(by_stage) == {"generate", "extract"}, summary
    for row in by_stage.values():
        assert row["jobs"] == 6 and row["items"] > 0, summary  # 3 conditions x 2 rounds
        assert row["s_per_item"] > 0 and row["wall_s_per_item"] > 0, summary
        assert row["peak_rss_mb"] > 0, summary
    assert by_stage["generate"]["load_s_mean"] > 0, summary
    # the report's throughput subsection shows the table (not "No job timing records")
    html = (wd / "results/report/index.html").read_text()
    assert 'id="run-throughput"' in html and 'id="run-throughput-table"' in html


# polars 1.32.3 renamed rtol/atol (the old names warn); pyproject allows older polars
TOLERANCE = (
    {"rel_tol": 0, "abs_tol": 1e-9}
    if "abs_tol" in inspect.signature(assert_frame_equal).parameters
    else {"rtol": 0, "atol": 1e-9}
)


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
            **TOLERANCE,
        )
