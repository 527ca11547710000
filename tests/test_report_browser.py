"""The report and the annotation form in a real browser (headless Chromium, selenium):
no JavaScript console error, no broken internal link, the summary, galleries and collapsed
tables present, and the form's answers downloaded as a CSV that the agreement rule's
reader accepts. A screenshot of the first screen is written next to the report.

Needs Debian's chromium and chromium-driver (.ci/run installs them); skipped elsewhere
when they are missing, failed under CI."""

import polars as pl
import pytest
from PIL import Image
from report_browser import check_report, chromium, fill_and_save_form
from test_report import _biasig_tables, _contextbias_tables, _lvlm_tables
from test_report_reader import _cb_corrected

from stereolens.contextbias.annotation.answers import read_answers
from stereolens.contextbias.annotation.form import export_annotation_sample
from stereolens.report.cli import report_config
from stereolens.report.render import render_report


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, repo_root):
    """A report of every benchmark with galleries, from edge tables and PNG files."""
    tmp = tmp_path_factory.mktemp("browser")
    cb = _contextbias_tables(
        roles=("nurse", "pilot", "chef", "judge", "baker"), models=("m1", "m2")
    )
    for r in cb["images"].iter_rows(named=True):
        (tmp / r["image_path"]).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (64, 64), (r["seed"] * 40, 90, 160)).save(tmp / r["image_path"])
    bg = _biasig_tables()
    lv = _lvlm_tables()
    sets = lv["responses"].select("image_id", "axis", "group").unique().with_columns(
        pl.lit("story").alias("task"),
        (str(tmp) + "/u/" + pl.col("image_id") + ".png").alias("path"),
    )  # fmt: skip
    for p in sets["path"]:
        (tmp / "u").mkdir(exist_ok=True)
        Image.new("RGB", (40, 40), (20, 200, 20)).save(p)
    prompts = pl.DataFrame({"prompt_id": cb["images"]["prompt_id"].unique()}).with_columns(
        pl.lit("nurse").alias("role"), ("a photo: " + pl.col("prompt_id")).alias("text")
    )
    tables = {
        **cb, "prompts": prompts, "biasig_implicit": bg["implicit"],
        "biasig_explicit": bg["explicit"], "biasig_eta": bg["eta"],
        "biasig_answers": bg["answers"], "biasig_prompts": bg["prompts"],
        "lvlm_scores": lv["scores"], "lvlm_refusals": lv["refusals"],
        "lvlm_story_skew": lv["story_skew"], "lvlm_exam_accuracy": lv["exam_accuracy"],
        "lvlm_responses": lv["responses"], "lvlm_sets": sets,
        "lvlm_story_attributes": lv["story_attributes"],
        # the reader block with more rows than the first screen shows (its "every row" link)
        "contextbias_corrected": pl.concat(
            _cb_corrected().with_columns(
                pl.col("model").replace({"a": "m1", "b": "m2"}), pl.lit(c).alias("condition")
            )
            for c in ("CF", "CA-R", "CA-U")
        ),
    }  # fmt: skip
    inputs = {"registry": str(repo_root / "config/models.yaml")}
    for name, frame in tables.items():
        path = tmp / "in" / f"{name}.parquet"
        path.parent.mkdir(exist_ok=True)
        frame.write_parquet(path)
        inputs[name] = str(path)
    config = report_config({
        "registry": str(repo_root / "config/models.yaml"),
        "run_label": "browser test",
        "contextbias": {"generators": ["m1", "m2"], "extractors": [], "metrics": {}},
        "biasig": {"enabled": True, "generators": ["m"], "vqa": "tiny-vlm"},
        "lvlm": {"enabled": True, "models": ["v"], "metrics": {}},
    })  # fmt: skip
    from stereolens.report.inputs import Inputs

    render_report(config, Inputs(inputs, roots=[tmp]), tmp / "report" / "index.html")
    return tmp / "report"


def test_report_in_chromium(report_dir):
    with chromium() as driver:
        got = check_report(driver, report_dir / "index.html")
    assert got["profile_rows"] == 4  # m1, m2 (ContextBias), m (BiasIG), v (LVLM)
    assert got["galleries"] == 4 and got["cards"] > 20  # 2 ContextBias, 1 BiasIG, 1 LVLM
    assert got["collapsed"] >= 2
    page = (report_dir / "index.html").read_text()
    assert 'href="#reader-contextbias"' in page and "The numbers assume a perfect reader" in page
    shot = report_dir / "first-screen.png"
    with Image.open(shot) as im:
        assert im.size[0] >= 1200 and im.getextrema() != ((255, 255),) * 3


