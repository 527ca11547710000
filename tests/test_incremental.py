"""Incremental reruns (issue "Cluster scale", item 3): what `snakemake -n` plans after a
config or registry change, on the embedded default (config/demo.yaml).

"Everything done" for the embedded default is simulated without running a model: every
output the dry run lists is created empty (a folder for directory outputs), then
`snakemake --touch --forceall` marks all jobs as run. Touching goes through the same
job post-processing as a real run, so it records the metadata (params, input set, code)
the rerun triggers compare against; the fixture checks that the result plans nothing.
The placeholders' content is read by nothing in a dry run. All later calls are dry runs
with Snakemake's default rerun triggers, as a user would run them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import copy_workflow, dry_run_jobs, workflow_env

BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")

# rules whose output is a directory(...), of every benchmark (checked below to include these)
KNOWN_DIRECTORY_RULES = {"generate_images", "build_tiny_model"}
# jobs that depend on one model only (everything else is an aggregate, the report or `all`)
PER_MODEL_RULES = {
    "generate_images",
    "extract_contextbias_attributes",
    "answer_biasig_vqa",
    # the first step of each merge: one job per model, so adding one merges only its shards
    "merge_contextbias_model_attributes",
    "merge_biasig_model_answers",
    "merge_lvlm_model_responses",
}
CB_GENERATORS = "generators: [tiny-sd-b]"
# the demo has one ContextBias generator; removing or reordering needs two
CB_TWO_GENERATORS = "generators: [tiny-sd, tiny-sd-b]"
BG_GENERATORS = "generators: [tiny-sd, tiny-sd-intervention]"


def _snakemake(wd: Path, *args: str) -> str:
    out = subprocess.run(
        [SNAKEMAKE, *args], cwd=wd, env=workflow_env(), capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def _dry_run(wd: Path, config: str = "config/demo.yaml") -> list[dict]:
    """Jobs of `snakemake -n`: one dict per job with rule, wildcards and reason."""
    return _plan(wd, config)[0]


def _plan(wd: Path, config: str = "config/demo.yaml") -> tuple[list[dict], dict[str, int]]:
    """The jobs of one `snakemake -n` (:func:`_dry_run`) and its per-rule job counts (its
    "Job stats" table, which `--quiet rules` prints alone: :func:`_rule_counts`)."""
    text = _snakemake(wd, "-n", "--configfile", config)
    return dry_run_jobs(text), _job_stats(text)


def _job_stats(text: str) -> dict[str, int]:
    """The last "Job stats:" table of a dry run, without its total (empty: none)."""
    counts: dict[str, int] = {}
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line == "Job stats:"]
    for line in lines[starts[-1] + 3 :] if starts else []:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        if parts[0] != "total":
            counts[parts[0]] = int(parts[1])
    return counts


def _rule_counts(wd: Path, config: str = "config/demo.yaml") -> dict[str, int]:
    """Per-rule job counts from `snakemake -n --quiet rules` (empty: nothing to do)."""
    text = _snakemake(wd, "-n", "--quiet", "rules", "--configfile", config)
    counts = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
            counts[parts[0]] = int(parts[1])
    return counts


def _write_config(
    wd: Path, name: str, *replacements: tuple[str, str], base: str = "config/demo.yaml"
) -> str:
    text = (wd / base).read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    (wd / "config" / name).write_text(text)
    return f"config/{name}"


def _directory_rules(wd: Path) -> set[str]:
    """Rules whose output is a directory(...), read from the rule files."""
    found = set()
    for smk in (wd / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        for name, body in re.findall(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", text, re.M | re.S):
            if "directory(" in body:
                found.add(name)
    assert KNOWN_DIRECTORY_RULES <= found, found
    return found


def _make_done(wd: Path, config: str) -> None:
    """Every output of ``config`` present (placeholders) and touched up to date."""
    summary = _snakemake(wd, "--summary", "--configfile", config)
    directory_rules = _directory_rules(wd)
    n = 0
    for line in summary.splitlines():
        fields = line.split("\t")
        if len(fields) < 3 or fields[0] == "output_file":
            continue
        path, rule = wd / fields[0], fields[2]
        # a rule may have file and directory outputs (render_report: index.html beside
        # figures/, tables/, galleries/); its directories are the outputs without a suffix
        if rule in directory_rules and not path.suffix:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            # a parquet placeholder is a valid empty parquet file: the workflow's parse
            # refuses a damaged one (a 0-byte file is one: stereolens.damage)
            if path.suffix == ".parquet":
                pl.DataFrame().write_parquet(path)
            else:
                path.touch()
        n += 1
    assert n > 50
    _snakemake(wd, "--touch", "--forceall", "--cores", "1", "--configfile", config)
    assert _rule_counts(wd, config) == {}, f"the touched {config} must be up to date"


@pytest.fixture(scope="module")
def done(repo_root, tmp_path_factory) -> Path:
    """A copy of the workflow on which the demo is 'done' (placeholders, touched)."""
    wd = tmp_path_factory.mktemp("incremental")
    copy_workflow(wd, repo_root)
    _make_done(wd, "config/demo.yaml")
    return wd


@pytest.fixture(scope="module")
def done_two(repo_root, tmp_path_factory) -> Path:
    """The same with a second ContextBias generator (tiny-sd) in config/two.yaml."""
    wd = tmp_path_factory.mktemp("incremental_two")
    copy_workflow(wd, repo_root)
    _write_config(wd, "two.yaml", (CB_GENERATORS, CB_TWO_GENERATORS))
    _make_done(wd, "config/two.yaml")
    return wd


def _models(jobs: list[dict]) -> set[str]:
    return {j["wildcards"]["model"] for j in jobs if j["rule"] in PER_MODEL_RULES}


@pytest.mark.slow
def test_adding_a_generator_runs_only_that_generator(done):
    cfg = _write_config(done, "add.yaml", (CB_GENERATORS, "generators: [tiny-sd-b, tiny-sd-fair]"))
    jobs, counts = _plan(done, cfg)
    assert counts == _rule_counts(done, cfg)  # the dry run's table is --quiet rules'
    assert _models(jobs) == {"tiny-sd-fair"}
    # 2 roles x (3 conditions + VAL) x 1 shard for the new model; one extractor
    assert counts.pop("generate_images") == 2 * 4
    assert {j["wildcards"]["benchmark"] for j in jobs if j["rule"] == "generate_images"} == {
        "contextbias"
    }
    assert counts.pop("extract_contextbias_attributes") == 2 * 4
    assert counts.pop("check_models") == 1  # the new model's check (off: a note)
    assert counts.pop("merge_contextbias_model_attributes") == 1  # its shards only
    # the aggregates that read the new model's results, and nothing of BiasIG
    assert set(counts) == {
        "write_contextbias_prompts",  # per-model seeds: its table gains the model's rows
        "merge_contextbias_attributes",
        "merge_contextbias_validation",
        "canonicalise_contextbias_labels",
        "score_contextbias_validation",
        "compute_contextbias_metrics",
        "export_contextbias_annotation",
        "audit_contextbias_extraction_by_group",  # reads every generator's extractions
        "simulate_contextbias_human_labels",  # the demo's simulated labels: every model's
        "correct_contextbias_reader",  # the corrected table: every model's
        "collect_job_timings",  # reads every model job's timings
        "render_report",
        "all",
    }
    assert set(counts.values()) == {1}


def test_changing_one_model_reruns_only_that_model(done):
    registry = done / "config/models.yaml"
    original = registry.read_text()
    start = original.index("  tiny-sd-b:")
    end = original.index("steps: 3", start)
    try:
        registry.write_text(original[:end] + "steps: 4" + original[end + len("steps: 3") :])
        jobs = _dry_run(done)
    finally:
        registry.write_text(original)
    assert _models(jobs) == {"tiny-sd-b"}
    generate = [j for j in jobs if j["rule"] == "generate_images"]
    assert len(generate) == 2 * 4
    assert all(j["reason"].startswith("Params have changed") for j in generate)
    assert {j["wildcards"]["benchmark"] for j in generate} == {"contextbias"}


def test_removing_a_model_deletes_nothing(done_two):
    done = done_two
    before = sorted(p for p in (done / "results").rglob("*") if "tiny-sd-b" in p.parts)
    assert before
    cfg = _write_config(
        done, "remove.yaml", (CB_TWO_GENERATORS, "generators: [tiny-sd]"), base="config/two.yaml"
    )
    jobs = _dry_run(done, cfg)
    # no generation or extraction for the models that stay; only aggregates rerun
    assert _models(jobs) == set()
    assert {j["rule"] for j in jobs} <= {
        "write_contextbias_prompts",
        "merge_contextbias_attributes",
        "merge_contextbias_validation",
        "canonicalise_contextbias_labels",
        "score_contextbias_validation",
        "compute_contextbias_metrics",
        "export_contextbias_annotation",
        "audit_contextbias_extraction_by_group",  # reads every generator's extractions
        "simulate_contextbias_human_labels",  # the demo's simulated labels: every model's
        "correct_contextbias_reader",  # the corrected table: every model's
        "collect_job_timings",  # reads every model job's timings
        "render_report",
        "all",
    }
    after = sorted(p for p in (done / "results").rglob("*") if "tiny-sd-b" in p.parts)
    assert after == before


def test_adding_a_model_to_the_registry_only_triggers_nothing(done):
    registry = done / "config/models.yaml"
    original = registry.read_text()
    entry = (
        "  tiny-sd-extra:\n    backend: diffusers\n    model: resources/models/tiny-sd\n"
        "    build: tiny-diffusion\n    dtype: float32\n    device: cpu\n    resolution: 32\n"
        "    steps: 4\n    guidance: 2.0\n    batch_size: 8\n\n"
    )
    try:
        registry.write_text(original.replace("\nvlms:\n", f"\n{entry}vlms:\n", 1))
        counts = _rule_counts(done)
    finally:
        registry.write_text(original)
    assert counts == {}


def test_reordering_contextbias_models_triggers_nothing(done_two):
    cfg = _write_config(
        done_two,
        "reorder.yaml",
        (CB_TWO_GENERATORS, "generators: [tiny-sd-b, tiny-sd]"),
        base="config/two.yaml",
    )
    jobs = _dry_run(done_two, cfg)
    assert _models(jobs) == set()  # holds; the aggregates are the failure
    assert jobs == []


def test_reordering_biasig_models_triggers_nothing(done):
    cfg = _write_config(
        done, "reorder_bg.yaml", (BG_GENERATORS, "generators: [tiny-sd-intervention, tiny-sd]")
    )
    jobs = _dry_run(done, cfg)
    assert {j["rule"] for j in jobs} <= {"render_report", "all"}  # holds
    assert jobs == []


def _edit_entry(registry: Path, name: str, old: str, new: str) -> str:
    """The registry text with ``old`` replaced by ``new`` inside the entry ``name``."""
    text = registry.read_text()
    start = text.index(f"\n  {name}:\n") + 1
    nxt = re.search(r"\n(?:  )?[^ \n#]", text[start + 1 :])  # the next entry or section
    end = start + 1 + nxt.start() if nxt else len(text)
    entry = text[start:end]
    assert old in entry, (name, old)
    return text[:start] + entry.replace(old, new, 1) + text[end:]


def test_changing_a_biasig_model_reruns_only_its_biasig_jobs(done):
    registry = done / "config/models.yaml"
    original = registry.read_text()
    try:
        registry.write_text(
            _edit_entry(
                registry,
                "tiny-sd-intervention",
                "if all individuals can be any gender",
                "if all individuals can be any gender or age",
            )
        )
        jobs = _dry_run(done)
    finally:
        registry.write_text(original)
    assert _models(jobs) == {"tiny-sd-intervention"}
    generate = [j for j in jobs if j["rule"] == "generate_images"]
    # rich/poor (characteristic) x implicit/explicit, one shard each
    assert len(generate) == 2
    assert {j["wildcards"]["benchmark"] for j in generate} == {"biasig"}
    assert all(j["reason"].startswith("Params have changed") for j in generate)
    assert len([j for j in jobs if j["rule"] == "answer_biasig_vqa"]) == 2
    assert len([j for j in jobs if j["rule"] == "merge_biasig_model_answers"]) == 1
    assert not any(j["rule"].startswith(("extract_contextbias", "merge_contextbias")) for j in jobs)


def test_scheduler_settings_rerun_the_model(done):
    registry = done / "config/models.yaml"
    original = registry.read_text()
    scheduler = "scheduler: {class: EulerDiscreteScheduler, config: {timestep_spacing: trailing}}"
    try:
        registry.write_text(
            _edit_entry(registry, "tiny-sd-b", "steps: 3\n", f"steps: 3\n    {scheduler}\n")
        )
        jobs = _dry_run(done)
    finally:
        registry.write_text(original)
    assert _models(jobs) == {"tiny-sd-b"}
    assert len([j for j in jobs if j["rule"] == "generate_images"]) == 2 * 4


def test_runtime_only_settings_trigger_nothing(done):
    """Batch size and memory change how a job runs, not what it makes."""
    registry = done / "config/models.yaml"
    original = registry.read_text()
    try:
        registry.write_text(
            _edit_entry(registry, "tiny-sd", "batch_size: 8\n", "batch_size: 2\n    mem_mb: 6000\n")
        )
        counts = _rule_counts(done)
    finally:
        registry.write_text(original)
    assert counts == {}


def test_correction_settings_do_not_redraw_the_simulated_labels(done):
    """reader_correction.replicates is an input of the correction, not of the simulated
    human labels (metrics.command.SIMULATE_SETTINGS): changing it reruns the correct rules
    and the report only; changing flip_fraction redraws the labels too."""
    # the three reader_correction sections' replicates (not the LVLM metrics' own)
    reps = "human_labels_simulated.parquet)\n    replicates: 200\n"
    cfg = _write_config(done, "replicates.yaml", (reps, reps.replace("200", "300")))
    counts = _rule_counts(done, cfg)
    assert counts == {
        "correct_contextbias_reader": 1,
        "correct_biasig_reader": 1,
        "correct_lvlm_reader": 1,
        "render_report": 1,
        "all": 1,
    }
    flip = _write_config(done, "flip.yaml", (reps, reps + "    flip_fraction: 0.2\n"))
    redrawn = _rule_counts(done, flip)
    for bench in ("contextbias", "biasig", "lvlm"):
        assert redrawn[f"simulate_{bench}_human_labels"] == 1
        assert redrawn[f"correct_{bench}_reader"] == 1


@pytest.mark.slow
def test_adding_an_lvlm_runs_only_that_models_lvlm_jobs(done):
    """A second audited LVLM: its response, assistant and refusal jobs, then the LVLM tables
    and the report; nothing of ContextBias, BiasIG or the first LVLM."""
    registry = done / "config/models.yaml"
    original = registry.read_text()
    anchor = "  tiny-vlm:\n"
    assert anchor in original
    extra = (
        "  tiny-vlm-b:\n    backend: transformers\n    model: resources/models/tiny-vlm\n"
        "    build: tiny-vlm\n    dtype: float32\n    device: cpu\n    max_new_tokens: 64\n"
        "    temperature: 0.5\n"
    )
    try:
        registry.write_text(original.replace(anchor, extra + anchor, 1))
        cfg = _write_config(
            done, "add_lvlm.yaml", ("  models: [tiny-vlm]\n", "  models: [tiny-vlm, tiny-vlm-b]\n")
        )
        jobs, counts = _plan(done, cfg)
        lvlm_jobs = [j for j in jobs if j["rule"].endswith("_lvlm") or "lvlm_" in j["rule"]]
        per_model = [j for j in lvlm_jobs if "model" in j["wildcards"]]
        assert {j["wildcards"]["model"] for j in per_model} == {"tiny-vlm-b"}
        # 4 tasks x 2 groups (the one axis, gender) x 1 shard; the assistant per axis
        assert counts.pop("respond_lvlm") == 8
        assert counts.pop("extract_lvlm_story_attributes") == 1
        assert counts.pop("judge_lvlm_terms") == 1
        assert counts.pop("label_lvlm_refusals") == 1
        assert counts.pop("check_models") == 1  # the new model's check (off: a note)
        assert counts.pop("merge_lvlm_model_responses") == 1  # its files only
        assert counts == {
            "merge_lvlm_responses": 1,
            "compute_lvlm_metrics": 1,
            "audit_lvlm_story_reading": 1,  # weighs its gaps by every model's story scores
            "simulate_lvlm_human_labels": 1,  # the demo's simulated labels: every model's
            "correct_lvlm_reader": 1,  # the corrected table: every model's
            "collect_job_timings": 1,  # reads every model job's timings
            "render_report": 1,
            "all": 1,
        }
        # and taking it out again deletes and reruns nothing
        assert _rule_counts(done) == {}
    finally:
        registry.write_text(original)


@pytest.mark.slow
def test_switching_check_models_on_or_rerunning_it_reruns_no_model_job(done):
    """Each model's check table is an ancient() input of the model's jobs, on or off:
    switching the check on reruns only the report (it shows the config), and a forced
    rerun of the checks reruns only the checks."""
    config = _write_config(
        done, "check.yaml", ("offline: true", "offline: true\ncheck_models: {enabled: true}")
    )
    assert _rule_counts(done, config) == {"all": 1, "render_report": 1}
    text = _snakemake(done, "-n", "--quiet", "rules", "--forcerun", "check_models")
    assert _counts(text) == {"check_models": 5}


def _counts(text: str) -> dict[str, int]:
    return {
        p[0]: int(p[1])
        for p in (line.split() for line in text.splitlines())
        if len(p) == 2 and p[1].isdigit() and p[0] != "total"
    }
