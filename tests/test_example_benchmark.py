"""A fourth benchmark from outside: examples/mybench, a project of its own (pyproject.toml
with an entry point of the group stereolens.benchmarks), pip-installed into a folder of
this test (``--target``, on PYTHONPATH of the subprocesses: the environment's own
site-packages stay as they are), runs through `stereolens plan`, a Snakemake dry run, a
real run with the tiny VLM, `stereolens report` and `stereolens regenerate` in a copy of
the workflow, with no file of stereolens changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import copy_workflow, workflow_env

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mybench"
BIN = Path(sys.executable).parent
TARGET = "results/mybench/metrics/scores.parquet"
ANSWERS = "results/mybench/vqa/tiny-vlm/answers.jsonl"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """examples/mybench installed by pip into a folder of its own (a copy of the project is
    built, so nothing is written into the repository)."""
    base = tmp_path_factory.mktemp("mybench")
    project = shutil.copytree(EXAMPLE, base / "project", ignore=shutil.ignore_patterns("build"))
    site = base / "site"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--target", str(site), str(project)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert (site / "mybench" / "rules" / "mybench.smk").is_file()  # its rules in its package
    return site


@pytest.fixture(scope="module")
def wd(installed, tmp_path_factory, tiny_models) -> Path:
    """A copy of the workflow with a config that turns MyBench on (the demo's, plus the
    section `mybench:`), the tiny checkpoints in place."""
    wd = copy_workflow(tmp_path_factory.mktemp("wd"))
    config = yaml.safe_load((wd / "config" / "demo.yaml").read_text())
    config["mybench"] = {"enabled": True, "models": ["tiny-vlm"], "questions": 3}
    (wd / "config" / "mybench.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    tiny_models.seed_workflow(wd, only=("resources/models/tiny-vlm",))
    return wd


def _env(installed: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(installed), os.environ.get("PYTHONPATH")) if p)
    return workflow_env(PYTHONPATH=path, OMP_NUM_THREADS="1")


def _run(wd: Path, installed: Path, *cmd: str, timeout: int = 600) -> str:
    out = subprocess.run(
        list(cmd), cwd=wd, env=_env(installed), capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"{' '.join(cmd)}:\n{out.stdout[-4000:]}\n{out.stderr[-6000:]}"
    return out.stdout


def test_stereolens_is_unchanged_and_knows_nothing_of_mybench():
    """The proof below changes no file of stereolens: nothing there names the benchmark."""
    for folder in ("src", "workflow", "config"):
        hits = [
            str(p.relative_to(ROOT))
            for p in (ROOT / folder).rglob("*")
            if p.is_file() and p.suffix in {".py", ".smk", ".yaml"} and "mybench" in p.read_text()
        ]
        assert hits == [], f"stereolens names mybench in {hits}"
    assert "mybench" not in (ROOT / "Snakefile").read_text()


def test_plan_counts_its_jobs(wd, installed):
    out = json.loads(
        _run(wd, installed, str(BIN / "stereolens"), "plan", "--json",
             "--configfile", "config/mybench.yaml")
    )  # fmt: skip
    rows = [r for r in out["rows"] if r["benchmark"] == "mybench"]
    assert [(r["stage"], r["model"], r["jobs"], r["calls"]) for r in rows] == [
        ("vqa", "tiny-vlm", 1, 3)
    ]


def test_dry_run_lists_its_rules(wd, installed):
    out = _run(
        wd, installed, str(BIN / "snakemake"), "-n", "--quiet", "rules",
        "--configfile", "config/mybench.yaml",
    )  # fmt: skip
    counts = dict(
        (p[0], int(p[1])) for p in (line.split() for line in out.splitlines()) if len(p) == 2
        and p[1].isdigit()
    )  # fmt: skip
    assert counts["answer_mybench"] == 1 and counts["score_mybench"] == 1
    assert counts["generate_images"] > 0  # the built-in benchmarks are there as before


def test_cli_has_its_subcommand(wd, installed):
    out = _run(wd, installed, str(BIN / "stereolens"), "mybench", "score", "--help")
    assert "ANSWERS" in out


def test_real_run_report_and_regenerate(wd, installed):
    """Its rules run with the tiny VLM (one answer job, then the scores), the job records
    its timing where the measured throughput looks, `stereolens report` renders its
    section from the results folder, and `stereolens regenerate --benchmark mybench`
    redoes its model job and the scores."""
    smk = str(BIN / "snakemake")
    _run(wd, installed, smk, "-c2", TARGET, "--configfile", "config/mybench.yaml")
    scores = pl.read_parquet(wd / TARGET)
    assert scores["model"].to_list() == ["tiny-vlm"] and scores["questions"].to_list() == [3]
    answers = [json.loads(line) for line in (wd / ANSWERS).read_text().splitlines()]
    assert [a["question_id"] for a in answers] == [0, 1, 2]
    assert all(a["attempts"] >= 1 for a in answers)

    # the measured throughput finds its job (in a process of its own: the benchmark table
    # is read once per process, and this one's must stay without mybench)
    code = (
        "from stereolens.throughput import collect_jobs; import polars as pl; "
        "jobs = collect_jobs('results').filter(pl.col('benchmark') == 'mybench'); "
        "print(jobs.select('stage', 'model', 'items').rows())"
    )
    out = _run(wd, installed, sys.executable, "-c", code)
    assert out.strip() == "[('vqa', 'tiny-vlm', 3)]"

    report = wd / "report" / "index.html"
    out = _run(
        wd, installed, str(BIN / "stereolens"), "report", "--results", "results",
        "--out", str(report), "--no-galleries",
    )  # fmt: skip
    assert json.loads(out.strip().splitlines()[-1])["missing_tables"] == []
    html = report.read_text()
    assert 'id="mybench"' in html and "models: tiny-vlm" in html

    before = (wd / ANSWERS).stat().st_mtime_ns
    out = _run(
        wd, installed, str(BIN / "stereolens"), "regenerate", "--configfile",
        "config/mybench.yaml", "--benchmark", "mybench", "--", "-c2", TARGET,
    )  # fmt: skip
    assert "regenerating 1 output(s)" in out
    assert (wd / ANSWERS).stat().st_mtime_ns > before
    assert pl.read_parquet(wd / TARGET)["model"].to_list() == ["tiny-vlm"]