def test_a_javascript_error_fails_the_check(report_dir, tmp_path):
    """The check is not vacuous: a page with a script error or a dead link fails it."""
    from report_browser import broken_links, console_errors, open_page

    page = tmp_path / "bad.html"
    page.write_text(
        '<!DOCTYPE html><html><body><a href="#nowhere">x</a><a href="missing.html">y</a>'
        "<script>undefinedFunction();</script></body></html>"
    )
    with chromium() as driver:
        open_page(driver, page)
        assert any("undefinedFunction" in e for e in console_errors(driver))
        assert len(broken_links(driver, page)) == 2


def test_annotation_form_downloads_answers_the_agreement_rule_accepts(tmp_path):
    rows = []
    for role in ("zookeeper", "beekeeper"):
        for cond in ("CF", "CA-R", "CA-U"):
            for k in range(3):
                path = tmp_path / "img" / f"{role}_{cond}_{k}.png"
                path.parent.mkdir(exist_ok=True)
                Image.new("RGB", (16, 16), (k * 60, 100, 30)).save(path)
                rows.append({"model": "gen", "role": role, "condition": cond,
                             "image_id": f"{role}{cond}{k}", "image_path": str(path),
                             "status": "ok"})  # fmt: skip
    paths = export_annotation_sample(
        pl.DataFrame(rows), None, tmp_path / "form", images_per_set=3,
        dimensions=("gender_presentation", "clothing_garment"), seed=1,
    )  # fmt: skip
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with chromium(download_dir=downloads) as driver:
        csv_path = fill_and_save_form(driver, paths["form"], downloads, "Ann, B.")
    answers = read_answers([csv_path], paths["key"])
    key = pl.read_parquet(paths["key"])
    assert answers.height == key.height * 2  # every set x dimension answered
    assert set(answers["annotator"]) == {"Ann, B."}
    assert set(answers["prevalence"]) == {1.0}
    assert set(answers.filter(pl.col("dimension") == "clothing_garment")["label"]) == {"lab coat"}


def test_lvlm_text_forms_download_answers_that_human_labels_reads(tmp_path):
    """The LVLM reader-sample forms (a story, a pair of explanations per set; no image, no
    slider) filled in Chromium; their CSVs read by `stereolens lvlm human-labels`."""
    from test_lvlm_reader_sample import lvlm_tables

    from stereolens.cli import main
    from stereolens.lvlm.reader_sample import export_reader_sample

    responses, story, term = lvlm_tables()
    paths = export_reader_sample(responses, story, term, tmp_path / "form", target_width=0.72)
    saved = []
    with chromium(download_dir=tmp_path / "downloads") as driver:
        for task in ("story", "term"):
            got = fill_and_save_form(driver, paths[f"{task}_form"], tmp_path / "downloads",
                                     f"Ann {task}")  # fmt: skip
            saved.append(got.rename(tmp_path / f"{task}.csv"))
    for path, task in zip(saved, ("story", "term"), strict=True):
        rows = pl.read_csv(path)
        key = pl.read_parquet(paths[f"{task}_key"])
        assert rows.height == sum(len(d) for d in key["dimensions"])  # every question
        assert set(rows["prevalence"]) == {1}  # the hidden count of a text set
    human = tmp_path / "human.csv"
    argv = ["lvlm", "human-labels", "--answers", *map(str, saved), "--key"]
    argv += [str(paths["story_key"]), str(paths["term_key"])]
    assert main([*argv, "--template", str(paths["template"]), "--out", str(human)]) == 0
    table = pl.read_csv(human)
    template = pl.read_csv(paths["template"])
    assert table.select("item_id", "attribute").unique().height == template.height
    # the open questions got the typed text, the closed one its first choice, and the
    # judge's question "A": each pair's group_a
    by = dict(table.group_by("attribute").agg(pl.col("label").unique().sort()).iter_rows())
    assert by["occupation"] == by["hobbies"] == ["lab coat"]
    assert by["socioeconomic_status"] == ["poor"]
    key = pl.read_parquet(paths["term_key"])
    assert by["winner"] == sorted(set(key["group_a"]))
