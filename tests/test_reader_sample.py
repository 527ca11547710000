"""The human sample of the reader correction, designed (issue 21, item 2): the labels a
target width needs by hand, the stratified draw and its selection probabilities, the
reader-sample form and the round trip answers -> human-label table -> corrected table."""

from __future__ import annotations

import argparse
import csv
import json
import math

import numpy as np
import polars as pl
import pytest
from scipy import stats

from stereolens.annotation_form import CSV_COLUMNS
from stereolens.config import load_config
from stereolens.contextbias.annotation.sample_design import (
    FILES,
    export_reader_sample,
    human_labels_from_answers,
    labels_needed,
)
from stereolens.contextbias.corrected import corrected_table, reader_table
from stereolens.metrics import human_labels as hl
from stereolens.metrics import reader_correction as rc
from stereolens.metrics import sample_design as sd
from stereolens.plan import register

Z = float(stats.norm.ppf(0.975))


def _strata(n, d):
    return pl.DataFrame(
        {"stratum": [f"s{i}" for i in range(len(n))], "n_items": n, "disagreement": d}
    )


# ---------------------------------------------------------------- the number, by hand


def test_two_strata_neyman_by_hand():
    # N = (100, 300), disagreement (0.1, 0.4), width 0.2, share 0.5.
    # W = (1/4, 3/4), S = (sqrt .1, sqrt .4); sum W S = sqrt(.1) (1/4 + 3/4 x 2) = 1.75 sqrt(.1)
    # room = (0.2 / 2z)^2 - 0.25 / 400; n = (sum W S)^2 / room = 0.30625 / room
    # n_h = n W_h S_h / sum W S = n x (1/7, 6/7), each rounded up
    room = (0.2 / (2 * Z)) ** 2 - 0.25 / 400
    n = 0.30625 / room
    assert 154 < n < 156  # 154.8
    want = [math.ceil(n / 7), math.ceil(6 * n / 7)]
    got = sd.allocate(_strata([100, 300], [0.1, 0.4]), 0.2)
    assert got.strata["n_human"].to_list() == want == [23, 133]
    assert got.n_human == 156 and got.reachable and got.floor == 4
    # the width it plans: V = 0.25/400 + W1^2 .1 / 23 + W2^2 .4 / 133
    v = 0.25 / 400 + 0.25**2 * 0.1 / 23 + 0.75**2 * 0.4 / 133
    assert got.width == pytest.approx(2 * Z * math.sqrt(v), rel=1e-12)
    assert got.width <= 0.2
    assert got.naive_width == pytest.approx(2 * Z * math.sqrt(0.25 / 400), rel=1e-12)
    assert got.strata["selection_probability"].to_list() == pytest.approx([0.23, 133 / 300])
    # proportional: n = sum W S^2 / room = (.25 x .1 + .75 x .4) / room, n_h = n x (1/4, 3/4)
    prop = sd.allocate(_strata([100, 300], [0.1, 0.4]), 0.2, allocation="proportional")
    n_prop = 0.325 / room
    assert prop.strata["n_human"].to_list() == [math.ceil(n_prop / 4), math.ceil(3 * n_prop / 4)]
    assert prop.n_human > got.n_human  # Neyman needs fewer for the same width


def test_one_stratum_is_human_labels_needed():
    for n_items, d, width in ((500, 0.14, 0.1), (2000, 0.05, 0.03), (80, 0.3, 0.3)):
        got = sd.allocate(_strata([n_items], [d]), width)
        # (500, 0.14, 0.1): n = 0.14 / ((0.1/2z)^2 - 0.25/500) = 637 > 500: unreachable
        assert (got.n_human if got.reachable else None) == rc.human_labels_needed(d, width, n_items)


def test_floor_cap_and_unreachable():
    # a stratum without disagreement gets the floor; the other carries the reader's term:
    # room = (0.2/2z)^2 - 0.25/400, n_2 = W_2^2 x 0.4 / room = 0.5625 x 0.4 / room
    got = sd.allocate(_strata([100, 300], [0.0, 0.4]), 0.2)
    room = (0.2 / (2 * Z)) ** 2 - 0.25 / 400
    assert got.strata["n_human"].to_list() == [2, math.ceil(0.5625 * 0.4 / room)]
    # narrower than sampling alone allows: every item, flagged
    tight = sd.allocate(_strata([100, 300], [0.1, 0.4]), 0.05)
    assert not tight.reachable and tight.n_human == 400
    assert tight.naive_width > 0.05
    # a small stratum is labelled whole and the rest solved again (cap)
    capped = sd.allocate(_strata([3, 3000], [0.9, 0.1]), 0.05)
    assert capped.strata["n_human"][0] <= 3 and capped.reachable and capped.width <= 0.05
    with pytest.raises(ValueError, match="allocation"):
        sd.allocate(_strata([10], [0.1]), 0.1, allocation="optimal")


