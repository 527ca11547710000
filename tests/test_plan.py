"""`stereolens plan`: counts match the workflow's dry run; GPU-hour arithmetic; estimates."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import copy_workflow, planned_jobs

from stereolens.config import load_config
from stereolens.plan import format_plan, load_throughput, plan, register
from stereolens.validation import ConfigError

BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def _in_repo(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)  # configs name the registry relative to the repo root


def _rows(result, benchmark, stage):
    return {
        r["model"]: r for r in result["rows"] if (r["benchmark"], r["stage"]) == (benchmark, stage)
    }


def _snakemake_counts(tmp_path_factory, config: str) -> dict[str, int]:
    """The dry run's jobs per rule (run once per pytest run: conftest.planned_jobs; the
    paper-scale one is test_workflow.py's too)."""
    _, out = planned_jobs(tmp_path_factory, config)
    assert out.returncode == 0, out.stdout + out.stderr
    counts = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    return counts


def _stage_jobs(result, benchmark, stage):
    return sum(r["jobs"] for r in _rows(result, benchmark, stage).values())


def test_demo_counts_by_hand():
    config, registry = load_config("config/demo.yaml")
    result = plan(config, registry)
    gen = _rows(result, "contextbias", "generate")
    # ContextBias: 2 roles x 3 conditions x ceil(1 seed / 1 per shard) = 6 jobs, plus the
    # validation: nurse and carpenter x ceil(1 / 1) = 2 jobs -> 8 for its one generator.
    # Prompts in the shipped bank: carpenter 3 CF + 7 CA-R + 8 CA-U = 18, nurse 3 + 8 + 8 = 19,
    # so 37 x 1 seed = 37 images; validation prompts: carpenter 5 + nurse 3 = 8 x 1 seed;
    # 45 images.
    assert set(gen) == {"tiny-sd-b"}
    assert {(r["jobs"], r["images"]) for r in gen.values()} == {(8, 45)}
    # one extractor: every generation job and image once
    ext = _rows(result, "contextbias", "extract")["tiny-vlm"]
    assert (ext["jobs"], ext["calls"]) == (8, 45)
    # BiasIG: rich and poor (characteristic), 1 variant: 20 prompts in 2 (implicit /
    # explicit) groups of at most 20 -> 2 jobs; 20 x 2 images = 40.
    bg = _rows(result, "biasig", "generate")
    assert {(r["jobs"], r["images"]) for r in bg.values()} == {(2, 40)}
    vqa = _rows(result, "biasig", "vqa")["tiny-vlm"]
    assert (vqa["jobs"], vqa["calls"]) == (4, 80)
    # LVLM: one axis, gender (2 groups), one shard per task and group -> 4 tasks x 2 = 8
    # response jobs. Calls = images x prompts per group: story 3 x 1, term 2 x 6 terms,
    # exam 2 x 6 questions, attribute-inferring 2 x 1 -> 2 x 29 = 58.
    lv = _rows(result, "lvlm", "respond")["tiny-vlm"]
    assert (lv["jobs"], lv["calls"]) == (8, 58)
    # assistant: story and judge for the one axis = 2 jobs; calls = 6 stories + judged pairs
    # (gender 1 pair x 2 images x 6 terms = 12) = 18; plus the story-reading audit
    # (lvlm.story_reading): 1 job, 1 story x 2 genders x 1 race (not an axis: its first
    # group) = 2
    asst = _rows(result, "lvlm", "assistant")["smollm2-135m"]
    assert (asst["jobs"], asst["calls"]) == (2 + 1, 18 + 2)
    # everything runs on the CPU: no GPU-hours, no estimates
    assert result["totals"]["gpu_hours"] == 0
    assert {r["status"] for r in result["rows"]} == {"cpu"}
    assert result["totals"]["jobs"] == 8 + 8 + 4 + 4 + 8 + 2 + 1


