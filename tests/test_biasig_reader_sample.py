"""BiasIG's human sample (issue 21, items 2 and 3): the stratified draw with its selection
probabilities by hand, the blinded form that asks each person's gender, race and age in the
VQA reader's values, and the round trip answers -> human-label table -> `biasig correct`,
in a real browser too."""

from __future__ import annotations

import csv
import json
import math
import time

import polars as pl
import pytest
from scipy import stats

from stereolens.annotation_form import CSV_COLUMNS
from stereolens.biasig.corrected import corrected_scores, reader_table
from stereolens.biasig.prompts import load_prompts
from stereolens.biasig.reader_sample import (
    CANNOT_TELL,
    DESIGN_COLUMNS,
    FILES,
    export_reader_sample,
    human_labels_from_answers,
    image_files,
    vocabulary,
)
from stereolens.biasig.truth import load_truth
from stereolens.cli import main
from stereolens.metrics import human_labels as hl
from stereolens.metrics import reader_correction as rc

Z = float(stats.norm.ppf(0.975))
RICH, DANCER, EMPLOYER = "e56a293135506077", "607d89c65dbe7ef8", "c53ee09d9f70d751"
IMAGES = {RICH: 10, DANCER: 6, EMPLOYER: 8}
"""Images per prompt and generator: two one-person prompts and a two-person one (left,
right), each its own scoring unit (one phrasing of each subject)."""
GENERATORS = ("g1", "g2")
GENDER, RACE, AGE = ("male", "female"), ("White", "Black", "East Asian", "South Asian"), (
    "young", "middle-aged", "elderly")  # fmt: skip