# ---------------------------------------------------------------- the draw


def test_disagreement_and_planned_widths():
    strata = pl.DataFrame({"model": ["a", "a", "b"], "stratum": ["x", "y", "x"]})
    assert sd.with_disagreement(strata, 0.1, ["stratum"])["disagreement"].to_list() == [0.1] * 3
    rates = pl.DataFrame({"model": ["a", "a", "b"], "stratum": ["x", "y", "x"],
                          "disagreement": [0.1, 0.2, 0.3]})  # fmt: skip
    got = sd.with_disagreement(strata, rates, ["model", "stratum"])
    assert got["disagreement"].to_list() == [0.1, 0.2, 0.3]
    with pytest.raises(ValueError, match="no rate for stratum 'y'"):
        sd.with_disagreement(strata, rates.filter(pl.col("stratum") == "x"), ["stratum"])
    summary = [{"model": "a", "width": 0.05, "reachable": True},
               {"model": "b", "width": 0.2, "reachable": False}]  # fmt: skip
    got = strata.with_columns(sd.planned_widths(summary, 0.1))
    assert got["width"].to_list() == [0.05, 0.05, 0.2]
    assert got["reachable"].to_list() == [True, True, False]
    assert got["target_width"].to_list() == [0.1] * 3


def test_draw_probabilities_and_cover():
    items = pl.DataFrame(
        {
            "item_id": [f"i{k:03d}" for k in range(60)],
            "stratum": ["a"] * 10 + ["b"] * 20 + ["c"] * 30,
        }
    )
    design = pl.DataFrame({"stratum": ["a", "b", "c"], "n_human": [2, 5, 9]})
    sample = sd.draw_sample(items, design, seed=3)
    per = sample.group_by("stratum").agg(
        pl.len().alias("n"),
        pl.col("selection_probability").first().alias("p"),
        (1 / pl.col("selection_probability")).sum().alias("ht"),
    )
    per = {s: (n, p, ht) for s, n, p, ht in per.iter_rows()}
    assert per == {
        "a": (2, pytest.approx(0.2), pytest.approx(10)),  # sum 1/p = N_h (Horvitz-Thompson)
        "b": (5, pytest.approx(0.25), pytest.approx(20)),
        "c": (9, pytest.approx(0.3), pytest.approx(30)),
    }
    assert min(n for n, _, _ in per.values()) >= rc.MIN_LABELLED
    assert sample.equals(sd.draw_sample(items, design, seed=3))
    assert not sample.equals(sd.draw_sample(items, design, seed=4))
    # a stratum's draw depends only on itself
    alone = sd.draw_sample(items, design.filter(pl.col("stratum") == "b"), seed=3)
    assert (
        alone["item_id"].to_list() == sample.filter(pl.col("stratum") == "b")["item_id"].to_list()
    )
    with pytest.raises(ValueError, match="11 human labels asked of its 10"):
        sd.draw_sample(items, pl.DataFrame({"stratum": ["a"], "n_human": [11]}))


def test_disagreement_by_stratum_by_hand():
    reader = pl.DataFrame(
        {
            "item_id": ["1", "2", "3", "4", "5", "5"],
            "attribute": ["g"] * 6,
            "label": ["f", "m", "f", "unknown", "x", "y"],
            "stratum": ["a", "a", "a", "b", "b", "b"],
        }
    )
    human = pl.DataFrame(
        {
            "item_id": ["1", "2", "4", "5", "5"],
            "attribute": ["g"] * 5,
            "label": ["f", "f", "unknown", "y", "x"],
            "stratum": ["a", "a", "b", "b", "b"],
            "selection_probability": [2 / 3, 2 / 3, 1.0, 1.0, 1.0],
        }
    )
    got = sd.disagreement_by_stratum(reader, human)
    # a: item 1 agrees, item 2 differs -> 1/2; b: 4 both none, 5 the same set {x, y} -> 0
    assert got.rows() == [("a", 2, 1, 0.5), ("b", 2, 0, 0.0)]


# ---------------------------------------------------------------- the form and round trip