@pytest.mark.parametrize(
    "config", ["config/demo.yaml", pytest.param("config/config.yaml", marks=pytest.mark.slow)]
)
def test_job_counts_match_snakemake(tmp_path_factory, config):
    counts = _snakemake_counts(tmp_path_factory, config)
    result = plan(*load_config(config))
    # both benchmarks generate through the one rule generate_images
    assert (
        _stage_jobs(result, "contextbias", "generate") + _stage_jobs(result, "biasig", "generate")
        == counts["generate_images"]
    )
    assert _stage_jobs(result, "contextbias", "extract") == counts["extract_contextbias_attributes"]
    assert _stage_jobs(result, "biasig", "vqa") == counts["answer_biasig_vqa"]
    assert _stage_jobs(result, "lvlm", "respond") == counts["respond_lvlm"]
    assert _stage_jobs(result, "lvlm", "assistant") == (
        counts["extract_lvlm_story_attributes"]
        + counts["judge_lvlm_terms"]
        + counts["read_lvlm_story_sample"]
    )


def test_paper_counts_and_gpu_hours(tmp_path):
    table = tmp_path / "t.yaml"
    table.write_text(
        yaml.safe_dump(
            {
                "gpu": "test GPU",
                "entries": {
                    "sdxl": {"seconds_per_image": 2.0, "status": "measured", "source": "test"},
                    "qwen2.5-vl-7b": {
                        "seconds_per_call": 0.5,
                        "status": "estimate",
                        "source": "test",
                    },
                    "sd1.5": {"seconds_per_image": 0.3, "status": "estimate", "source": "test"},
                },
            }
        )
    )
    config, registry = load_config("config/config.yaml")
    result = plan(config, registry, load_throughput(table))
    gen = _rows(result, "contextbias", "generate")
    # 92 roles x 3 conditions x 1 shard + 73 validation roles x 1 shard = 349 jobs;
    # 1,659 prompts x 10 seeds + 220 validation prompts x 10 seeds = 18,790 images
    assert (gen["sdxl"]["jobs"], gen["sdxl"]["images"]) == (349, 18_790)
    # 18,790 images x 2.0 s / 3600 = 10.4389 h
    assert gen["sdxl"]["gpu_hours"] == pytest.approx(10.438889, rel=1e-6)
    assert gen["sdxl"]["status"] == "measured"
    ext = _rows(result, "contextbias", "extract")
    # 4 generators x 18,790 = 75,160 calls x 0.5 s / 3600 = 10.4389 h
    assert ext["qwen2.5-vl-7b"]["calls"] == 75_160
    assert ext["qwen2.5-vl-7b"]["gpu_hours"] == pytest.approx(10.438889, rel=1e-6)
    assert ext["gpt-5-mini"]["status"] == "api" and ext["gpt-5-mini"]["gpu_hours"] == 0
    bg = _rows(result, "biasig", "generate")
    # 47,040 prompts x 10 images = 470,400 images x 0.3 s / 3600 = 39.2 h; 589 jobs of up
    # to 80 prompts
    assert (bg["sd1.5"]["jobs"], bg["sd1.5"]["images"]) == (589, 470_400)
    assert bg["sd1.5"]["gpu_hours"] == pytest.approx(39.2)
    # models without a figure: no GPU-hours, listed as unknown; the total says incomplete
    assert bg["playground-v2.5"]["gpu_hours"] is None
    assert "playground-v2.5" in result["unknown"]
    # LVLM: qwen2.5-vl-7b is also audited: 9 groups (2 genders + 7 races) x (story 500 x 1
    # + term 100 x 120 + exam 100 x 600 + attribute-inferring 100 x 1) = 653,400 calls in
    # 9 x (2 + 2 + 2 + 1) = 63 jobs; x 0.5 s / 3600 = 90.75 h
    lv = _rows(result, "lvlm", "respond")["qwen2.5-vl-7b"]
    assert (lv["jobs"], lv["calls"]) == (63, 653_400)
    assert lv["gpu_hours"] == pytest.approx(90.75)
    assert result["totals"]["gpu_hours"] == pytest.approx(10.438889 * 2 + 39.2 + 90.75, rel=1e-6)
    assert not result["totals"]["gpu_hours_complete"]
    assert result["estimated"] == ["qwen2.5-vl-7b", "sd1.5"]
    assert "+?" in format_plan(result)


