"""The Snakemake workflow: lint, planning at paper scale, and a real end-to-end run
of the embedded default in a temporary directory."""

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import built_once, copy_workflow, planned_jobs, run_workflow, workflow_env

BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
# the demo run's hard limit (s); a slower or busier machine can raise it
DEMO_TIMEOUT = int(os.environ.get("STEREOLENS_DEMO_TIMEOUT", "1500"))


def test_lint(repo_root):
    out = subprocess.run(
        [SNAKEMAKE, "--lint", "--configfile", "config/demo.yaml"],
        cwd=repo_root,
        env=workflow_env(),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_paper_scale_plan(tmp_path_factory):
    """Planning the whole paper-scale run loads no model and counts the jobs (the dry run
    is shared with test_plan.py: conftest.planned_jobs)."""
    wd, out = planned_jobs(tmp_path_factory, "config/config.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    counts = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    # ContextBias: 4 generators x (92 roles x 3 conditions + 73 validation roles) x 1
    # shard; 2 extractors for each shard. BiasIG: 8 models x 589 blocks of up to 80 of the
    # 47,040 prompts; one VQA job each. Both benchmarks generate through generate_images.
    assert counts["generate_images"] == 4 * (92 * 3 + 73) + 8 * 589
    assert counts["extract_contextbias_attributes"] == 2 * 4 * (92 * 3 + 73)
    assert counts["merge_contextbias_attributes"] == 1
    assert counts["answer_biasig_vqa"] == 8 * 589
    # LVLM: 9 models x 9 groups (2 genders + 7 races) x shards (story 2, term 2, exam 2,
    # attribute-inferring 1); the assistant once per model x axis for stories and judgements
    assert counts["respond_lvlm"] == 9 * 9 * (2 + 2 + 2 + 1)
    assert counts["extract_lvlm_story_attributes"] == counts["judge_lvlm_terms"] == 9 * 2
    assert counts["label_lvlm_refusals"] == 9
    assert not (wd / "results").exists()


def _planned_rules(wd: Path, config: str) -> dict[str, int]:
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--quiet", "rules", "--configfile", config],
        cwd=wd, env=workflow_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    parts = (line.split() for line in out.stdout.splitlines())
    return {p[0]: int(p[1]) for p in parts if len(p) == 2 and p[1].isdigit()}


TEST_CONFIGS = {
    # .test/config/<name>.yaml -> (a rule it must plan, words of the rules it leaves off)
    "contextbias": ("score_contextbias_validation", ("biasig", "lvlm")),
    "biasig": ("compute_biasig_metrics", ("lvlm", "validation")),
    "lvlm": ("compute_lvlm_metrics", ("biasig", "validation")),
    "faults": ("compute_contextbias_metrics", ("biasig", "lvlm", "validation")),
    # the SLURM test's: round 1's interim analysis (round 2 is known after it: checkpoint)
    "faults_adaptive": ("adaptive_round", ("biasig", "lvlm", "validation")),
}


@pytest.mark.parametrize("name", sorted(TEST_CONFIGS))
def test_test_config_plans_its_benchmark_only(repo_root, tmp_path, name):
    """Each .test config (one per benchmark, the fault-injection run and its adaptive
    variant) plans its own benchmark's rules and none of those it switches off."""
    wd = copy_workflow(tmp_path)
    config = f".test/config/{name}.yaml"
    if name.startswith("faults"):  # the registry adds fault-vlm (test_faults.py writes it)
        import yaml
        from test_faults import FAULT_VLM

        registry = yaml.safe_load((wd / "config/models.yaml").read_text())
        registry["vlms"]["fault-vlm"] = FAULT_VLM
        (wd / "config/faults_models.yaml").write_text(yaml.safe_dump(registry))
    rules = _planned_rules(wd, config)
    must, off = TEST_CONFIGS[name]
    assert rules.get(must) == 1, rules
    for word in off:  # no rule of a benchmark (or study) that is off
        assert not [r for r in rules if word in r], (word, rules)
    assert rules["render_report"] == 1 and not (wd / "results").exists()


def test_bad_config_stops_the_run(repo_root, tmp_path):
    wd = copy_workflow(tmp_path)
    bad = (
        (wd / "config/demo.yaml").read_text().replace("k_definition: model", "k_definition: modle")
    )
    (wd / "config/bad.yaml").write_text(bad)
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", "config/bad.yaml"],
        cwd=wd,
        env=workflow_env(),
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "contextbias.metrics.k_definition" in out.stdout + out.stderr


def _run_demo(wd: Path) -> None:
    run_workflow(wd, "config/demo.yaml", "demo-run.log", "the demo run", DEMO_TIMEOUT)


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> Path:
    """The embedded default (config/demo.yaml) run end to end once per pytest run, in a
    copy of the workflow every xdist worker shares (conftest.built_once); the tests below
    read its outputs and must not change them. It builds its own tiny models."""
    return built_once(tmp_path_factory, "demo-run", _run_demo)


@pytest.mark.slow
def test_demo_contextbias_tables(demo):
    res = demo / "results"
    prompts = pl.read_parquet(res / "contextbias/prompts.parquet")
    assert set(prompts["role"]) == {"nurse", "carpenter"}
    images = pl.read_parquet(res / "contextbias/images.parquet")
    n_expected = 1 * 1 * prompts.height  # 1 generator x 1 seed
    assert images.height == n_expected
    assert set(images["status"]) <= {"ok", "discarded"}
    assert images.filter(pl.col("status") == "discarded")["reason"].is_not_null().all()
    attrs = pl.read_parquet(res / "contextbias/attributes.parquet")
    for col in (
        "model",
        "role",
        "condition",
        "prompt_id",
        "seed",
        "image_id",
        "cohort",
        "dimension",
        "label",
    ):
        assert col in attrs.columns
    assert not attrs["label"].is_in(["unknown", "none", ""]).any()
    assert attrs.select(
        pl.struct("extractor", "image_id", "dimension", "label").is_unique().all()
    ).item()
    bi = pl.read_parquet(res / "contextbias/metrics/bi.parquet")
    assert {
        "model",
        "cohort",
        "dimension",
        "condition",
        "aggregation",
        "bi",
        "n_images",
        "k",
    } <= set(bi.columns)
    assert set(bi["model"]) == {"tiny-sd-b", "*"}
    assert {"pooled", "role", "role_matched", "role_miller_madow"} <= set(bi["aggregation"])
    metrics = res / "contextbias/metrics"
    for name in ("ccs", "ccs_mean", "robustness", "bootstrap"):
        assert pl.read_parquet(metrics / f"{name}.parquet").height > 0, name
    # the paper's definitions by default: overall = mean of cohorts, Table 3 as released
    assert set(bi["overall_definition"]) == {"cohort"}
    assert set(pl.read_parquet(metrics / "robustness.parquet")["cells"]) == {"released"}
    assert "canonical_label" in attrs.columns
    mapping = pl.read_parquet(res / "contextbias/canonical_mapping.parquet")
    assert set(mapping["dimension"]) <= {"items", "clothing_garment", "activities"}
    assert set(mapping["decided_by"]) & {"llm", "embedding", "singleton"}
    scores = pl.read_parquet(res / "contextbias/validation/scores.parquet")
    assert {"accuracy", "recall", "f1"} <= set(scores.columns)
    assert (res / "contextbias/annotation/form.html").stat().st_size > 1000


@pytest.mark.slow
def test_demo_biasig_tables(demo):
    res = demo / "results"
    answers = pl.read_parquet(res / "biasig/answers.parquet")
    for col in (
        "model",
        "prompt_id",
        "image_id",
        "position",
        "gender",
        "race",
        "age",
        "attempts",
        "status",
    ):
        assert col in answers.columns
    assert set(answers["status"]) <= {"ok", "partial", "discarded"}
    eta = pl.read_parquet(res / "biasig/metrics/eta.parquet")
    assert {"model", "pair", "eta_total", "eta_gender", "eta_race", "eta_age", "variant"} <= set(
        eta.columns
    )
    assert "*" in set(eta["pair"])
    implicit = pl.read_parquet(res / "biasig/metrics/implicit.parquet")
    assert "subject" in set(implicit["level"]) and "ceiling" in implicit.columns
    assert set(eta["variant"]) == {"tiny-sd", "tiny-sd-intervention"}
    assert set(eta["model"]) == {"tiny-sd"}  # the variant sits beside its base


@pytest.mark.slow
def test_demo_lvlm_tables(demo):
    """Every task scored on the demo's one axis, refusals beside them, the responses
    cached."""
    res = demo / "results"
    lv_scores = pl.read_parquet(res / "lvlm/metrics/scores.parquet")
    assert {(t, a) for t, a in lv_scores.select("task", "axis").iter_rows()} == {
        (t, "gender") for t in ("story", "term", "exam")
    }
    assert lv_scores["formula"].str.contains("tvd").all()
    assert {"null_mean", "null_high", "p_perm"} <= set(lv_scores.columns)
    assert lv_scores["p_perm"].is_between(0, 1).all()
    responses = pl.read_parquet(res / "lvlm/responses.parquet")
    assert {"refusal", "request", "response", "request_key"} <= set(responses.columns)
    assert set(responses["task"]) == {"story", "term", "exam", "attribute_inferring"}
    refusals = pl.read_parquet(res / "lvlm/metrics/refusals.parquet")
    assert "attribute_inferring" in set(refusals["task"])
    assert list((res / "cache/lvlm").rglob("*.json"))


@pytest.mark.slow
def test_demo_report_and_logs(demo):
    res = demo / "results"
    report = (res / "report/index.html").read_text()
    assert "BiasIG" in report and "debiasing variant changes" in report
    assert "paper Table 2 layout" in report and "Refusal rate" in report
    for caption in ("paper Table 8", "paper Table 3", "paper Table 1", "paper Fig. 4"):
        assert caption in report
    assert "meaningless" in report and "data:image/png;base64" in report
    assert "Bias Intensity" in report
    for folder in ("figures", "tables", "galleries/thumbs"):
        assert list((res / "report" / folder).iterdir()), folder
    # every rule left a log; generation and extraction left benchmark files
    assert list((demo / "logs/contextbias/generate").rglob("*.log"))
    assert list((demo / "benchmarks/contextbias/extract").rglob("*.tsv"))


@pytest.mark.slow
def test_demo_tables_equal_the_reference_code(demo):
    _same_as_reference(demo)


@pytest.mark.slow
def test_demo_report_in_a_browser(demo, tmp_path):
    """The report in a real browser (tests/report_browser.py); a screenshot of its first
    screen next to it; the annotation form's answers download as a CSV the study reads."""
    from report_browser import check_report, chromium, fill_and_save_form

    from stereolens.contextbias.annotation.answers import read_answers

    res = demo / "results"
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with chromium(download_dir=downloads) as driver:
        seen = check_report(driver, res / "report/index.html")
        saved = fill_and_save_form(
            driver, res / "contextbias/annotation/form.html", downloads, "demo annotator"
        )
    # profile rows: tiny-sd-b in ContextBias, tiny-sd and tiny-sd-intervention in BiasIG,
    # tiny-vlm
    assert seen["galleries"] == 4 and seen["profile_rows"] == 4
    assert (res / "report/first-screen.png").is_file()
    assert read_answers([saved], res / "contextbias/annotation/key.parquet").height > 0


@pytest.mark.slow
def test_demo_snakemake_report(demo):
    """Figures and tables also in Snakemake's own report."""
    import zipfile

    zipped = subprocess.run(
        [SNAKEMAKE, "--configfile", "config/demo.yaml", "--report", "report.zip"],
        cwd=demo, env=workflow_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert zipped.returncode == 0, zipped.stderr[-3000:]
    names = zipfile.ZipFile(demo / "report.zip").namelist()
    assert any(n.endswith("bias-profile-figure.png") for n in names)
    assert any(n.endswith("bias-profile.csv") for n in names)


@pytest.mark.slow
def test_demo_second_run_has_nothing_to_do(demo):
    again = subprocess.run(
        [SNAKEMAKE, "-n", "--cores", "2", "--configfile", "config/demo.yaml"],
        cwd=demo,
        env=workflow_env(),
        capture_output=True,
        text=True,
    )
    assert "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.slow
def test_demo_regeneration_recipes(demo):
    """The regeneration recipes of docs/troubleshooting.md on the embedded default (dry
    runs: what they force)."""
    res = demo / "results"

    def forced(*selection):
        out = subprocess.run(
            [str(BIN / "stereolens"), "regenerate", "--configfile", "config/demo.yaml"]
            + [*selection, "--dry-run", "--", "--cores", "2", "--quiet", "rules"],
            cwd=demo,
            env=workflow_env(),
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        counts = {}
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                counts[parts[0]] = int(parts[1])
        return counts

    one_model = forced("--model", "tiny-sd-b")
    # tiny-sd-b: its 6 ContextBias shards (2 roles x 3 conditions) and 2 validation shards,
    # each extracted once; nothing of BiasIG or the LVLM audit
    assert one_model["generate_images"] == 8 and one_model["extract_contextbias_attributes"] == 8
    assert "answer_biasig_vqa" not in one_model and "respond_lvlm" not in one_model
    assert one_model["render_report"] == 1
    shard = forced("--shard", "results/contextbias/images/tiny-sd-b/nurse/CF/0")
    assert shard["generate_images"] == 1 and shard["extract_contextbias_attributes"] == 1
    biasig = forced("--benchmark", "biasig")
    assert biasig["answer_biasig_vqa"] == biasig["generate_images"] == 4
    assert "extract_contextbias_attributes" not in biasig
    everything = forced("--all")
    assert everything["generate_images"] == sum(
        1 for _ in (res / "contextbias/images").glob("*/*/*/*")
    ) + sum(1 for _ in (res / "biasig/images").glob("*/*/*/*"))


def _same_as_reference(wd: Path) -> None:
    """The merged tables and the metrics of the run equal those of the earlier in-memory code
    (kept as reference functions: tests/reference_aggregates.py and
    tests/reference_aggregates_cb_lvlm.py) on the run's own shards."""
    import reference_aggregates as RA
    import reference_aggregates_cb_lvlm as REF
    from polars.testing import assert_frame_equal

    from stereolens.atomic import read_jsonl
    from stereolens.biasig import answers as BA
    from stereolens.biasig import metrics as BMet
    from stereolens.config import load_config
    from stereolens.contextbias.schema import AttributeSchema

    def same(new, old, sort=None):
        old = old.with_columns(
            pl.col(c).cast(new.schema[c]) for c in old.columns if old[c].dtype == pl.Null
        )
        if sort:
            new, old = new.sort(sort), old.sort(sort)
        # columns added after the reference was written (issue 20's minimum sizes)
        new = new.drop([c for c in REF.ADDED_COLUMNS if c in new.columns and c not in old.columns])
        assert_frame_equal(new, old, check_exact=False, rel_tol=1e-12, abs_tol=1e-13)

    res = wd / "results"
    config, registry = load_config(wd / "config/demo.yaml")
    files = lambda pattern: sorted(str(p) for p in res.glob(pattern))  # noqa: E731
    answers = pl.read_parquet(res / "biasig/answers.parquet")
    same(answers, RA.biasig_merge_answers_reference(files("biasig/vqa/*/*/*/*/*.jsonl"), registry))
    cb = [p for p in files("contextbias/extractions/*/*/*/*/*.jsonl") if "/VAL/" not in p]
    attrs, images = REF.merge_extractions_reference(cb, AttributeSchema.load())
    same(pl.read_parquet(res / "contextbias/attributes_raw.parquet"), attrs)
    same(pl.read_parquet(res / "contextbias/images.parquet"), images)
    models = sorted(config["lvlm"]["models"])
    tables = REF.merge_tables(
        [r for m in models for p in files(f"lvlm/responses/{m}/*/*/*/*/*.jsonl")
         for r in read_jsonl(p)],
        [pl.read_parquet(p) for m in models for p in files(f"lvlm/refusals/{m}/*.parquet")],
        [r for m in models for p in files(f"lvlm/story_attributes/{m}/*/*.jsonl")
         for r in read_jsonl(p)],
        [pl.read_parquet(p) for m in models for p in files(f"lvlm/term_judgements/{m}/*/*")
         if p.endswith(".parquet")],
    )  # fmt: skip
    # rows of one (task, axis, group, shard) file in file order; files in the workflow's
    # order there, in path order here
    keys = ["model", "setting", "task", "axis", "group", "image_id", "prompt_id"]
    same(pl.read_parquet(res / "lvlm/responses.parquet"), tables["responses"], sort=keys)
    for name in ("story_attributes", "stories", "term_judgements"):
        new = pl.read_parquet(res / f"lvlm/{name}.parquet")
        same(new, tables[name], sort=new.columns if name != "stories" else keys[:2] + keys[3:])
    # metrics: the reference bootstrap and LVLM tables on the merged tables, demo settings
    bg, lv = config["biasig"], config["lvlm"]
    # the references replace metrics._bootstrap and answers._image_table, where
    # compute_metrics and prepare_answers look them up; the calls are counted
    originals = BMet._bootstrap, BA._image_table
    try:
        calls = RA.biasig_patch_references(setattr)
        old = BMet.compute_metrics(
            answers, pl.read_parquet(res / "biasig/prompts.parquet"),
            eta_variant=bg["eta_variant"], replicates=bg["replicates"], seed=bg["seed"],
            count=bg["count"], scoring_unit=bg["scoring_unit"], ceiling_draws=bg["ceiling_draws"],
            interval_min_images_per_subject=bg["interval_min_images_per_subject"],
        )  # fmt: skip
    finally:
        BMet._bootstrap, BA._image_table = originals
    assert calls == {"bootstrap": int(bg["replicates"] > 0), "image_table": 1}
    for name in ("implicit", "explicit", "eta"):
        same(pl.read_parquet(res / f"biasig/metrics/{name}.parquet"), old[name])
    m = lv["metrics"]
    old = REF.compute_all_reference(
        pl.read_parquet(res / "lvlm/responses.parquet"),
        pl.read_parquet(res / "lvlm/story_attributes.parquet"),
        pl.read_parquet(res / "lvlm/term_judgements.parquet"),
        min_count=m["min_count"], replicates=m["replicates"], seed=lv["seed"], level=m["level"],
        permutations=m["permutations"], formulas=m["formulas"],
    )  # fmt: skip
    skew = ["model", "setting", "axis", "attribute", "value", "group"]
    for name in ("scores", "prompt_scores", "refusals", "exam_accuracy", "story_skew"):
        new = pl.read_parquet(res / f"lvlm/metrics/{name}.parquet")
        same(new, old[name], sort=skew if name == "story_skew" else None)
    assert pl.read_parquet(res / "lvlm/metrics/scores.parquet")["score"].is_finite().any()