MODELS = ("gen-a", "gen-b")
ROLES = ("nurse", "pilot")
CONDITIONS = ("CF", "CA-U")
PER = 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """64 8x8 PNGs (2 generators x 2 roles x 2 conditions x 8), their images table and
    the extractor's attributes (gender_presentation and eyewear_present)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("reader_corpus")
    images, attrs = [], []
    for m in MODELS:
        for r in ROLES:
            for c in CONDITIONS:
                for k in range(PER):
                    image_id = f"{m}-{r}-{c}-{k}"
                    path = root / f"{image_id}.png"
                    Image.new("RGB", (8, 8), (k * 30, 40, 90)).save(path)
                    images.append(
                        {"model": m, "role": r, "condition": c, "image_id": image_id,
                         "image_path": str(path), "status": "ok"}
                    )  # fmt: skip
                    gender = "female" if (k + (r == "pilot")) % 3 else "male"
                    for dim, label in (("gender_presentation", gender),
                                       ("eyewear_present", "yes" if k % 2 else "no")):  # fmt: skip
                        attrs.append(
                            {"model": m, "role": r, "condition": c, "image_id": image_id,
                             "cohort": "people", "dimension": dim, "label": label}
                        )  # fmt: skip
    return pl.DataFrame(images), pl.DataFrame(attrs)


DIMS = ("gender_presentation", "eyewear_present")


def _write_answers(path, key, labels, skip=()):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for set_id, image_ids in key.select("set_id", "image_ids").iter_rows():
            for dim in DIMS:
                if (image_ids[0], dim) not in skip:
                    w.writerow(["ann1", set_id, dim, labels[(image_ids[0], dim)], 1])
    return path


def test_reader_sample_round_trip(corpus, tmp_path):
    images, attributes = corpus
    paths = export_reader_sample(
        images, attributes, tmp_path, target_width=0.45, disagreement=0.05, dimensions=DIMS, seed=5
    )
    assert set(paths) == set(FILES)
    key = pl.read_parquet(paths["key"])
    template = hl.read_human_labels(paths["template"])
    design = pl.read_parquet(paths["design"])
    # the form's contract: one image per set, the key's columns; the template beside it
    assert (key["n_images"] == 1).all() and key["image_ids"].list.len().max() == 1
    assert "gen-a" not in paths["form"].read_text()  # blinded
    assert (template["label"] == "").all()
    assert template.height == key.height * len(DIMS)
    # the strata are the correction's ("model|role|condition"), each with >= 2 images
    reader = reader_table(attributes, images)
    per = template.group_by("stratum").agg(
        pl.col("item_id").n_unique().alias("n"),
        (1 / pl.col("selection_probability").first()).alias("inv"),
    )
    assert set(per["stratum"]) == set(reader["stratum"]) and per.height == 8
    assert per["n"].min() >= rc.MIN_LABELLED
    assert per["inv"].to_numpy() * per["n"].to_numpy() == pytest.approx(np.full(8, PER))
    # by hand, per generator: N = 32, W_h = 1/4, the same rate -> n = 0.05 / room = 9.3,
    # n_h = ceil(n / 4) = 3
    room = (0.45 / (2 * Z)) ** 2 - 0.25 / 32
    want = math.ceil(0.05 / room / 4)
    assert want == 3 and design["n_human"].to_list() == [want] * 8 and key.height == 8 * want
    assert design["reachable"].all() and (design["width"] <= 0.45).all()

    # an annotator who agrees with the extractor but on one image's gender
    truth = {
        (i, d): lab for i, d, lab in attributes.select("image_id", "dimension", "label").rows()
    }
    first = key["image_ids"][0][0]
    flip = "male" if truth[(first, "gender_presentation")] == "female" else "female"
    labels = {**truth, (first, "gender_presentation"): flip}
    answers = _write_answers(tmp_path / "ann1.csv", key, labels)
    human = human_labels_from_answers([answers], paths["key"], paths["template"])
    assert human.height == template.height
    assert human.select("item_id", "stratum", "selection_probability").unique().sort(
        "item_id"
    ).equals(template.select("item_id", "stratum", "selection_probability").unique().sort(
        "item_id"
    ))  # fmt: skip
    got = human.filter(
        (pl.col("item_id") == first) & (pl.col("attribute") == "gender_presentation")
    )["label"]
    assert got.to_list() == [flip]
    table, skipped = corrected_table(reader, human, replicates=50, metrics=("bi",))
    # model x role x cond x dim, and per model x role x cond the people cohort's mean
    # (dimension "*") and the overall value (cohort "*")
    assert table.height == 2 * 2 * 2 * (2 + 2) and not skipped.height
    table = table.filter(pl.col("dimension") != "*")
    assert (table["n_human"] == want).all() and (table["n_items"] == PER).all()

    # an image nobody answered: left out, its stratum's probability answered / N_h
    stratum = template.filter(pl.col("item_id") == first)["stratum"][0]
    partial = _write_answers(tmp_path / "ann2.csv", key, labels, skip={(first, d) for d in DIMS})
    fewer = human_labels_from_answers([partial], paths["key"], paths["template"])
    p = fewer.filter(pl.col("stratum") == stratum)
    assert p.height == (want - 1) * len(DIMS)
    assert p["selection_probability"].unique().to_list() == pytest.approx([(want - 1) / PER])
    other = fewer.filter(pl.col("stratum") != stratum)["selection_probability"].unique()
    assert other.to_list() == pytest.approx([want / PER])
    # one question unanswered: that pair is left out, the image (and p) stays
    one = _write_answers(tmp_path / "ann3.csv", key, labels, skip={(first, DIMS[0])})
    fewer = human_labels_from_answers([one], paths["key"], paths["template"])
    assert fewer.height == template.height - 1
    assert fewer["selection_probability"].unique().to_list() == pytest.approx([want / PER])


def test_multi_image_key_is_refused(corpus, tmp_path):
    from stereolens.contextbias.annotation.form import export_annotation_sample

    images, attributes = corpus
    paths = export_annotation_sample(
        images, attributes, tmp_path, conditions=CONDITIONS, images_per_set=4, dimensions=DIMS
    )
    template = sd.label_template(
        pl.DataFrame({"item_id": ["x"], "stratum": ["s"], "selection_probability": [1.0]}), DIMS
    )
    with pytest.raises(ValueError, match="shows 4 images"):
        human_labels_from_answers([], paths["key"], template)


def _pilot_human(reader):
    """Human labels of images 0 and 1 of each stratum: the reader's, but eyewear "yes" on
    image 0 (its reader label is "no")."""
    sample = reader.filter(
        pl.col("item_id").str.ends_with("-0") | pl.col("item_id").str.ends_with("-1")
    )
    return sample.select(
        "item_id", "attribute", "stratum", pl.lit(0.25).alias("selection_probability"),
        pl.when((pl.col("attribute") == "eyewear_present") & pl.col("item_id").str.ends_with("-0"))
        .then(pl.lit("yes")).otherwise(pl.col("label")).alias("label"),
    )  # fmt: skip


def test_pilot_disagreement_takes_the_worst_attribute(corpus):
    images, attributes = corpus
    reader = reader_table(attributes, images)
    human = _pilot_human(reader)
    strata = reader.select("model", "stratum").unique().with_columns(n_items=pl.lit(PER))
    got, source = sd.disagreement_rates(reader, human, strata, default=0.14)
    # 2 pairs per stratum and attribute (< MIN_PILOT_PAIRS): the generator's rate, 8 of
    # its 16 eyewear pairs differ -> 0.5 (gender 0): the worst attribute's
    assert source == "pilot" and got["disagreement"].to_list() == [0.5] * 8


def test_plan_reads_a_pilot(corpus, repo_root, monkeypatch, tmp_path):
    monkeypatch.chdir(repo_root)
    images, attributes = corpus
    human = _pilot_human(reader_table(attributes, images))
    (tmp_path / "contextbias").mkdir()
    attributes.write_parquet(tmp_path / "contextbias" / "attributes.parquet")
    images.write_parquet(tmp_path / "contextbias" / "images.parquet")
    config, _ = load_config("config/config.yaml")
    no_labels = labels_needed(config, tmp_path)
    assert no_labels["disagreement_source"] == "default" and "no human labels" in str(
        no_labels["notes"]
    )
    human.with_columns(simulated=pl.lit(True)).write_parquet(
        tmp_path / "contextbias" / "human_labels_simulated.parquet"
    )
    part = labels_needed(config, tmp_path)
    assert part["disagreement_source"].startswith("pilot")
    assert "SIMULATED" in " ".join(part["notes"])
    # the config's generators are not in the pilot: the pilot's overall rate, 16 of 32
    # eyewear pairs differ -> 0.5; n = 0.5 / room, each of a generator's strata rounded up
    for r in part["rows"]:
        assert r["disagreement_min"] == r["disagreement_max"] == 0.5
        room = (0.05 / (2 * Z)) ** 2 - 0.25 / r["n_items"]
        assert 0.5 / room <= r["n_human"] < 0.5 / room + r["strata"]


# ---------------------------------------------------------------- the planner


def test_plan_prints_and_returns_the_labels(repo_root, monkeypatch, capsys):
    monkeypatch.chdir(repo_root)
    config, _ = load_config("config/config.yaml")
    part = labels_needed(config, None)
    section = config["contextbias"]["reader_sample"]
    assert section["target_width"] == 0.05 and section["disagreement"] == 0.14
    for r in part["rows"]:
        assert r["reachable"] and r["width"] <= 0.05 and r["n_human"] >= r["floor"]
        assert r["floor"] == 2 * r["strata"]
        assert r["naive_width"] == pytest.approx(2 * Z * math.sqrt(0.25 / r["n_items"]))
        # equal rates: n = 0.14 / room before rounding each stratum up
        room = (0.05 / (2 * Z)) ** 2 - 0.25 / r["n_items"]
        assert 0.14 / room <= r["n_human"] < 0.14 / room + r["strata"]
    assert part["n_human"] == sum(r["n_human"] for r in part["rows"])
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", "--configfile", "config/config.yaml", "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    (cb,) = [p for p in out["reader"] if p["benchmark"] == "contextbias"]
    assert cb["n_human"] == part["n_human"] and cb["disagreement_source"] == "default"
    args = parser.parse_args(["plan", "--configfile", "config/config.yaml"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "Human labels for the contextbias reader correction" in text
    assert f"{cb['rows'][0]['n_human']:,} human labels" in text


def test_cli_round_trip(corpus, tmp_path, capsys):
    """reader-sample -> the form's answers -> human-labels -> contextbias correct."""
    from stereolens.cli import main

    images, attributes = corpus
    images.write_parquet(tmp_path / "images.parquet")
    attributes.write_parquet(tmp_path / "attributes.parquet")
    tables = ["--attributes", str(tmp_path / "attributes.parquet")]
    tables += ["--images", str(tmp_path / "images.parquet")]
    form = tmp_path / "form"
    argv = ["contextbias", "reader-sample", *tables, "--out", str(form)]
    design = '{"reader_sample": {"target_width": 0.45, "disagreement": 0.05}}'
    argv += ["--preset", design, "--dimensions", *DIMS]
    assert main(argv) == 0
    assert "gen-a: 12 of 32 images in 4 strata" in capsys.readouterr().out
    key = pl.read_parquet(form / FILES["key"])
    truth = {
        (i, d): lab for i, d, lab in attributes.select("image_id", "dimension", "label").rows()
    }
    answers = _write_answers(tmp_path / "a.csv", key, truth)
    human = tmp_path / "human.csv"
    argv = ["contextbias", "human-labels", "--answers", str(answers), "--key"]
    argv += [str(form / FILES["key"]), "--template", str(form / FILES["template"])]
    assert main([*argv, "--out", str(human)]) == 0
    preset = '{"reader_correction": {"replicates": 20, "lam": "ppi"}}'
    argv = ["contextbias", "correct", *tables, "--human", str(human)]
    assert main([*argv, "--out", str(tmp_path / "out"), "--preset", preset]) == 0
    table = pl.read_parquet(tmp_path / "out" / "corrected.parquet")
    # the humans agree with the reader everywhere: with lam = 1 (PPI) the rectifier is 0
    # and corrected = naive in every cell (tuned lam is 0 where the sample's reader labels
    # are constant, and the corrected share is then the sample's own)
    # 16 role-level BI rows (3 human labels each) and 16 of their summary rows (per
    # generator x role x condition: the people cohort's mean and the overall value, 2 x 3
    # human labels), 8 of BI pooled over the 2 roles and 8 of
    # its summary rows (per generator x condition: the people cohort's mean over the two
    # dimensions and the overall value, 2 dimensions x 6 human labels)
    # (and bi_pooled_mean: per condition, the two dimensions, the cohort and the overall
    # value as means over the generators), 16 each of the mean over roles and its
    # Miller-Madow twin (per generator x condition: the two dimensions, cohort, overall)
    # and 8 each of their means over the generators (per condition)
    counts = table.group_by("metric").len().sort("metric").rows()
    assert counts == [("bi", 32), ("bi_pooled", 16), ("bi_pooled_mean", 8), ("bi_role", 16),
                      ("bi_role_mean", 8), ("bi_role_mm", 16), ("bi_role_mm_mean", 8)]  # fmt: skip
    bi = table.filter(pl.col("metric") == "bi")
    assert (bi.filter(pl.col("dimension") != "*")["n_human"] == 3).all()
    # role-level BI's summary rows, per generator x role x condition (both dimensions)
    assert (bi.filter(pl.col("dimension") == "*")["n_human"] == 6).all()
    pooled = table.filter(pl.col("metric") == "bi_pooled")
    assert (pooled.filter(pl.col("dimension") != "*")["n_human"] == 6).all()
    summary = pooled.filter(pl.col("dimension") == "*")
    assert sorted(set(summary["cohort"])) == ["*", "people"] and summary.height == 8
    assert (summary["n_human"] == 12).all()
    assert table["corrected"].to_numpy() == pytest.approx(table["naive"].to_numpy(), nan_ok=True)