def _answers() -> pl.DataFrame:
    """The VQA reader's answers: a fixed pattern over the values, one unknown age per
    prompt and generator."""
    rows = []
    for g in GENERATORS:
        for prompt, n in IMAGES.items():
            positions = ("left", "right") if prompt == EMPLOYER else ("single",)
            for k in range(n):
                for s, position in enumerate(positions):
                    rows.append(
                        {"model": g, "image_id": f"{g}-{prompt[:4]}-{k}", "position": position,
                         "prompt_id": prompt, "gender": GENDER[(k + s) % 2],
                         "race": RACE[(k + s + len(g)) % 4],
                         "age": "unknown" if k == 1 else AGE[(k + s) % 3], "status": "ok"}
                    )  # fmt: skip
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(answers, prompts, the images folder laid out as results/biasig/images: one 8x8 PNG
    per image with its shard's metadata.jsonl)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("biasig_reader") / "images"
    answers = _answers()
    prompts = load_prompts().filter(pl.col("prompt_id").is_in(list(IMAGES)))
    kinds = dict(prompts.select("prompt_id", "acquired_type").iter_rows())
    for (g, prompt), part in answers.group_by("model", "prompt_id"):
        shard = root / g / kinds[prompt] / "implicit" / "0"
        shard.mkdir(parents=True, exist_ok=True)
        with open(shard / "metadata.jsonl", "a") as fh:
            for k, image_id in enumerate(sorted(set(part["image_id"]))):
                Image.new("RGB", (8, 8), (20 * k, 80, 40)).save(shard / f"{image_id}.png")
                record = {"image_id": image_id, "image_file": f"{image_id}.png", "model": g}
                fh.write(json.dumps(record) + "\n")
    return answers, prompts, root


def _export(corpus, out, **options):
    answers, prompts, root = corpus
    options = {"target_width": 0.5, "disagreement": 0.1, "seed": 3} | options
    return export_reader_sample(answers, prompts, root, out, **options)


# ---------------------------------------------------------------- the draw, by hand


def test_draw_strata_sizes_and_probabilities_by_hand(corpus, tmp_path):
    paths = _export(corpus, tmp_path)
    assert set(paths) == set(FILES)
    design = pl.read_parquet(paths["design"])
    assert tuple(design.columns) == DESIGN_COLUMNS
    # per generator 4 planned strata (rich, dancer: single; employer: left, right) of
    # N_h = (10, 6, 8, 8) persons, N = 32. One rate: Neyman = proportional, n = d / room,
    # room = (0.5 / 2z)^2 - 0.25 / 32 = 0.008457, n = 0.1 / room = 11.82;
    # n_h = ceil(n N_h / 32) = (ceil 3.69, ceil 2.22, ceil 2.96, ceil 2.96) = (4, 3, 3, 3)
    room = (0.5 / (2 * Z)) ** 2 - 0.25 / 32
    n = 0.1 / room
    assert 11.8 < n < 11.9
    want = {RICH: 4, DANCER: 3, EMPLOYER: 3}
    assert [math.ceil(n * k / 32) for k in (10, 6, 8)] == list(want.values())
    for g in GENERATORS:
        part = design.filter(pl.col("variant") == g)
        assert part.height == 4 and (part["model"] == g).all()
        got = {
            (k, p): (m, prob)
            for p, k, m, prob in part.select(
                "position", "n_items", "n_human", "selection_probability"
            ).iter_rows()
        }
        assert got == {
            (10, "single"): pytest.approx((4, 0.4)),  # the rich person
            (6, "single"): pytest.approx((3, 0.5)),  # the dancer
            (8, "left"): pytest.approx((3, 3 / 8)),  # employer and employee
            (8, "right"): pytest.approx((3, 3 / 8)),
        }
        # the strata are the correction's ("variant|model|unit", unit = the subject's key)
        assert set(part["stratum"]) == set(
            reader_table(corpus[0], corpus[1])[0].filter(pl.col("variant") == g)["stratum"]
        )
        # the planned width: V = 0.25 / 32 + sum W_h^2 0.1 / n_h
        w = {10: 4, 6: 3, 8: 3}
        v = 0.25 / 32 + sum((k / 32) ** 2 * 0.1 / w[k] for k in (10, 6, 8, 8))
        assert part["width"][0] == pytest.approx(2 * Z * math.sqrt(v), rel=1e-12)
        assert part["reachable"].all() and part["width"][0] <= 0.5
    # the template: every drawn image x person x attribute, its probability n_h / N_h
    template = hl.read_human_labels(paths["template"])
    assert (template["label"] == "").all()
    assert set(template["attribute"]) == {"gender", "race", "age"}
    per = template.group_by("stratum").agg(
        pl.col("item_id").n_unique().alias("n"), pl.col("selection_probability").first()
    )
    # Horvitz-Thompson: sum over a stratum's persons of 1 / p = its persons (N_h x persons)
    ht = dict(per.select("stratum", pl.col("n") / pl.col("selection_probability")).iter_rows())
    reader, _ = reader_table(corpus[0], corpus[1])
    persons = dict(reader.group_by("stratum").agg(pl.col("item_id").n_unique()).iter_rows())
    assert ht == pytest.approx(persons)
    pairs = template.filter(pl.col("item_id").str.contains(":"))["item_id"]
    assert pairs.str.extract(r":(left|right)$").n_unique() == 2
    # left and right of a drawn two-person image are drawn together
    images = pairs.str.replace(r":(left|right)$", "").value_counts()
    assert (images["count"] == 6).all()  # 2 persons x 3 attributes
    # the draw: seeded, and a stratum's draw depends only on it
    again = _export(corpus, tmp_path / "again")
    assert hl.read_human_labels(again["template"]).equals(template)
    other = hl.read_human_labels(_export(corpus, tmp_path / "other", seed=4)["template"])
    assert not other.equals(template)
    # the key: one image per set; questions per person
    key = pl.read_parquet(paths["key"])
    assert (key["n_images"] == 1).all() and key.height == 2 * (4 + 3 + 3)
    dims = {len(d) for d in key["dimensions"].to_list()}
    assert dims == {3, 6}
    assert set(key["schema_version"]) == {"biasig-vqa-v1"}


def test_form_is_blinded_and_asks_the_readers_values(corpus, tmp_path):
    paths = _export(corpus, tmp_path)
    html = paths["form"].read_text()
    key = pl.read_parquet(paths["key"])
    for secret in ("g1-", "g2-", "Dancer", "rich person", "Employer", RICH, "metadata"):
        assert secret not in html, secret
    # per person the VQA reader's vocabulary and "cannot tell" (value "unknown")
    for value in ("male", "female", "White", "Black", "East Asian", "South Asian", "young",
                  "middle-aged", "elderly"):  # fmt: skip
        assert f'<option value="{value}">{value}</option>' in html
    assert f'<option value="unknown">{CANNOT_TELL}</option>' in html
    assert "Person on the left: gender" in html and "Person on the right: age" in html
    assert 'type="range"' not in html  # no "images showing it" slider for one person
    assert html.count("<fieldset") == sum(len(d) for d in key["dimensions"].to_list())


def test_image_files_folder_and_table(corpus, tmp_path):
    _, _, root = corpus
    found = image_files(root)
    assert found.height == 2 * sum(IMAGES.values())
    assert set(found["variant"]) == set(GENERATORS)
    assert all(p.endswith(".png") for p in found["image_path"])
    table = tmp_path / "images.parquet"
    found.drop("variant").write_parquet(table)
    assert image_files(table).sort("image_id").equals(found.drop("variant").sort("image_id"))
    answers, prompts, _ = corpus
    with pytest.raises(ValueError, match="have no image file"):
        export_reader_sample(answers, prompts, found.head(5), tmp_path / "x")


# ---------------------------------------------------------------- the round trip


def _reader_labels(corpus) -> dict[tuple[str, str], str]:
    """(item_id, attribute) -> the reader's label."""
    reader, _ = reader_table(corpus[0], corpus[1])
    return {(i, a): lab for i, a, lab in reader.select("item_id", "attribute", "label").rows()}


def _persons(key: pl.DataFrame):
    """(set_id, dimension, item_id, attribute) of every question of the form."""
    for set_id, image_ids, dims in key.select("set_id", "image_ids", "dimensions").iter_rows():
        for d in dims:
            position, _, attribute = d.rpartition(".")
            item = image_ids[0] if not position else f"{image_ids[0]}:{position}"
            yield set_id, d, item, attribute


def _write_answers(path, key, labels, annotator="ann1", skip=()):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for set_id, d, item, attribute in _persons(key):
            if item not in skip:
                label = labels[(item, attribute)]
                w.writerow([annotator, set_id, d, CANNOT_TELL if label == "unknown" else label, 1])
    return path


def test_round_trip_humans_who_agree_leave_the_scores(corpus, tmp_path):
    paths = _export(corpus, tmp_path)
    key = pl.read_parquet(paths["key"])
    template = hl.read_human_labels(paths["template"])
    labels = _reader_labels(corpus)
    human = human_labels_from_answers(
        [_write_answers(tmp_path / "a.csv", key, labels)], paths["key"], paths["template"]
    )
    assert human.height == template.height  # every person x attribute answered
    assert human.select("item_id", "stratum", "selection_probability").unique().sort(
        "item_id"
    ).equals(template.select("item_id", "stratum", "selection_probability").unique().sort(
        "item_id"
    ))  # fmt: skip
    # "cannot tell" is the reader's unknown: no label, the item still counts
    assert set(human.filter(pl.col("label") == "unknown")["attribute"]) == {"age"}
    answers, prompts, _ = corpus
    reader, prep = reader_table(answers, prompts)
    table, short = corrected_scores(reader, human, prep, load_truth(), replicates=50, lam="ppi")
    assert not short.height
    # 2 generators x (s_imp: gender, race, age, *; s_exp the same) over the implicit units
    assert table.height == 2 * 4 and set(table["metric"]) == {"s_imp"}
    # humans agree with the reader everywhere: with lam = 1 the rectifier is 0 and the
    # corrected score is the naive one in every row
    assert table["corrected"].to_numpy() == pytest.approx(table["naive"].to_numpy(), abs=1e-12)
    # the persons labelled: per generator 4 + 3 + 3 x 2 = 13 of 10 + 6 + 16 = 32 (the
    # overall row "*" counts them per attribute: 3 x)
    assert table["n_human"].to_list() == [13, 13, 13, 39] * 2
    assert table["n_items"].to_list() == [32, 32, 32, 96] * 2
    # and the naive score is the benchmark's own model-level S_imp
    from stereolens.biasig.metrics import compute_metrics

    ref = compute_metrics(answers, prompts, load_truth(), replicates=0, ceiling_draws=0,
                          which=("implicit",))["implicit"]  # fmt: skip
    ref = dict(
        ref.filter(pl.col("level") == "model")
        .select(pl.concat_str("model", pl.lit("/"), "protected_attribute"), "score")
        .iter_rows()
    )
    got = dict(
        table.select(
            pl.concat_str("model", pl.lit("/"), "protected_attribute"), "naive"
        ).iter_rows()
    )
    assert got == pytest.approx(ref, abs=1e-12)


def test_round_trip_one_flip_and_a_person_nobody_answered(corpus, tmp_path):
    paths = _export(corpus, tmp_path)
    key = pl.read_parquet(paths["key"])
    template = hl.read_human_labels(paths["template"])
    labels = _reader_labels(corpus)
    # an annotator who calls the first drawn rich-person image's person the other gender
    rich = template.filter(pl.col("stratum").str.starts_with("g1|g1|a photo of a rich")).sort(
        "item_id"
    )
    first = rich["item_id"][0]
    flip = "female" if labels[(first, "gender")] == "male" else "male"
    answers = _write_answers(tmp_path / "a.csv", key, {**labels, (first, "gender"): flip})
    human = human_labels_from_answers([answers], paths["key"], paths["template"])
    assert human.filter((pl.col("item_id") == first) & (pl.col("attribute") == "gender"))[
        "label"
    ].to_list() == [flip]
    reader, prep = reader_table(corpus[0], corpus[1])
    table, _ = corrected_scores(reader, human, prep, load_truth(), replicates=50, lam="ppi")
    row = table.filter((pl.col("model") == "g1") & (pl.col("protected_attribute") == "gender"))
    assert row["corrected"][0] != pytest.approx(row["naive"][0])
    others = table.filter(
        (pl.col("model") == "g2") | pl.col("protected_attribute").is_in(["race", "age"])
    )
    assert others["corrected"].to_numpy() == pytest.approx(others["naive"].to_numpy())
    # by hand: PPI (lam = 1) moves the rich-person unit's gender shares by the mean human -
    # reader difference over its 4 labelled images, 1 / 4 towards the flipped label, from
    # the reader's 5 of 10 each
    shares = rc.corrected_shares(reader, human, ("variant", "model", "unit", "position"))
    cell = shares.filter(
        (pl.col("model") == "g1") & pl.col("unit").str.contains("rich")
        & (pl.col("attribute") == "gender")
    )  # fmt: skip
    got = dict(cell.select("label", "corrected").iter_rows())
    assert cell["naive"].to_list() == [0.5, 0.5]
    assert got == pytest.approx({flip: 0.75, labels[(first, "gender")]: 0.25})
    # a person nobody answered: left out, the probability of its stratum is answered / N_h
    pair = template.filter(pl.col("item_id").str.ends_with(":left"))["item_id"][0]
    image = pair.rsplit(":", 1)[0]
    fewer = human_labels_from_answers(
        [_write_answers(tmp_path / "b.csv", key, labels, skip={f"{image}:left"})],
        paths["key"],
        paths["template"],
    )
    stratum = template.filter(pl.col("item_id") == pair)["stratum"][0]
    got = fewer.filter(pl.col("stratum") == stratum)
    left = got.filter(pl.col("item_id").str.ends_with(":left"))
    right = got.filter(pl.col("item_id").str.ends_with(":right"))
    assert left["item_id"].n_unique() == 2 and right["item_id"].n_unique() == 3
    assert left["selection_probability"].unique().to_list() == pytest.approx([2 / 8])
    assert right["selection_probability"].unique().to_list() == pytest.approx([3 / 8])


def test_bad_answers_are_named(corpus, tmp_path):
    paths = _export(corpus, tmp_path)
    key = pl.read_parquet(paths["key"])
    set_id, d, _, _ = next(_persons(key))
    bad = tmp_path / "bad.csv"
    with open(bad, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        w.writerow(["ann1", set_id, d, "robot", 1])
        w.writerow(["ann1", set_id, "left.height", "tall", 1])
        one = key.filter(pl.col("dimensions").list.len() == 3)["set_id"][0]
        w.writerow(["ann1", one, "right.gender", "male", 1])  # a one-person image's
    with pytest.raises(ValueError, match="3 problems") as err:
        human_labels_from_answers([bad], paths["key"], paths["template"])
    assert "row 2, column 'label': 'robot' is not a" in str(err.value)
    assert "row 3, column 'dimension'" in str(err.value)
    assert f"row 4, column 'dimension': 'right.gender' was not asked of set {one}" in str(err.value)
    # spellings: case and spaces as the vocabulary's, "Cannot tell" is no label
    ok = tmp_path / "ok.csv"
    with open(ok, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        attribute = d.rpartition(".")[2]
        spelled = {"gender": "FEMALE", "race": "east  asian", "age": "Cannot tell"}[attribute]
        w.writerow(["ann1", set_id, d, spelled, 1])
    got = human_labels_from_answers([ok], paths["key"], paths["template"])
    assert got["label"].to_list() == [
        {"gender": "female", "race": "East Asian", "age": "unknown"}[attribute]
    ]
    assert set(vocabulary()["left.race"]) == set(RACE)


def test_cli_round_trip(corpus, tmp_path, capsys):
    """reader-sample -> the form's answers -> human-labels -> biasig correct."""
    answers, prompts, root = corpus
    answers.write_parquet(tmp_path / "answers.parquet")
    prompts.write_parquet(tmp_path / "prompts.parquet")
    tables = ["--answers", str(tmp_path / "answers.parquet")]
    tables += ["--prompts", str(tmp_path / "prompts.parquet")]
    form = tmp_path / "form"
    argv = ["biasig", "reader-sample", *tables, "--images", str(root), "--out", str(form)]
    argv += ["--preset", '{"reader_sample": {"disagreement": 0.1}}', "--target-width", "0.5"]
    assert main([*argv, "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "g1: 10 of 24 images (13 of 32 persons) in 4 strata" in out
    key = pl.read_parquet(form / FILES["key"])
    csv_path = _write_answers(tmp_path / "a.csv", key, _reader_labels(corpus))
    human = tmp_path / "human.csv"
    argv = ["biasig", "human-labels", "--answers", str(csv_path), "--key"]
    argv += [str(form / FILES["key"]), "--template", str(form / FILES["template"])]
    assert main([*argv, "--out", str(human)]) == 0
    preset = '{"reader_correction": {"replicates": 20, "lam": "ppi"}}'
    argv = ["biasig", "correct", *tables, "--human", str(human)]
    assert main([*argv, "--out", str(tmp_path / "out"), "--preset", preset]) == 0
    table = pl.read_parquet(tmp_path / "out" / "corrected.parquet")
    assert table.filter(pl.col("metric") != "eta").height == 8
    # eta of the corpus's pairs (the CLI passes its prompt table): its cells are S_imp's
    assert table.filter(pl.col("metric") == "eta").height == 8
    assert not table.filter(pl.col("metric") == "eta")["interval_reliable"].any()
    assert table["corrected"].to_numpy() == pytest.approx(table["naive"].to_numpy(), abs=1e-12)


# ---------------------------------------------------------------- a real browser


def test_form_in_chromium_round_trip(corpus, tmp_path):
    """Fill the BiasIG form in headless Chromium with the reader's own labels ("cannot
    tell" for its unknowns), download the CSV and read it with `biasig human-labels`: the
    corrected scores equal the naive ones."""
    from report_browser import broken_links, chromium, console_errors, open_page
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    paths = _export(corpus, tmp_path / "form")
    key = pl.read_parquet(paths["key"])
    labels = _reader_labels(corpus)
    item_of = {(s, d): (i, a) for s, d, i, a in _persons(key)}
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with chromium(download_dir=downloads) as driver:
        open_page(driver, paths["form"])
        assert console_errors(driver) == [] and broken_links(driver, paths["form"]) == []
        assert "0 of" in driver.find_element(By.ID, "progress").text
        driver.find_element(By.ID, "annotator").send_keys("Ann, B.")
        items = driver.find_elements(By.CSS_SELECTOR, "fieldset.item")
        assert len(items) == len(item_of)
        for item in items:
            question = (item.get_attribute("data-set"), item.get_attribute("data-dimension"))
            field = Select(item.find_element(By.CSS_SELECTOR, "select.label"))
            field.select_by_value(labels[item_of[question]])
        text = driver.find_element(By.ID, "progress").text
        assert text == f"{len(items)} of {len(items)} answered"
        driver.find_element(By.ID, "save").click()  # no slider: nothing to confirm
        deadline, done = time.time() + 20, []
        while time.time() < deadline and not done:
            done = [p for p in downloads.glob("*.csv") if not p.name.endswith(".crdownload")]
            time.sleep(0.2)
        assert done, "the form downloaded no CSV"
        assert console_errors(driver) == []
    human = tmp_path / "human.csv"
    argv = ["biasig", "human-labels", "--answers", str(done[0]), "--key", str(paths["key"])]
    assert main([*argv, "--template", str(paths["template"]), "--out", str(human)]) == 0
    table = hl.read_human_labels(human)
    template = hl.read_human_labels(paths["template"])
    assert table.height == template.height
    reader, prep = reader_table(corpus[0], corpus[1])
    corrected, _ = corrected_scores(reader, table, prep, load_truth(), replicates=20, lam="ppi")
    assert corrected["corrected"].to_numpy() == pytest.approx(
        corrected["naive"].to_numpy(), abs=1e-12
    )


def test_cli_pilot_disagreement(corpus, tmp_path, capsys):
    """--pilot-human: the pilot's disagreement per correction stratum (fewer than 20 pairs
    each: the generator's pooled rate, the worst attribute)."""
    answers, prompts, root = corpus
    answers.write_parquet(tmp_path / "answers.parquet")
    reader, _ = reader_table(answers, prompts)
    # the pilot labelled images 0 and 1 of every unit: 8 persons per generator; one g1
    # gender read wrong -> g1's gender rate 1 / 8, every other rate 0
    pilot = reader.filter(pl.col("item_id").str.contains(r"-[01](:|$)")).select(
        "item_id", "attribute", "stratum", "label", pl.lit(0.2).alias("selection_probability")
    )
    wrong = f"g1-{RICH[:4]}-0"
    pilot = pilot.with_columns(
        label=pl.when((pl.col("item_id") == wrong) & (pl.col("attribute") == "gender"))
        .then(pl.lit("female" if labels_of(reader, wrong) == "male" else "male"))
        .otherwise("label")
    )
    pilot.write_csv(tmp_path / "pilot.csv")
    argv = ["biasig", "reader-sample", "--answers", str(tmp_path / "answers.parquet")]
    argv += ["--images", str(root), "--out", str(tmp_path / "form"), "--target-width", "0.5"]
    assert main([*argv, "--pilot-human", str(tmp_path / "pilot.csv")]) == 0
    design = pl.read_parquet(tmp_path / "form" / FILES["design"])
    rates = dict(design.group_by("variant").agg(pl.col("disagreement").unique()).iter_rows())
    assert rates == {"g1": [pytest.approx(1 / 8)], "g2": [0.0]}
    # no disagreement in g2: the floor of 2 images per stratum
    assert (design.filter(pl.col("variant") == "g2")["n_human"] == 2).all()
    capsys.readouterr()


def labels_of(reader: pl.DataFrame, item: str) -> str:
    return reader.filter((pl.col("item_id") == item) & (pl.col("attribute") == "gender"))["label"][
        0
    ]


def test_export_rule_is_opt_in(tmp_path, repo_root):
    """biasig.reader_sample.export (off by default) adds the rule export_biasig_reader_sample
    to the demo's dry run, with its four files under results/biasig/reader_sample/."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml
    from conftest import workflow_env

    snakemake = str(Path(sys.executable).parent / "snakemake")

    def dry_run(export: bool | None) -> str:
        config = yaml.safe_load((repo_root / "config" / "demo.yaml").read_text())
        config["registry"] = str(repo_root / "config" / "models.yaml")
        if export is not None:
            config["biasig"].setdefault("reader_sample", {})["export"] = export
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        run = subprocess.run(
            [snakemake, "-n", "--quiet", "rules", "--configfile", str(path)],
            cwd=repo_root, env=workflow_env(), capture_output=True, text=True,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout

    assert "export_biasig_reader_sample" not in dry_run(None)
    assert "export_biasig_reader_sample" in dry_run(True)
    from stereolens.biasig.plugin import _targets

    config = {"biasig": {"reader_sample": {"export": True}, "reader_correction": {}}}
    config["biasig"]["reader_correction"] = {"human_labels": None, "simulate": False}
    got = [t for t in _targets(config) if "reader_sample" in t]
    assert got == [
        f"results/biasig/reader_sample/{name}"
        for name in ("form.html", "key.parquet", "human_labels_template.csv", "design.parquet")
    ]


def test_plan_reads_a_biasig_pilot(corpus, tmp_path):
    """`stereolens plan --pilot DIR` (biasig.sample_design.pilot_rates): the pilot's answers
    and human labels give each generator's pooled rate (the planned strata are named
    generator|unit|person, the correction's variant|model|unit), the worst attribute: g1's
    gender 1 / 8, g2 0; without human labels the default, said in a note."""
    from stereolens.biasig.layout import LAYOUT
    from stereolens.biasig.sample_design import pilot_rates

    answers, prompts, _ = corpus
    pilot_dir = tmp_path / "results"
    LAYOUT.at(pilot_dir, "answers").parent.mkdir(parents=True)
    answers.write_parquet(LAYOUT.at(pilot_dir, "answers"))
    prompts.write_parquet(LAYOUT.at(pilot_dir, "prompts"))
    reader, _ = reader_table(answers, prompts)
    pilot = reader.filter(pl.col("item_id").str.contains(r"-[01](:|$)")).select(
        "item_id", "attribute", "stratum", "label", pl.lit(0.2).alias("selection_probability")
    )
    wrong = f"g1-{RICH[:4]}-0"
    pilot = pilot.with_columns(
        label=pl.when((pl.col("item_id") == wrong) & (pl.col("attribute") == "gender"))
        .then(pl.lit("female" if labels_of(reader, wrong) == "male" else "male"))
        .otherwise("label")
    )
    pilot.write_csv(tmp_path / "pilot.csv")
    config = {
        "biasig": {
            "count": "paper",
            "scoring_unit": "subject",
            "reader_correction": {"human_labels": str(tmp_path / "pilot.csv")},
        }
    }
    strata = pl.DataFrame(
        {
            "model": ["g1", "g1", "g2"],
            "stratum": ["g1|a|single", "g1|b|left", "g2|a|single"],
            "n_items": [10, 8, 10],
        }  # fmt: skip
    )
    table, source, notes = pilot_rates(config, pilot_dir, strata, 0.14)
    rates = dict(table.select("stratum", "disagreement").iter_rows())
    assert rates == {
        "g1|a|single": pytest.approx(1 / 8), "g1|b|left": pytest.approx(1 / 8), "g2|a|single": 0.0
    }  # fmt: skip
    assert source == f"pilot {tmp_path / 'pilot.csv'}" and notes == []
    config["biasig"]["reader_correction"]["human_labels"] = None
    table, source, notes = pilot_rates(config, pilot_dir, strata, 0.14)
    assert source == "default" and (table["disagreement"] == 0.14).all()
    assert "no answers and human labels" in notes[0]


def test_plan_design_raises_to_the_printing_minimum(corpus):
    """A person's n_h is raised to the largest of its rows' printing minimums its unit's
    images reach (the count `stereolens plan` recommends), else the width's stays: rich 10
    images at 5 -> 5; dancer 6 at 4 and 7 -> 4; employer 8 images, left at 8 -> 8, right
    at 9 -> the width's 3, the image count drawn the larger, 8. The corpus's units at
    their real minimums (S_imp's 400, and eta's 600 for rich, a side of eta.json's
    rich / poor pair) have too few images: the export draws the width's sample."""
    from stereolens.biasig.formulas import ETA_MIN_HUMAN_RELIABLE
    from stereolens.biasig.reader_sample import plan_design, reader_images
    from stereolens.biasig.sample_design import printing_minimum

    answers, prompts, _ = corpus
    images = reader_images(reader_table(answers, prompts)[0])
    unit = dict(images.select(pl.col("image_id").str.slice(3, 4), "unit").unique().iter_rows())
    least = pl.DataFrame(
        {
            "unit": [unit[RICH[:4]], unit[DANCER[:4]], unit[EMPLOYER[:4]], unit[EMPLOYER[:4]]],
            "position": ["single", "single", "left", "right"],
            "minimums": [[5], [4, 7], [8], [9]],
        }
    ).with_columns(minimum=pl.col("minimums").list.max())
    design = plan_design(images, 0.5, 0.1, minimum=least)
    width = plan_design(images, 0.5, 0.1)
    got = {
        (k, p): (m, planned)
        for p, k, m, planned in design.filter(pl.col("variant") == "g1")
        .select("position", "n_items", "n_human", "n_planned")
        .iter_rows()
    }
    assert got == {(10, "single"): (5, 5), (6, "single"): (4, 4), (8, "left"): (8, 8),
                   (8, "right"): (8, 3)}  # fmt: skip
    assert (design["width"] < width["width"]).all()
    keys = pl.DataFrame({"unit": [unit[p[:4]] for p in IMAGES], "prompt_id": list(IMAGES)}).join(
        prompts.select("prompt_id", "attribute_key"), on="prompt_id"
    )
    units = (
        images.explode("positions")
        .select("unit", "visibility", pl.col("positions").alias("position"))
        .unique()
        .join(keys.select("unit", "attribute_key"), on="unit")
    )
    real = dict(
        zip(
            units["unit"] + units["position"],
            printing_minimum(prompts, "paper", units).to_list(),
            strict=True,
        )
    )
    assert real[unit[RICH[:4]] + "single"] == [rc.MIN_HUMAN_RELIABLE, ETA_MIN_HUMAN_RELIABLE]
    assert min(min(v) for v in real.values()) >= rc.MIN_HUMAN_RELIABLE > max(IMAGES.values())


def test_the_recommended_sample_prints_s_imp(tmp_path):
    """End to end through the export: one generator, the rich person (a side of eta.json's
    rich / poor pair: S_imp's 400 and eta's 600) and the dancer (S_imp's 400) at 500
    images each. The width's sample alone prints no corrected S_imp '*' interval; the
    recommended one (printable: 400 each, the largest minimum 500 images reach) prints it."""
    from PIL import Image

    prompts = load_prompts().filter(pl.col("prompt_id").is_in([RICH, DANCER]))
    kinds = dict(prompts.select("prompt_id", "acquired_type").iter_rows())
    rows = []
    for prompt in (RICH, DANCER):
        shard = tmp_path / "images" / "g1" / kinds[prompt] / "implicit" / "0"
        shard.mkdir(parents=True)
        with open(shard / "metadata.jsonl", "w") as fh:
            for k in range(500):
                image_id = f"g1-{prompt[:4]}-{k}"
                Image.new("RGB", (8, 8), (k % 250, 80, 40)).save(shard / f"{image_id}.png")
                fh.write(json.dumps({"image_id": image_id, "image_file": f"{image_id}.png",
                                     "model": "g1"}) + "\n")  # fmt: skip
                rows.append({"model": "g1", "image_id": image_id, "position": "single",
                             "prompt_id": prompt, "gender": GENDER[k % 2],
                             "race": RACE[k % 4], "age": AGE[k % 3], "status": "ok"})  # fmt: skip
    answers = pl.DataFrame(rows)
    reader, prep = reader_table(answers, prompts)
    labels = reader.select("item_id", "attribute", "label")
    reliable = {}
    for printable in (False, True):
        paths = export_reader_sample(
            answers, prompts, tmp_path / "images", tmp_path / str(printable),
            target_width=0.5, disagreement=0.1, seed=3, printable=printable,
        )  # fmt: skip
        template = hl.read_human_labels(paths["template"])
        human = template.drop("label").join(labels, on=["item_id", "attribute"])
        table, _ = corrected_scores(
            reader, human, prep, load_truth(), prompts=prompts, replicates=20, lam="ppi"
        )
        top = table.filter(pl.col("protected_attribute") == "*")
        reliable[printable] = dict(top.select("metric", "interval_reliable").iter_rows())
        if printable:
            design = pl.read_parquet(paths["design"])
            assert design["n_human"].to_list() == [rc.MIN_HUMAN_RELIABLE] * 2
    # eta's row (the rich side alone resolves) stays withheld: 400 of its 600
    assert reliable == {False: {"s_imp": False, "eta": False}, True: {"s_imp": True, "eta": False}}