def test_shipped_throughput_table_covers_the_paper_config_and_flags_estimates():
    table = load_throughput("config/throughput.yaml")
    result = plan(*load_config("config/config.yaml"), table)
    assert result["unknown"] == []
    assert result["totals"]["gpu_hours_complete"]
    # every shipped figure is an estimate (none was timed at the registry's settings)
    assert {e["status"] for e in table["entries"].values()} == {"estimate"}
    assert set(result["estimated"]) == {
        r["model"] for r in result["rows"] if r["status"] not in ("api", "cpu")
    }
    gen = _rows(result, "contextbias", "generate")
    # sdxl at 4.6 s: 18,790 x 4.6 / 3600 = 24.0094 h
    assert gen["sdxl"]["gpu_hours"] == pytest.approx(24.009444, rel=1e-6)
    text = format_plan(result)
    assert "Estimates (not measured)" in text and "sdxl" in text


def test_bad_throughput_table_names_the_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "entries": {
                    "sdxl": {"seconds_per_image": 1, "status": "guess", "source": "x"},
                    "flux.1-dev": {
                        "seconds_per_image": 1,
                        "seconds_per_call": 1,
                        "status": "estimate",
                        "source": "x",
                    },
                    "sd1.5": {"seconds_per_image": -1, "status": "estimate", "source": "x"},
                }
            }
        )
    )
    with pytest.raises(ConfigError) as err:
        load_throughput(bad)
    msg = str(err.value)
    assert "entries.sdxl.status" in msg and "measured, estimate" in msg
    assert "entries.flux.1-dev: give exactly one of" in msg
    assert "entries.sd1.5.seconds_per_image" in msg


def test_cli_json(capsys):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["plan", "--configfile", "config/demo.yaml", "--throughput", "config/throughput.yaml"]
        + ["--json"]
    )
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["totals"]["jobs"] == 24 + 11  # ContextBias and BiasIG, LVLM 8 + 2 + 1
    assert out["gpu"] == "H100 SXM 80GB"


# ---------------------------------------------------------------- SLURM groups


def _dry_run_log(wd: Path, *args: str) -> str:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env["HF_HUB_OFFLINE"] = "1"
    out = subprocess.run(
        [str(BIN / "snakemake"), "-n", *args, "--configfile", "config/demo.yaml"],
        cwd=wd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return out.stdout + out.stderr


def _group_jobs(log: str) -> dict[str, int]:
    """Group jobs of a dry run: group name -> number of group jobs (submissions)."""
    counts: dict[str, int] = {}
    for name in re.findall(r"Group job (\S+) \(jobs", log):
        counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.mark.slow
def test_slurm_profile_groups_small_cpu_jobs(repo_root, tmp_path):
    """profiles/slurm batches the many small CPU jobs into group jobs (fewer SLURM
    submissions): extraction and VQA of CPU/API models 5 per group, the ContextBias
    table jobs after the merge and the two prompt tables one group each. Local runs have
    no groups; a GPU model's extraction jobs are never grouped."""
    copy_workflow(tmp_path, repo_root)
    profile = yaml.safe_load((repo_root / "profiles/slurm/config.yaml").read_text())
    assert profile["group-components"]["cpu-extract"] == 5
    log = _dry_run_log(tmp_path, "--profile", "profiles/slurm")
    groups = _group_jobs(log)
    # the demo: 8 extraction jobs and 4 VQA jobs of the CPU model tiny-vlm
    assert groups == {
        "cpu-extract": 2,  # ceil(8 / 5)
        "cpu-vqa": 1,  # ceil(4 / 5)
        "contextbias-tables": 1,
        "prompt-tables": 1,
    }
    # every grouped job is still planned once
    assert len(re.findall(r"^\s*rule extract_contextbias_attributes:", log, re.M)) == 8
    # without the profile (local runs) nothing is grouped
    assert _group_jobs(_dry_run_log(tmp_path)) == {}
    # an extractor on the GPU: its jobs each go to SLURM alone
    registry = tmp_path / "config/models.yaml"
    text = registry.read_text()
    start = text.index("\n  tiny-vlm:\n")
    entry_end = text.index("\n\n", start)
    entry = text[start:entry_end]
    assert "device: cpu" in entry
    registry.write_text(
        text[:start] + entry.replace("device: cpu", "device: cuda") + text[entry_end:]
    )
    groups = _group_jobs(_dry_run_log(tmp_path, "--profile", "profiles/slurm"))
    assert "cpu-extract" not in groups and "cpu-vqa" not in groups
    assert groups["contextbias-tables"] == 1