def test_biasig_plan_is_held_by_the_floor(repo_root, monkeypatch):
    """BiasIG: one stratum per generator x scoring unit x person; at paper scale the floor
    of 2 labels per cell, not the width, decides the number."""
    from stereolens.biasig.plugin import selection
    from stereolens.biasig.sample_design import labels_needed as biasig_labels
    from stereolens.biasig.sample_design import plan_strata

    monkeypatch.chdir(repo_root)
    config, _ = load_config("config/config.yaml")
    bg = config["biasig"]
    strata = plan_strata(config)
    persons = int(selection(config)["n_persons"].cast(pl.Int64).sum())
    per = strata.group_by("model").agg(pl.col("n_items").sum(), pl.len().alias("strata"))
    assert set(per["model"]) == set(bg["generators"])
    assert (per["n_items"] == persons * bg["images_per_prompt"]).all()  # 534,800
    part = biasig_labels(config, None)
    for r in part["rows"]:
        # n = 0.14 / ((0.05 / 2z)^2 - 0.25 / N) = 863 < 2 x strata: the floor
        room = (0.05 / (2 * Z)) ** 2 - 0.25 / r["n_items"]
        assert 0.14 / room < r["floor"] == r["n_human"] == 2 * r["strata"]
        assert r["width"] < 0.05


