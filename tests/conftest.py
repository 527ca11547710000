import fcntl
import hashlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# Nothing in the test suite may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# One OpenMP thread per process (torch's CPU kernels), set before anything imports torch and
# inherited by every subprocess, unless the caller set another: pytest-xdist runs a worker
# per core, so a second thread only waits for a core (tests/README.md, "Time": the tiny
# diffusion pipeline in-process spent 2-3x the CPU with two). The value from outside ("" for
# none) is kept, as SLURM_CONF's below, for the vLLM tests, whose engines keep their own.
os.environ.setdefault("STEREOLENS_OMP_NUM_THREADS_OUTSIDE", os.environ.get("OMP_NUM_THREADS", ""))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def outside_threads_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with OMP_NUM_THREADS as it was outside the test run (unset where it was)."""
    outside = os.environ.get("STEREOLENS_OMP_NUM_THREADS_OUTSIDE", "")
    if outside:
        env["OMP_NUM_THREADS"] = outside
    else:
        env.pop("OMP_NUM_THREADS", None)
    return env


ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# No SLURM controller for the tests (tests/data/slurm/no-controller.conf says why: about 9 s
# of wall time saved per snakemake process where SLURM's client is installed). The real
# cluster test (test_slurm.py, fixture slurm_client_conf) puts SLURM_CONF_OUTSIDE back.
# The value from outside is kept in an environment variable of its own, set once by the
# first process: xdist's workers inherit the controller's environment, whose SLURM_CONF this
# module has already replaced (reading SLURM_CONF there gave the no-controller file, and the
# real cluster then started with it: slurmdbd looked for its slurmdbd.conf beside it).
os.environ.setdefault("STEREOLENS_SLURM_CONF_OUTSIDE", os.environ.get("SLURM_CONF", ""))
SLURM_CONF_OUTSIDE = os.environ["STEREOLENS_SLURM_CONF_OUTSIDE"] or None
os.environ["SLURM_CONF"] = str(ROOT / "tests/data/slurm/no-controller.conf")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


def skip_unless_ci(reason: str) -> None:
    """Skip a test whose optional tool or model package is missing, except in CI: there
    `make test` installs every one of them from the repository's files, so a missing one
    is a broken install step and must fail instead of passing silently."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI installs it through the Makefile: the install step broke)")
    pytest.skip(reason)


WORKFLOW_ITEMS = ("Snakefile", "workflow", "config", "profiles", "envs", ".test")
"""What a copy of the workflow needs (tests that run Snakemake work in a copy)."""


def copy_workflow(dest: Path, root: Path = ROOT) -> Path:
    """A copy of the workflow's files under ``dest`` (created), symlinks kept."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in WORKFLOW_ITEMS:
        src = root / item
        if src.is_dir():
            shutil.copytree(src, dest / item, symlinks=True)
        elif src.exists():
            shutil.copy2(src, dest / item)
    return dest


def workflow_env(**extra: str) -> dict[str, str]:
    """The environment a test's Snakemake or stereolens subprocess runs in: this Python's
    bin first on PATH, no hub access, plus ``extra``."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra)
    return env