# ------------------------------------------------- labels that print the intervals


def test_printable_counts_by_hand():
    """Two cells of 500 items at the minimum of 400, one of 300 that never reaches it; the
    recommended count is each cell's larger of its width n_h and its reachable minimum."""
    strata = _strata([500, 500, 300], [0.14] * 3).with_columns(
        model=pl.lit("m"), minimum=pl.Series([400, 400, 400])
    )
    design = strata.select("stratum").with_columns(n_human=pl.Series([23, 23, 14]))
    (got,) = sd.printable_counts(strata, design).values()
    assert got == {
        "n_printable": 400 + 400 + 300,
        "n_recommended": 400 + 400 + 14,
        "minimum_min": 400,
        "minimum_max": 400,
        "cells_short": 1,
        "short_reaching": 0,
        "short_items_min": 300,
        "grow": pytest.approx(400 / 300),
    }
    # a cell no headline row uses (minimum 0) needs the correction's floor only
    strata = strata.with_columns(minimum=pl.Series([400, 0, 0]))
    (got,) = sd.printable_counts(strata, design).values()
    assert (got["n_printable"], got["n_recommended"], got["cells_short"]) == (404, 437, 0)
    assert got["short_items_min"] is None and got["grow"] is None


def test_contextbias_plan_prints_the_minimum(repo_root, monkeypatch):
    """One role at 100 seeds a prompt: CF has 3 prompts (300 images, short of 400), CA-R 7
    (700), CA-U 8 (800). Width 0.2, proportional: n = 0.14 / ((0.2 / 2z)^2 - 0.25 / 1,800)
    = 56.8, n_h = ceil(56.8 N_h / 1,800) = 10, 23, 26."""
    from stereolens.plan import format_reader

    monkeypatch.chdir(repo_root)
    config, _ = load_config("config/config.yaml")
    cb = config["contextbias"]
    cb.update(generators=["sdxl"], roles=["accountant"])
    cb["seeds"].update(per_prompt=100, per_shard=100)
    cb["reader_sample"].update(target_width=0.2, allocation="proportional")
    part = labels_needed(config, None)
    (r,) = part["rows"]
    assert (r["n_items"], r["strata"], r["n_human"]) == (1800, 3, 10 + 23 + 26)
    assert r["minimum_min"] == r["minimum_max"] == rc.MIN_HUMAN_RELIABLE == 400
    assert r["n_printable"] == 300 + 400 + 400 == part["n_printable"]
    assert (r["cells_short"], r["short_items_min"]) == (1, 300)
    assert r["n_recommended"] == 10 + 400 + 400 == part["n_recommended"]
    # 100 x 400 / 300 = 133.3 seeds a prompt put 400 images in the CF cell
    assert (r["knob"], r["knob_needed"]) == ("contextbias.seeds.per_prompt", 134)
    text = format_reader([part])
    assert "printable intervals: 1,100 human labels (400 in each cell" in text
    assert "1 of 3 cells have fewer images than their minimum (fewest 300)" in text
    assert "contextbias.seeds.per_prompt >= 134 allows them; recommended 810" in text
    cb["seeds"].update(per_prompt=10, per_shard=10)  # every cell short: the width's count
    (r,) = labels_needed(config, None)["rows"]
    assert (r["cells_short"], r["n_printable"], r["n_recommended"]) == (3, 180, r["n_human"])
    assert "(the width's: every headline interval will be withheld)" in format_reader(
        [labels_needed(config, None)]
    )


def test_contextbias_plan_at_the_paper_design(repo_root, monkeypatch):
    """config/config.yaml (92 roles x 3 conditions, 30-100 images a cell): every cell is
    short of the per-cell rows' 400 but reaches the mean over roles' minimum
    (contextbias.corrected_rule: 20 a role cell at 92 roles), so the plan recommends 20 a
    cell, 276 x 20 = 5,520 per generator, above the width's 1,105 (Neyman, width 0.05: no
    cell's n_h above 20). printing_minimums by hand (bi_role and bi_role_mean share 20: one
    entry): 92 roles -> [20, 400]; 46 roles -> [ceil(1,840 / 46) = 40, 400]; 2 roles ->
    [min(920, 400), 400] = [400, 400]."""
    from stereolens.contextbias.corrected_rule import printing_minimums
    from stereolens.plan import format_reader

    def minimums(roles: int) -> list:
        strata = pl.DataFrame(
            {"model": "g", "stratum": [f"g|r{r}|CF" for r in range(roles)], "n_items": 50}
        )
        out = printing_minimums(strata)
        assert (out["minimum"] == 400).all()
        return out["minimums"][0].to_list()

    assert minimums(92) == [20, 400]
    assert minimums(46) == [40, 400]
    assert minimums(2) == [400, 400]
    monkeypatch.chdir(repo_root)
    config, _ = load_config("config/config.yaml")
    part = labels_needed(config, None)
    assert len(part["rows"]) == 4
    for r in part["rows"]:
        assert (r["strata"], r["n_items"], r["n_human"]) == (276, 16_590, 1_105)
        assert (r["n_printable"], r["cells_short"], r["short_reaching"]) == (16_590, 276, 276)
        assert r["n_recommended"] == 276 * 20 == 5_520
    assert part["n_recommended"] == 22_080
    text = format_reader([part])
    why = "per cell the largest minimum it reaches, else the width's n_h"
    assert f"recommended 5,520 ({why})" in text