# ---------------------------------------------------------------- pytest-xdist
LONGEST_FIRST = (
    # Snakemake runs, the vLLM engines, the SLURM cluster (earlier runs' wall times): the
    # demo run, the SLURM run and the vLLM workflow (CI) about 4-5 minutes each, then the
    # fault suite in three files; test_faults_api.py and test_faults_files.py start from
    # test_faults.py's undisturbed run (built once), so they come after the three long ones
    "test_workflow.py",
    "test_faults.py",
    "test_slurm.py",
    "test_vllm.py",
    "test_faults_api.py",
    "test_faults_files.py",
    "test_incremental.py",
    "test_adaptive_workflow.py",  # the adaptive demo's two rounds: 488 s wall at load 2-5
    # CPU seconds measured one file at a time (tests/README.md, "Time")
    "test_design_power.py",
    "test_coverage.py",
    "test_lvlm_run.py",
    "test_generation.py",
    "test_design_check.py",
    "test_canonical.py",
    "test_design_audit.py",
)
"""The test files that take longest, longest first."""


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (pyproject.toml: --dist loadfile --no-loadscope-reorder) a file is
    one worker's unit of work and the files are handed out in collection order. The
    longest come first, so that none starts when the other worker is nearly done: those
    of LONGEST_FIRST, then the other files with a slow test, then the rest; the tests of a
    file keep their order. A run without xdist keeps the file order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with_slow = {item.path.name for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        name = item.path.name
        if name in LONGEST_FIRST:
            return LONGEST_FIRST.index(name)
        return len(LONGEST_FIRST) + (0 if name in with_slow else 1)

    items.sort(key=rank)


# ---------------------------------------------------------------- built once per run
def shared_root(tmp_path_factory) -> Path:
    """A folder that every pytest-xdist worker of this run shares: the parent of the
    workers' own basetemps (``.../pytest-N/popen-gw0`` -> ``.../pytest-N``); without xdist
    the session's basetemp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def run_lock(tmp_path_factory, name: str) -> Iterator[Path]:
    """An exclusive lock that every xdist worker of this run shares (a file lock in
    :func:`shared_root`, which it yields): one worker at a time holds ``name``."""
    root = shared_root(tmp_path_factory)
    path = root / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield root


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """``build(dest)`` run once per pytest run, whichever xdist worker asks first; the
    others wait on :func:`run_lock` and reuse ``dest``. A build that fails is not retried
    by the other workers: they fail with its traceback. ``dest`` is shared, so its users
    must not change it."""
    with run_lock(tmp_path_factory, name) as root:
        dest = root / name
        done, failed = root / f"{name}.done", root / f"{name}.failed"
        if done.exists():
            return dest
        if failed.exists():
            pytest.fail(f"{name} failed in another worker:\n{failed.read_text()}")
        if dest.exists():
            shutil.rmtree(dest)
        try:
            build(dest)
        except BaseException:
            failed.write_text(traceback.format_exc()[-20000:])
            raise
        done.touch()
    return dest


def planned_jobs(tmp_path_factory, config: str) -> tuple[Path, subprocess.CompletedProcess]:
    """`snakemake -n --quiet rules --configfile CONFIG` (the jobs planned per rule) in a copy
    of the workflow, run once per pytest run and shared by the tests that count its jobs
    (:func:`built_once`; the paper-scale plan takes about 24 s of CPU). Returns the copy
    (a dry run must leave no ``results/`` there) and what the dry run printed."""
    name = "dry-run-" + config.replace("/", "-").removesuffix(".yaml")

    def plan(dest: Path) -> None:
        copy_workflow(dest / "wf")
        out = subprocess.run(
            [str(BIN / "snakemake"), "-n", "--quiet", "rules", "--configfile", config],
            cwd=dest / "wf",
            env=workflow_env(),
            capture_output=True,
            text=True,
        )
        (dest / "out.json").write_text(json.dumps([out.returncode, out.stdout, out.stderr]))

    dest = built_once(tmp_path_factory, name, plan)
    rc, stdout, stderr = json.loads((dest / "out.json").read_text())
    return dest / "wf", subprocess.CompletedProcess([], rc, stdout, stderr)


def run_workflow(
    wd: Path,
    config: str,
    log: str,
    what: str,
    timeout: int,
    prepare: Callable[[Path], object] | None = None,
) -> None:
    """A copy of the workflow in ``wd`` run end to end with ``config`` (profiles/local, 2
    cores), in a process group of its own that is killed with every job it started when it
    takes over ``timeout`` s (the failure says that ``what`` did) or the test is interrupted;
    its output kept in ``wd / log``; it must succeed. ``prepare(wd)`` runs on the copy
    first (e.g. :meth:`TinyModels.seed_workflow`)."""
    copy_workflow(wd)
    if prepare is not None:
        prepare(wd)
    argv = [str(BIN / "snakemake"), "--profile", "profiles/local", "--cores", "2"]
    argv += ["--configfile", config]
    proc = subprocess.Popen(
        argv, cwd=wd, env=workflow_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # snakemake and the jobs it started
        stdout, stderr = proc.communicate()
        stderr += f"\n{what} took over {timeout} s (STEREOLENS_DEMO_TIMEOUT)"
    except BaseException:  # interrupted: leave no job running
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    (wd / log).write_text(stdout + stderr)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]


def dry_run_jobs(text: str) -> list[dict]:
    """The jobs a `snakemake -n` (or a run) printed (``text``): one dict per job (rules and
    checkpoints) with rule, jobid, wildcards and reason."""
    jobs: dict[str, dict] = {}
    current: dict | None = None
    for line in text.splitlines():
        m = re.match(r"^(?:local)?(?:rule|checkpoint) (\S+):$", line)
        if m:
            current = {"rule": m.group(1), "wildcards": {}, "reason": ""}
        elif current is not None and line.startswith("    jobid: "):
            # the job list can be printed twice (log and summary): key jobs by id
            current = jobs.setdefault(line.split(": ", 1)[1], current)
            current["jobid"] = line.split(": ", 1)[1]
        elif current is not None and line.startswith("    wildcards: "):
            for item in line.split(": ", 1)[1].split(", "):
                key, _, value = item.partition("=")
                current["wildcards"][key] = value
        elif current is not None and line.startswith("    reason: "):
            current["reason"] = line.split(": ", 1)[1]
    return list(jobs.values())


# ---------------------------------------------------------------- tiny models, once per run
TINY_BUILDERS = {
    "tiny-diffusion": "stereolens.models.tiny.diffusion:build_tiny_diffusion",
    "tiny-vlm": "stereolens.models.tiny.vlm:build_tiny_vlm",
    "tiny-vlm-vllm": "stereolens.models.tiny.vlm:build_tiny_vllm_vlm",
}
"""The registry's ``build:`` values and the functions behind them (``stereolens build-tiny
--builder B``, which the workflow's build_tiny_model rule runs with the default seed 0)."""


def folder_digest(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder``, by relative path."""
    return {
        str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


class TinyModels:
    """The tiny random-weight checkpoints, each built once per test run on first use (seed
    0, as `stereolens build-tiny` builds them) into a folder every xdist worker shares
    (:func:`built_once`). The folders are shared: a test that changes a model's files
    works on :meth:`copy`. At the end of the run every shared folder must still hold the
    files it was built with (the digests its builder recorded)."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.built: dict[str, Path] = {}
        self.digests: dict[str, dict[str, str]] = {}

    def path(self, builder: str) -> Path:
        if builder not in self.built:
            module, func = TINY_BUILDERS[builder].split(":")
            build = getattr(importlib.import_module(module), func)
            name = f"tiny-models/{builder}"

            def build_and_record(dest: Path) -> None:
                build(dest, seed=0)
                digests = dest.parent / f"{builder}.digests.json"
                digests.write_text(json.dumps(folder_digest(dest)))

            path = built_once(self.tmp_path_factory, name, build_and_record)
            recorded = path.parent / f"{builder}.digests.json"
            self.digests[builder] = json.loads(recorded.read_text())
            self.built[builder] = path
        return self.built[builder]

    def copy(self, builder: str, dest: Path) -> Path:
        """A private copy of a tiny model at ``dest``, for a test that changes its files."""
        shutil.copytree(self.path(builder), dest, symlinks=True)
        return dest

    def seed_workflow(
        self, wd: Path, registry: str = "config/models.yaml", only: tuple[str, ...] = ()
    ) -> list[str]:
        """Copy into the workflow copy ``wd`` the tiny checkpoints its registry builds (the
        folders rule build_tiny_model writes: each entry's ``model`` with a ``build:``), or
        ``only`` those of these paths, so Snakemake finds them and builds none. The files
        are the ones the rule would write (test_tiny_checkpoints.py checks this). Returns
        the seeded paths."""
        from stereolens.models.registry import load_registry

        checkpoints = {
            spec.model: spec.get("build")
            for spec in load_registry(wd / registry).values()
            if spec.get("build")
        }
        missing = set(only) - set(checkpoints)
        assert not missing, f"{registry} builds no {sorted(missing)}"
        seeded = sorted(only or checkpoints)
        for rel in seeded:
            assert not (wd / rel).exists(), f"{wd / rel} is there already"
            self.copy(checkpoints[rel], wd / rel)
        return seeded

    def check_unchanged(self) -> None:
        for builder, path in self.built.items():
            assert folder_digest(path) == self.digests[builder], (
                f"a test changed the shared tiny model {path}: take TinyModels.copy()"
            )


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    models = TinyModels(tmp_path_factory)
    yield models
    models.check_unchanged()


@pytest.fixture(scope="session")
def tiny_sd(tiny_models) -> Path:
    """The tiny diffusion pipeline (builder tiny-diffusion), shared: do not change it."""
    pytest.importorskip("diffusers")
    return tiny_models.path("tiny-diffusion")


@pytest.fixture(scope="session")
def tiny_vlm_dir(tiny_models) -> Path:
    """The tiny VLM (builder tiny-vlm), shared: do not change it."""
    pytest.importorskip("transformers")
    return tiny_models.path("tiny-vlm")