def test_biasig_plan_prints_the_minimum(repo_root, monkeypatch):
    """Judge, strong and weak at 25 images a prompt, 20 prompts a unit: 500 images a unit x
    person. Judge's implicit unit needs S_imp's 400, strong's and weak's (an eta pair's
    sides) S_imp's 400 and eta's 600: short of eta's, so 400 is recommended; the 27
    explicit units S_exp '*''s 100. Width 0.2, proportional over 30 strata: n = 0.14 /
    ((0.2 / 2z)^2 - 0.25 / 15,000) = 54.1, 2 a stratum (the floor)."""
    from stereolens.biasig.corrected import score_minimum
    from stereolens.biasig.formulas import ETA_MIN_HUMAN_RELIABLE
    from stereolens.biasig.sample_design import labels_needed as biasig_labels
    from stereolens.biasig.sample_design import plan_strata

    monkeypatch.chdir(repo_root)
    config, _ = load_config("config/config.yaml")
    bg = config["biasig"]
    bg.update(
        generators=["sdxl-turbo"],
        acquired_types=["occupation", "characteristic"],
        acquired_attributes=["Judge", "strong", "weak"],
        images_per_prompt=25,
    )
    bg["reader_sample"].update(target_width=0.2, allocation="proportional")
    strata = plan_strata(config)
    assert (strata["n_items"] == 500).all()
    by_min = dict(strata.group_by("minimum").len().iter_rows())
    explicit, implicit = score_minimum("s_exp", "*"), score_minimum("s_imp", "*")
    assert by_min == {explicit: 27, implicit: 1, ETA_MIN_HUMAN_RELIABLE: 2}
    assert (explicit, implicit, ETA_MIN_HUMAN_RELIABLE) == (100, 400, 600)
    (r,) = biasig_labels(config, None)["rows"]
    assert (r["strata"], r["n_human"]) == (30, 60)
    assert r["n_printable"] == 27 * 100 + 400 + 2 * 500
    assert (r["cells_short"], r["short_items_min"]) == (2, 500)
    assert r["n_recommended"] == 27 * 100 + 400 + 2 * 400
    sides = strata.filter(pl.col("minimum") == ETA_MIN_HUMAN_RELIABLE)["minimums"].to_list()
    assert sides == [[implicit, ETA_MIN_HUMAN_RELIABLE]] * 2
    assert (r["minimum_min"], r["minimum_max"]) == (100, 600)
    # 25 x 600 / 500 images a prompt put eta's sides at their minimum
    assert (r["knob"], r["knob_needed"]) == ("biasig.images_per_prompt", 30)


def test_allocate_raises_to_the_printing_minimum():
    """n_h = ceil(n W_h) as without a minimum, then max(n_h, minimum) where N_h >= minimum:
    the width's (23, 23, 14) of 500, 500, 300 items at 400 -> (400, 400, 14), the width
    that of the result; the plan's n_recommended is this total."""
    strata = _strata([500, 500, 300], [0.14] * 3)
    width = sd.allocate(strata, 0.2, allocation="proportional")
    raised = sd.allocate(strata.with_columns(minimum=pl.lit(400)), 0.2, allocation="proportional")
    # n = 0.14 / ((0.2 / 2z)^2 - 0.25 / 1,300) = 58.07 -> ceil(58.07 N_h / 1,300)
    assert width.strata["n_human"].to_list() == [23, 23, 14]
    assert raised.strata["n_human"].to_list() == [400, 400, 14]
    assert raised.n_human == 814 and raised.reachable
    n = np.array([400, 400, 14])
    w = np.array([500, 500, 300]) / 1300
    want = 2 * Z * math.sqrt(0.25 / 1300 + (w**2 * 0.14 / n).sum())
    assert raised.width == pytest.approx(want) and raised.width < width.width
    assert raised.strata["selection_probability"].to_list() == pytest.approx([0.8, 0.8, 14 / 300])
    strata = strata.with_columns(model=pl.lit("m"), minimum=pl.lit(400))
    (got,) = sd.printable_counts(strata, width.strata).values()
    assert got["n_recommended"] == raised.n_human


def test_reader_sample_follows_the_recommended_count(corpus, tmp_path):
    """The export raises n_h to ``minimum`` in a stratum of that many images (8 here): at 6
    each stratum gives 6 images; at 9 (more than a stratum has) the width's 3 stay; the
    default, reader_correction.MIN_HUMAN_RELIABLE, leaves these 8-image strata at 3."""
    images, attributes = corpus
    options = {"target_width": 0.45, "disagreement": 0.05, "dimensions": DIMS, "seed": 5}
    for minimum, want in ((6, 6), (9, 3), (None, 3), (rc.MIN_HUMAN_RELIABLE, 3)):
        out = tmp_path / str(minimum)
        if minimum == rc.MIN_HUMAN_RELIABLE:
            paths = export_reader_sample(images, attributes, out, **options)
        else:
            paths = export_reader_sample(images, attributes, out, minimum=minimum, **options)
        design = pl.read_parquet(paths["design"])
        assert design["n_human"].to_list() == [want] * 8
        assert design["selection_probability"].to_list() == pytest.approx([want / PER] * 8)
        assert pl.read_parquet(paths["key"]).height == 8 * want


def test_the_recommended_sample_prints_what_the_plan_says(tmp_path):
    """End to end: a generator x role with CF 300 and CA-U 500 images. The width's sample
    alone (0.2: a few labels a stratum) prints no corrected interval; the recommended one
    (n_h raised to MIN_HUMAN_RELIABLE where a stratum has that many images: CA-U 400, CF
    the width's) prints CA-U's BI row and withholds CF's, the one cell the plan names
    short."""
    sizes = {"CF": 300, "CA-U": 500}
    images, attrs = [], []
    for c, n in sizes.items():
        for k in range(n):
            image_id = f"g-nurse-{c}-{k}"
            images.append({"model": "g", "role": "nurse", "condition": c,
                           "image_id": image_id, "status": "ok"})  # fmt: skip
            attrs.append({"model": "g", "role": "nurse", "condition": c, "image_id": image_id,
                          "cohort": "people", "dimension": "gender_presentation",
                          "label": "female" if k % 3 else "male"})  # fmt: skip
    reader = reader_table(pl.DataFrame(attrs), pl.DataFrame(images))
    strata = reader.group_by("model", "stratum").agg(pl.len().cast(pl.Int64).alias("n_items"))
    strata = strata.with_columns(disagreement=pl.lit(0.14))
    part = sd.planner_part("contextbias", "images", {"target_width": 0.2,
                           "allocation": "neyman"}, strata, "default", [])  # fmt: skip
    (row,) = part["rows"]
    assert (row["cells_short"], row["short_items_min"]) == (1, 300)
    reliable = {}
    for name, table in (("width", strata), ("recommended", strata.with_columns(
            minimum=pl.lit(rc.MIN_HUMAN_RELIABLE)))):  # fmt: skip
        design, _ = sd.allocate_by_model(table, 0.2)
        if name == "recommended":
            assert design["n_human"].sum() == row["n_recommended"]
        sample = sd.draw_sample(reader.select("item_id", "stratum"), design, seed=1)
        human = (
            sd.label_template(sample, ["gender_presentation"])
            .drop("label")
            .join(reader.select("item_id", "attribute", "label"), on=["item_id", "attribute"])
            .select(list(hl.HUMAN_COLUMNS))
        )
        table, _ = corrected_table(reader, human, replicates=20, metrics=("bi",))
        cells = table.filter(pl.col("dimension") != "*")
        reliable[name] = dict(cells.select("condition", "interval_reliable").iter_rows())
        if name == "recommended":
            got = dict(cells.select("condition", "n_human").iter_rows())
            assert got["CA-U"] == rc.MIN_HUMAN_RELIABLE and got["CF"] < rc.MIN_HUMAN_RELIABLE
    assert reliable == {
        "width": {"CF": False, "CA-U": False},
        "recommended": {"CF": False, "CA-U": True},
    }
