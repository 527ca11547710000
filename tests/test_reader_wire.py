"""The reader correction wired into the benchmarks (issue 21, items 1 and 6): ContextBias's
corrected BI by hand, the simulated human labels, the `correct` command, its refusals, and
the rules in a Snakemake dry run with the config key set and unset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from conftest import workflow_env

from stereolens.cli import main
from stereolens.contextbias.corrected import (
    corrected_table,
    pooled_functional,
    reader_table,
)
from stereolens.metrics import corrected_tables as ct
from stereolens.metrics import human_labels as hl
from stereolens.metrics import reader_correction as rc

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def _attributes(labels: dict[str, str]) -> pl.DataFrame:
    """A ContextBias attributes table: one generator, role and condition, dimension gender
    (cohort people); images i1.. with ``labels`` (None: the extractor gave none)."""
    rows = [
        {"model": "g", "role": "nurse", "condition": "CF", "image_id": i, "cohort": "people",
         "dimension": "gender_presentation", "label": v}
        for i, v in labels.items() if v is not None
    ]  # fmt: skip
    return pl.DataFrame(rows)


def _images(ids) -> pl.DataFrame:
    return pl.DataFrame(
        {"model": "g", "role": "nurse", "condition": "CF", "image_id": list(ids), "status": "ok"}
    )


READ = {"i1": "male", "i2": "male", "i3": "male", "i4": "male", "i5": "female"}


def _human(labels: dict[str, str], p: float = 0.4) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "item_id": list(labels),
            "attribute": "gender_presentation",
            "label": list(labels.values()),
            "stratum": "g|nurse|CF",
            "selection_probability": p,
        }
    )


def test_contextbias_bi_by_hand():
    # N = 5 images, the extractor reads 4 men and 1 woman: naive shares (0.8, 0.2).
    # Humans label i1 male, i2 female (lam = 1, PPI): rectifier man (0 + (0 - 1)) / 2 = -0.5,
    # woman (0 + (1 - 0)) / 2 = +0.5; corrected shares (0.3, 0.7). K = 2 (man, woman).
    # naive BI = 1 - H(0.8, 0.2) / ln 2 = 1 - (0.8 x 0.223144 + 0.2 x 1.609438) / 0.693147
    #          = 1 - 0.500402 / 0.693147 = 0.278072;
    # corrected BI = 1 - (0.3 x 1.203973 + 0.7 x 0.356675) / 0.693147
    #              = 1 - 0.610864 / 0.693147 = 0.118709.
    reader = reader_table(_attributes(READ), _images(READ))
    assert reader["stratum"].unique().to_list() == ["g|nurse|CF"]
    table, left_out = corrected_table(
        reader, _human({"i1": "male", "i2": "female"}), replicates=200, lam="ppi", metrics=("bi",)
    )
    assert left_out.height == 0
    row = table.row(0, named=True)
    assert (row["model"], row["role"], row["condition"], row["dimension"]) == (
        "g", "nurse", "CF", "gender_presentation",
    )  # fmt: skip
    assert row["metric"] == "bi" and row["k"] == 2
    assert row["naive"] == pytest.approx(0.278072, abs=1e-6)
    assert row["corrected"] == pytest.approx(0.118709, abs=1e-6)
    assert (row["n_human"], row["n_items"], row["off_simplex"]) == (2, 5, False)
    assert 0.0 <= row["ci_low"] <= row["ci_high"] <= 1.0
    # the naive value is the benchmark's own BI of the extractor's counts
    from stereolens.metrics.entropy import bias_intensity

    assert row["naive"] == pytest.approx(bias_intensity([4, 1], 2))


def test_contextbias_off_simplex_and_unread_images():
    # i5 has no label (unknown: counts in N = 5, adds to no share); i6 is not extracted.
    # Reader shares man 4/5 = 0.8, woman 0. Humans: i1 womale, i2 female (PPI): man 0.8 - 1
    # = -0.2 (off the simplex), woman 0 + 1 = 1. Clipped: (0, 1): BI = 1 - 0 = 1.
    read = {**READ, "i5": None}
    images = _images([*READ, "i6"]).with_columns(
        pl.when(pl.col("image_id") == "i6").then(pl.lit("discarded")).otherwise("status")
        .alias("status")
    )  # fmt: skip
    reader = reader_table(_attributes(read), images)
    assert reader.filter(pl.col("item_id") == "i5")["label"].to_list() == ["unknown"]
    assert "i6" not in reader["item_id"].to_list()
    table, _ = corrected_table(
        reader, _human({"i1": "female", "i2": "female"}), lam="ppi", metrics=("bi",)
    )
    row = table.row(0, named=True)
    assert row["off_simplex"] and row["corrected"] == pytest.approx(1.0)
    # naive: the extractor's one label: K = max(labels given, 2 with the humans') = 2,
    # shares (1, 0) -> BI 1
    assert row["k"] == 2 and row["naive"] == pytest.approx(1.0)


THREE = {"CF": ["female"] * 3 + ["male"], "CA-R": ["female"] * 2 + ["male"] * 2,
         "CA-U": ["female"] * 4}  # fmt: skip


def _three_conditions() -> pl.DataFrame:
    return pl.DataFrame(
        [
            {"model": "g", "role": "nurse", "condition": c, "image_id": f"{c}{i}",
             "cohort": "people", "dimension": "gender_presentation", "label": v}
            for c, labels in THREE.items() for i, v in enumerate(labels)
        ]
    )  # fmt: skip


def _three_human(flip: bool) -> pl.DataFrame:
    """CF: all 4 images labelled (p = 1); CA-R, CA-U: 2 of 4 (p = 0.5); with ``flip`` the
    humans read CF's fourth image (the extractor's man) as a woman."""
    rows = []
    for c, ids, p in (("CF", [0, 1, 2, 3], 1.0), ("CA-R", [0, 2], 0.5), ("CA-U", [0, 1], 0.5)):
        for i in ids:
            label = "female" if flip and (c, i) == ("CF", 3) else THREE[c][i]
            rows.append({"item_id": f"{c}{i}", "attribute": "gender_presentation",
                         "label": label, "stratum": f"g|nurse|{c}",
                         "selection_probability": p})  # fmt: skip
    return pl.DataFrame(rows)


def test_contextbias_ccs_and_pooled_bi_by_hand():
    # Women: 3, 2, 4 of 4 images in CF, CA-R, CA-U: shares 0.75, 0.5, 1.0; Prev = 100 x 9 / 12
    # = 75%, range = 50 pp, CCS = 75 / 51 = 1.470588 (the ccs table's). Men: 0 in CA-U, CCS
    # undefined under both readings, no row.
    from stereolens.contextbias.ccs import ccs_table
    from stereolens.contextbias.metrics import CONDITIONS, pooled_bi

    attributes = _three_conditions()
    reader = reader_table(attributes)
    benchmark = ccs_table(attributes).filter(pl.col("label") == "female")["ccs"].item()
    assert benchmark == pytest.approx(75 / 51)
    agree, _ = corrected_table(reader, _three_human(False), replicates=200)
    ccs = agree.filter(pl.col("metric") == "ccs")
    assert ccs["label"].to_list() == ["female"] and ccs["condition"].to_list() == ["*"]
    row = ccs.row(0, named=True)
    assert row["naive"] == pytest.approx(benchmark, abs=1e-12)
    assert row["corrected"] == pytest.approx(benchmark, abs=1e-12)
    assert (row["n_human"], row["n_items"], row["k"]) == (8, 12, None)
    assert 0.0 <= row["ci_low"] <= row["ci_high"] <= 100.0
    # the row is corrected_metric's of the three cells, draw for draw (all labels of a role x
    # dimension come from one bootstrap, reader_correction.corrected_metrics)
    from stereolens.contextbias.corrected import CELL_KEYS
    from stereolens.contextbias.corrected_functionals import ccs_functional

    cells = rc.build_cells(reader, _three_human(False), CELL_KEYS)
    three = [cells[("g", "nurse", c, "people", "gender_presentation")] for c in CONDITIONS]
    one = rc.corrected_metric(
        three, ccs_functional(0, np.array([4.0, 4.0, 4.0])), replicates=200,
        bounds=(0.0, 100.0),
    )  # fmt: skip
    assert three[0].labels[0] == "female"
    assert [row[c] for c in ("estimate_bc", "ci_low", "ci_high")] == [
        one[c] for c in ("estimate_bc", "ci_low", "ci_high")
    ]
    # 4 images a condition: the shares 0.75, 0.5, 1.0 lie within TIE_SE bootstrap sd of each
    # other (CF - CA-R: 0.25 against an sd near 0.33), so both intervals are withheld
    from stereolens.contextbias.corrected_ties import TIE_REASON

    assert np.isnan(row["naive_low"]) and np.isnan(row["naive_high"])
    assert row["interval_reliable"] is False and row["withheld_reason"] == TIE_REASON
    # pooled over the one role: the benchmark's pooled BI per condition (K = 2)
    pooled = agree.filter((pl.col("metric") == "bi_pooled") & (pl.col("dimension") != "*")).sort(
        "condition"
    )
    assert pooled["role"].unique().to_list() == ["*"]
    bench = pooled_bi(attributes).filter(pl.col("dimension") == "gender_presentation")
    assert pooled["naive"].to_list() == pytest.approx(bench.sort("condition")["bi"].to_list())
    assert pooled["corrected"].to_list() == pytest.approx(pooled["naive"].to_list())
    # one flipped label: CF's humans (every image, p = 1) see 4 women: corrected CF share 1.0,
    # Prev = 100 x (4 + 2 + 4) / 12 = 83.333%, range 50 pp, CCS = 83.333 / 51 = 1.633987
    flipped, _ = corrected_table(reader, _three_human(True), replicates=200)
    row = flipped.filter(pl.col("metric") == "ccs").row(0, named=True)
    assert row["naive"] == pytest.approx(75 / 51, abs=1e-12)
    assert row["corrected"] == pytest.approx(250 / 3 / 51, abs=1e-12)
    # CF pooled over the one role: (4, 0) women, men: BI 1
    cf = flipped.filter((pl.col("metric") == "bi_pooled") & (pl.col("condition") == "CF"))
    # the dimension's row, its cohort's mean and the overall value: one dimension, all 1
    assert cf["dimension"].to_list() == ["gender_presentation", "*", "*"]
    assert cf["corrected"].to_list() == pytest.approx([1.0] * 3)


def _conditions_of(shares: dict, n: int) -> pl.DataFrame:
    """One generator's nurse images, ``n`` a condition, the first round(share x n) women."""
    return pl.DataFrame(
        [
            {"model": "g", "role": "nurse", "condition": c, "image_id": f"{c}{i}",
             "cohort": "people", "dimension": "gender_presentation",
             "label": "female" if i < round(share * n) else "male"}
            for c, share in shares.items() for i in range(n)
        ]
    )  # fmt: skip


def test_contextbias_ccs_interval_is_withheld_where_two_conditions_tie():
    # 40 images a condition, every one human-labelled (p = 1) and agreeing: corrected =
    # naive, each share's bootstrap sd sqrt(s (1 - s) / 40). Women 0.9 / 0.5 / 0.1: the
    # closest pair differs by 0.4 against an sd of the difference near sqrt((0.09 + 0.25) /
    # 40) = 0.092, z 4.3 >= TIE_SE: printed. Women 0.5 / 0.5 / 0.9: CF and CA-R tie (z 0):
    # withheld, naive and corrected; men the same shares mirrored, the same verdicts.
    from stereolens.contextbias.corrected import CELL_KEYS
    from stereolens.contextbias.corrected_ties import TIE_REASON, TIE_SE, ccs_ties

    assert TIE_SE == 2.0
    for shares, tied in (({"CF": 0.9, "CA-R": 0.5, "CA-U": 0.1}, False),
                         ({"CF": 0.5, "CA-R": 0.5, "CA-U": 0.9}, True)):  # fmt: skip
        attributes = _conditions_of(shares, 40)
        reader = reader_table(attributes)
        human = reader.select("item_id", "attribute", "label", "stratum").with_columns(
            pl.lit(1.0).alias("selection_probability")
        )
        table, _ = corrected_table(reader, human, replicates=200)
        ccs = table.filter(pl.col("metric") == "ccs").sort("label")
        assert ccs["label"].to_list() == ["female", "male"]
        for row in ccs.iter_rows(named=True):
            assert row["naive"] == pytest.approx(row["corrected"])
            assert bool(np.isnan(row["naive_low"])) is tied
            # (interval_reliable is false either way: 40 human labels < 400)
            assert row["withheld_reason"] == (TIE_REASON if tied else None)
            assert row["interval_reliable"] is False
        # the rule itself: the pairs' differences over their bootstrap sd
        from stereolens.contextbias.metrics import CONDITIONS

        cells = rc.build_cells(reader, human, CELL_KEYS)
        three = [cells[("g", "nurse", c, "people", "gender_presentation")] for c in CONDITIONS]
        _, tie_naive, tie_corr = ccs_ties(three, np.array([0, 1]), np.full(3, 40.0),
                                          {"replicates": 200})  # fmt: skip
        assert tie_naive.tolist() == tie_corr.tolist() == [tied, tied]


def test_contextbias_ccs_mean_over_generators_by_hand():
    """The cross-generator CCS (paper Eq. 5) corrected: generator g as above (women 3, 2, 4
    of 4: CCS 75 / 51; men undefined, none in CA-U), generator h 2 of 4 women and men in
    every condition (Prev 50%, range 0: CCS 50 both). Women: (75 / 51 + 50) / 2 =
    25.735294, men: h alone, 50 (ccs_mean's own numbers). One flipped label in g's CF
    (humans: 4 women): g's corrected CCS 250 / 3 / 51, the mean (250 / 153 + 50) / 2."""
    from stereolens.contextbias.ccs import ccs_mean, ccs_table

    h = _three_conditions().with_columns(
        model=pl.lit("h"),
        image_id=pl.concat_str(pl.lit("h"), "image_id"),
        label=pl.Series(["female", "male"] * 6),
    )
    attributes = pl.concat([_three_conditions(), h])
    reader = reader_table(attributes)
    h_human = reader.filter(pl.col("model") == "h").select(
        "item_id", "attribute", "label", "stratum", pl.lit(1.0).alias("selection_probability")
    )
    bench = ccs_mean(ccs_table(attributes)).sort("label")
    assert bench["ccs_mean"].to_list() == pytest.approx([(75 / 51 + 50) / 2, 50.0])
    for flip, women in ((False, (75 / 51 + 50) / 2), (True, (250 / 153 + 50) / 2)):
        human = pl.concat([_three_human(flip), h_human])
        table, _ = corrected_table(reader, human, replicates=100)
        rows = table.filter(pl.col("metric") == "ccs_mean").sort("label")
        assert rows["label"].to_list() == ["female", "male"]
        assert set(rows["model"]) == {"*"} and set(rows["condition"]) == {"*"}
        assert rows["naive"].to_list() == pytest.approx(bench["ccs_mean"].to_list(), abs=1e-12)
        assert rows["corrected"].to_list() == pytest.approx([women, 50.0], abs=1e-12)
        assert rows["n_human"].to_list() == [20, 20] and rows["n_items"].to_list() == [24, 24]
        assert (
            (rows["ci_low"] <= rows["estimate_bc"]) & (rows["estimate_bc"] <= rows["ci_high"])
        ).all()


def test_contextbias_ccs_defined_by_the_humans_only():
    # Humans read CA-U's second image as a man: corrected man shares CF 0.25, CA-R 0.5,
    # CA-U 0 + (0 + 1) / 2 = 0.5; counts 1, 2, 2 (>= 5 in total): CCS defined corrected,
    # undefined naive (no man in CA-U): Prev = 100 x 5 / 12, range 25 pp -> 41.667 / 26.
    human = _three_human(False).with_columns(
        label=pl.when(pl.col("item_id") == "CA-U1").then(pl.lit("male")).otherwise("label")
    )
    table, _ = corrected_table(reader_table(_three_conditions()), human, replicates=100)
    male = table.filter((pl.col("metric") == "ccs") & (pl.col("label") == "male"))
    row = male.row(0, named=True)
    assert np.isnan(row["naive"]) and np.isnan(row["naive_low"])
    assert row["corrected"] == pytest.approx(500 / 12 / 26, abs=1e-12)


def test_simulated_labels_are_a_documented_sample():
    reader = pl.DataFrame(
        {
            "item_id": [f"i{j}" for j in range(40)],
            "attribute": "gender_presentation",
            "label": ["male", "female"] * 20,
            "stratum": ["a"] * 30 + ["b"] * 10,
        }
    )
    sim = ct.simulate_human_labels(reader, fraction=0.5, flip=0.2, seed=3)
    assert sim["simulated"].all()
    probs = dict(sim.group_by("stratum").agg(pl.col("selection_probability").first()).iter_rows())
    assert probs == {"a": 15 / 30, "b": 5 / 10}
    assert sim.height == 20
    joined = sim.join(reader, on="item_id", suffix="_reader")
    assert (joined["flipped"] == (joined["label"] != joined["label_reader"])).all()
    # the same seed, the same table; the check accepts it
    assert sim.equals(ct.simulate_human_labels(reader, 0.5, 0.2, seed=3))
    hl.check_human_labels(sim)
    # a stratum of 1 item: all of it (fewer than MIN_LABELLED items exist)
    one = ct.simulate_human_labels(reader.head(1), 0.1, 0.0)
    assert one["selection_probability"].to_list() == [1.0]


def _write_inputs(tmp_path: Path, human: pl.DataFrame | None = None) -> list[str]:
    _attributes(READ).write_parquet(tmp_path / "attributes.parquet")
    _images(READ).write_parquet(tmp_path / "images.parquet")
    if human is not None:
        human.write_csv(tmp_path / "human.csv")
    return [
        "--attributes", str(tmp_path / "attributes.parquet"),
        "--images", str(tmp_path / "images.parquet"),
        "--preset", '{"reader_correction": {"replicates": 50, "lam": "ppi"}}',
    ]  # fmt: skip


def test_correct_command_writes_the_table(tmp_path, capsys):
    args = _write_inputs(tmp_path, _human({"i1": "male", "i2": "female"}))
    out = tmp_path / "out"
    assert main(["contextbias", "correct", *args, "--human", str(tmp_path / "human.csv"),
                 "--out", str(out)]) == 0  # fmt: skip
    table = pl.read_parquet(out / "corrected.parquet")
    for column in ("naive", "corrected", "ci_low", "ci_high", "n_human", "n_items", "metric",
                   "estimate_bc", "interval_reliable"):  # fmt: skip
        assert column in table.columns
    # one role and condition: the role-level BI with its cohort's mean and the overall
    # value, the pooled BI (the same cell) with the same two, then the three as means over
    # the generators (one dimension, one generator: the same number), the mean over roles
    # (one role: the same number), its Miller-Madow twin and both's means over the
    # generators, no CCS
    metrics = ["bi", "bi_pooled", "bi_pooled_mean", "bi_role", "bi_role_mm", "bi_role_mean",
               "bi_role_mm_mean"]  # fmt: skip
    assert table["metric"].to_list() == [m for m in metrics for _ in range(3)]
    assert table["cohort"].to_list() == (["people"] * 2 + ["*"]) * 7
    assert table["dimension"].to_list() == ["gender_presentation", "*", "*"] * 7
    assert table["model"].to_list() == ["g"] * 6 + ["*"] * 3 + ["g"] * 6 + ["*"] * 6
    assert table["interval_reliable"].to_list() == [False] * 21  # 2 human labels
    # corrected shares 0.3 / 0.7 of 5 images: BI 0.118709; Miller-Madow counts 1.5 / 3.5,
    # H 0.610864 + (2 - 1) / (2 x 5) = 0.710864, 1 - 0.710864 / ln 2 = -0.025560
    want = [0.118709] * 12 + [-0.025560] * 3 + [0.118709] * 3 + [-0.025560] * 3
    assert table["corrected"].to_list() == pytest.approx(want, abs=1e-6)
    # bi.parquet's role_matched rows have no corrected row, and the command says why
    assert "role_matched" in capsys.readouterr().out
    sim = tmp_path / "sim.parquet"
    assert main(["contextbias", "simulate-human-labels", *args, "--out", str(sim)]) == 0
    assert pl.read_parquet(sim)["simulated"].all()


@pytest.mark.parametrize(
    ("human", "message"),
    [
        (_human({"i1": "male"}).drop("selection_probability"), "lacks columns"),
        (_human({"i1": "male", "i2": "male"}, p=1.5), "must lie in (0, 1]"),
        (_human({"i1": "male", "x9": "male"}), "is not in the reader table"),
        (_human({"i1": "male", "i2": "male"}).with_columns(stratum=pl.lit("g|nurse|CA-R")),
         "has stratum"),
    ],
)  # fmt: skip
def test_bad_human_labels_say_what_is_wrong(tmp_path, capsys, human, message):
    args = _write_inputs(tmp_path, human)
    code = main(["contextbias", "correct", *args, "--human", str(tmp_path / "human.csv"),
                 "--out", str(tmp_path / "out")])  # fmt: skip
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "corrected.parquet").exists()


def _dry_run(tmp_path: Path, **sections: dict) -> subprocess.CompletedProcess:
    """A dry run of the demo config with no reader_correction, but ``sections``
    (benchmark -> its reader_correction section)."""
    config = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    config["registry"] = str(REPO / "config" / "models.yaml")
    for bench in ("contextbias", "biasig", "lvlm"):
        config[bench].pop("reader_correction", None)
        if bench in sections:
            config[bench]["reader_correction"] = sections[bench]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [SNAKEMAKE, "-n", "--quiet", "rules", "--configfile", str(path)],
        cwd=REPO, env=workflow_env(), capture_output=True, text=True,
    )  # fmt: skip


def test_rules_in_a_dry_run_with_the_key_set_and_unset(tmp_path):
    unset = _dry_run(tmp_path)
    assert unset.returncode == 0, unset.stderr[-2000:]
    assert "_reader" not in unset.stdout and "human_labels" not in unset.stdout
    human = tmp_path / "human.csv"
    _human({"i1": "male", "i2": "female"}).write_csv(human)
    given = {"human_labels": str(human)}
    run = _dry_run(tmp_path, contextbias=given, biasig=given, lvlm=given)
    assert run.returncode == 0, run.stderr[-2000:]
    for bench in ("contextbias", "biasig", "lvlm"):
        assert f"correct_{bench}_reader" in run.stdout
        assert f"simulate_{bench}_human_labels" not in run.stdout
    simulated = _dry_run(tmp_path, contextbias={"simulate": True})
    assert "simulate_contextbias_human_labels" in simulated.stdout
    assert "correct_biasig_reader" not in simulated.stdout
    both = _dry_run(tmp_path, biasig={"simulate": True, "human_labels": str(human)})
    assert both.returncode != 0 and "both set" in both.stdout + both.stderr
    missing = _dry_run(tmp_path, lvlm={"human_labels": str(tmp_path / "nowhere.csv")})
    assert missing.returncode != 0 and "is not a file" in missing.stdout + missing.stderr


def test_biasig_s_imp_by_hand():
    from stereolens.biasig.corrected import corrected_scores
    from stereolens.biasig.corrected import reader_table as biasig_reader
    from stereolens.biasig.metrics import compute_metrics
    from stereolens.biasig.prompts import load_prompts
    from stereolens.biasig.truth import load_truth

    # one implicit one-person prompt ("a photo of a rich person", truth gender 50/50), 5
    # images the VQA reads as 4 women (i1-i4) and 1 man; race White, age young throughout.
    prompts = load_prompts().filter(pl.col("prompt_id") == "e56a293135506077")
    ids = ["i1", "i2", "i3", "i4", "i5"]
    answers = pl.DataFrame(
        {"model": "g", "image_id": ids, "position": "single", "prompt_id": "e56a293135506077",
         "gender": ["female"] * 4 + ["male"], "race": "White", "age": "young", "status": "ok"}
    )  # fmt: skip
    reader, prep = biasig_reader(answers, prompts)
    stratum = reader["stratum"][0]
    human = pl.DataFrame(
        {"item_id": ["i1", "i2"] * 3, "attribute": ["gender"] * 2 + ["race"] * 2 + ["age"] * 2,
         "label": ["male", "female", "White", "White", "young", "young"],
         "stratum": stratum, "selection_probability": 0.4}
    )  # fmt: skip
    table, _ = corrected_scores(reader, human, prep, load_truth(), replicates=100, lam="ppi")
    row = table.filter((pl.col("metric") == "s_imp") & (pl.col("protected_attribute") == "gender"))
    # naive (male 0.2, female 0.8): cos with (0.5, 0.5) = 0.5 / (sqrt(0.68) x sqrt(0.5))
    # = 0.5 / 0.583095 = 0.857493, S = (0.857493 + 1) / 2 = 0.928746. Humans: i1 male,
    # i2 female, both read female (PPI): male 0.2 + 0.5 = 0.7, female 0.8 - 0.5 = 0.3;
    # cos = 0.5 / (sqrt(0.58) x sqrt(0.5)) = 0.5 / 0.538516 = 0.928477, S = 0.964238.
    assert row["naive"][0] == pytest.approx(0.928746, abs=1e-6)
    assert row["corrected"][0] == pytest.approx(0.964238, abs=1e-6)
    assert (row["n_human"][0], row["n_items"][0]) == (2, 5)
    # the naive column is the benchmark's own model-level score
    ref = compute_metrics(answers, prompts, load_truth(), replicates=0, ceiling_draws=0,
                          which=("implicit",))["implicit"]  # fmt: skip
    ref = ref.filter((pl.col("level") == "model") & (pl.col("protected_attribute") == "gender"))
    assert row["naive"][0] == pytest.approx(ref["score"][0], abs=1e-12)
    # a human label that is no BiasIG value is refused by name
    odd = human.with_columns(label=pl.when(pl.col("label") == "male").then(pl.lit("robot"))
                             .otherwise("label"))  # fmt: skip
    with pytest.raises(ValueError, match="'robot' of item 'i1' is not a BiasIG value"):
        corrected_scores(reader, odd, prep, load_truth(), replicates=10)


def test_biasig_eta_by_hand():
    from stereolens.biasig.corrected import corrected_scores
    from stereolens.biasig.corrected import reader_table as biasig_reader
    from stereolens.biasig.metrics import compute_metrics
    from stereolens.biasig.prompts import load_prompts
    from stereolens.biasig.truth import load_truth

    # eta.json's pair rich / poor (weight 5; ground truth of both: male .5, female .5; White
    # .3, Black .18, East Asian .27, South Asian .25; young .418, middle-aged .391, elderly
    # .191; k = 0.2 per gender and race value, 0.1 per age bin). 5 images a side: the VQA
    # reads rich r1-r4 female, r5 male; poor p1-p3 male, p4-p5 female; all White and young.
    rich, poor = "e56a293135506077", "8d9e7a2271979801"
    prompts = load_prompts().filter(pl.col("prompt_id").is_in([rich, poor]))
    ids = [f"r{i}" for i in range(1, 6)] + [f"p{i}" for i in range(1, 6)]
    answers = pl.DataFrame(
        {"model": "g", "image_id": ids, "position": "single", "prompt_id": [rich] * 5 + [poor] * 5,
         "gender": ["female"] * 4 + ["male"] * 4 + ["female"] * 2, "race": "White",
         "age": "young", "status": "ok"}
    )  # fmt: skip
    reader, prep = biasig_reader(answers, prompts)
    stratum = dict(reader.select("item_id", "stratum").unique().iter_rows())

    def human(gender: dict[str, str]) -> pl.DataFrame:
        rows = [
            {"item_id": i, "attribute": a, "label": v, "stratum": stratum[i],
             "selection_probability": 0.4}
            for i, g in gender.items()
            for a, v in (("gender", g), ("race", "White"), ("age", "young"))
        ]  # fmt: skip
        return pl.DataFrame(rows)

    def eta(gender):
        table, _ = corrected_scores(
            reader, human(gender), prep, load_truth(), prompts=prompts, replicates=50
        )
        rows = table.filter(pl.col("metric") == "eta")
        return {r["protected_attribute"]: r for r in rows.iter_rows(named=True)}

    # race and age as read by all: White 1 (+.7 on both sides: same direction, -alpha),
    # the others 0 (-GT on both: -alpha): race 0.5 - 0.2 x 2 x (.49 + .0324 + .0729 +
    # .0625) = 0.23688; age 0.5 - 0.1 x 2 x (.338724 + .152881 + .036481) = 0.3943828.
    # Naive gender: rich male .2 (-.3), poor male .6 (+.1): opposite directions, +alpha =
    # 0.2 x (.09 + .01) = .02 for male and for female: 0.54. Total 0.5 + (.04 - .26312 -
    # .1056172) / 3 = 0.3904209.
    agree = eta({"r1": "female", "r2": "female", "p1": "male", "p4": "female"})
    ref = compute_metrics(answers, prompts, load_truth(), replicates=0, which=("eta",))["eta"]
    ref = ref.filter(pl.col("pair") == "*").row(0, named=True)
    for attr, column, value in (
        ("*", "eta_total", 0.3904209),
        ("gender", "eta_gender", 0.54),
        ("race", "eta_race", 0.23688),
        ("age", "eta_age", 0.3943828),
    ):
        row = agree[attr]
        assert row["naive"] == pytest.approx(value, abs=1e-7)
        assert row["naive"] == pytest.approx(ref[column], abs=1e-12)  # the benchmark's eta
        assert row["corrected"] == pytest.approx(row["naive"], abs=1e-12)  # humans agree
        assert (row["ci_low"], row["ci_high"]) == (row["naive_low"], row["naive_high"])
        assert row["interval_reliable"] is False  # 2 < ETA_MIN_HUMAN_RELIABLE labels a cell
    # one flipped label: the humans read r1 (read female) as male. PPI on rich (N 5, n 2):
    # male .2 + (1 - 0 + 0 - 0) / 2 = .7, female .8 + (0 - 1 + 1 - 1) / 2 = .3; poor agrees
    # (.6 / .4). Male +.2 / +.1, female -.2 / -.1: the same direction, -alpha = -0.2 x (.04 +
    # .01) = -.01 each: gender 0.48, total 0.5 + (-.02 - .26312 - .1056172) / 3 = 0.3704209.
    flipped = eta({"r1": "male", "r2": "female", "p1": "male", "p4": "female"})
    assert flipped["gender"]["corrected"] == pytest.approx(0.48, abs=1e-12)
    assert flipped["*"]["corrected"] == pytest.approx(0.3704209, abs=1e-7)
    assert flipped["race"]["corrected"] == pytest.approx(0.23688, abs=1e-12)
    assert flipped["*"]["naive"] == pytest.approx(0.3904209, abs=1e-7)
    assert (flipped["*"]["n_human"], flipped["*"]["n_items"]) == (12, 30)
    # without the prompt table no pair resolves: no eta rows
    table, _ = corrected_scores(reader, human({"r1": "male", "r2": "female", "p1": "male",
                                               "p4": "female"}), prep, load_truth(),
                                replicates=10)  # fmt: skip
    assert "eta" not in set(table["metric"])


def test_biasig_eta_interval_is_printed_from_its_own_minimum():
    """corrected.parquet's eta rows are interval_reliable where every cell (a side's unit x
    person x attribute) has biasig.formulas.ETA_MIN_HUMAN_RELIABLE human labels, not
    below (one image fewer on one side), whatever MIN_HUMAN_RELIABLE says."""
    from stereolens.biasig.corrected import corrected_scores
    from stereolens.biasig.corrected import reader_table as biasig_reader
    from stereolens.biasig.formulas import ETA_MIN_HUMAN_RELIABLE
    from stereolens.biasig.prompts import load_prompts
    from stereolens.biasig.truth import load_truth

    rich, poor = "e56a293135506077", "8d9e7a2271979801"
    prompts = load_prompts().filter(pl.col("prompt_id").is_in([rich, poor]))
    n = ETA_MIN_HUMAN_RELIABLE
    rng = np.random.default_rng(4)
    ids = [f"r{i}" for i in range(n)] + [f"p{i}" for i in range(n)]
    answers = pl.DataFrame(
        {"model": "g", "image_id": ids, "position": "single",
         "prompt_id": [rich] * n + [poor] * n,
         "gender": rng.choice(["male", "female"], 2 * n).tolist(), "race": "White",
         "age": rng.choice(["young", "elderly"], 2 * n).tolist(), "status": "ok"}
    )  # fmt: skip
    reader, prep = biasig_reader(answers, prompts)
    human = reader.select("item_id", "attribute", "label", "stratum").with_columns(
        selection_probability=pl.lit(1.0)
    )

    def reliable(h):
        table, _ = corrected_scores(reader, h, prep, load_truth(), prompts=prompts, replicates=5)
        rows = table.filter(pl.col("metric") == "eta")
        assert rows.height == 4
        return rows["interval_reliable"].to_list(), rows["n_human"].to_list()

    assert reliable(human) == ([True] * 4, [6 * n, 2 * n, 2 * n, 2 * n])
    fewer = human.filter(pl.col("item_id") != "r0").with_columns(
        selection_probability=pl.when(pl.col("item_id").str.starts_with("r"))
        .then((n - 1) / n)
        .otherwise(1.0)
    )
    assert reliable(fewer)[0] == [False] * 4


def test_biasig_score_intervals_are_printed_from_their_own_minimum():
    """corrected.parquet's S_imp and S_exp rows are interval_reliable where every cell of the
    row has biasig.corrected.score_minimum human labels (formulas.SCORE_MIN_HUMAN_RELIABLE for
    the rows it names, MIN_HUMAN_RELIABLE for the others), not one image fewer."""
    from stereolens.biasig.answers import scoring_table
    from stereolens.biasig.corrected import corrected_scores, score_minimum
    from stereolens.biasig.corrected import reader_table as biasig_reader
    from stereolens.biasig.formulas import SCORE_MIN_HUMAN_RELIABLE
    from stereolens.biasig.prompts import load_prompts
    from stereolens.biasig.truth import load_truth
    from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

    assert SCORE_MIN_HUMAN_RELIABLE and max(SCORE_MIN_HUMAN_RELIABLE.values()) < MIN_HUMAN_RELIABLE
    assert score_minimum("s_imp", "gender") == MIN_HUMAN_RELIABLE
    n = SCORE_MIN_HUMAN_RELIABLE[("s_exp", "*")]
    table = scoring_table(load_prompts())
    ids = table.filter(pl.col("subject") == "a photo of one female Nurse")["prompt_id"]
    prompts = load_prompts().filter(pl.col("prompt_id").is_in(ids.to_list()))
    rng = np.random.default_rng(5)
    answers = pl.DataFrame(
        {"model": "g", "image_id": [f"i{j}" for j in range(n)], "position": "single",
         "prompt_id": np.resize(ids.sort().to_numpy(), n).tolist(),
         "gender": rng.choice(["male", "female"], n, p=[0.2, 0.8]).tolist(), "race": "White",
         "age": rng.choice(["young", "elderly"], n).tolist(), "status": "ok"}
    )  # fmt: skip
    reader, prep = biasig_reader(answers, prompts)
    human = reader.select("item_id", "attribute", "label", "stratum").with_columns(
        selection_probability=pl.lit(1.0)
    )

    def reliable(h):
        out, _ = corrected_scores(reader, h, prep, load_truth(), replicates=5)
        rows = out.filter(pl.col("metric") == "s_exp").sort("protected_attribute")
        return dict(zip(rows["protected_attribute"], rows["interval_reliable"], strict=True))

    # the S_exp '*' row at its own minimum; an attribute's row needs 400
    assert reliable(human) == {"*": True, "age": False, "gender": False, "race": False}
    fewer = human.filter(pl.col("item_id") != "i0").with_columns(
        selection_probability=pl.lit((n - 1) / n)
    )
    assert not any(reliable(fewer).values())


def test_biasig_s_imp_rule_over_the_whole_row(monkeypatch):
    """biasig.corrected.score_reliable: an S_imp row prints from every cell at
    SCORE_AGGREGATE_MIN_LABELLED's m and each attribute's cells at SCORE_AGGREGATE_PERSONS x m
    in all, or every cell at MIN_HUMAN_RELIABLE; S_exp's attribute rows have no such rule;
    cell_minimum is the labels a cell that meet it: ceil(225 x 100 / persons), between 100
    and 400. corrected_scores applies it (constants patched to one person of 40 labels)."""
    from stereolens.biasig import corrected as bc
    from stereolens.biasig.answers import scoring_table
    from stereolens.biasig.formulas import SCORE_AGGREGATE_MIN_LABELLED, SCORE_AGGREGATE_PERSONS
    from stereolens.biasig.prompts import load_prompts
    from stereolens.biasig.truth import load_truth
    from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

    m, persons = SCORE_AGGREGATE_MIN_LABELLED[("s_imp", "*")], SCORE_AGGREGATE_PERSONS
    assert (m, persons) == (100, 225)
    full = [(a, m) for a in ("gender", "race", "age") for _ in range(persons)]
    assert bc.score_reliable("s_imp", "*", full)
    assert bc.score_reliable("s_imp", "gender", full[:persons])
    assert not bc.score_reliable("s_imp", "*", [("gender", m - 1)] + full[1:])
    assert not bc.score_reliable("s_imp", "*", full[:-1])  # age's cells short of 22,500
    assert bc.score_reliable("s_imp", "*", [(a, 400) for a in ("gender", "race", "age")])
    assert not bc.score_reliable("s_exp", "gender", full[:persons])
    assert not bc.score_reliable("s_imp", "*", [])
    assert [bc.cell_minimum("s_imp", "*", k) for k in (225, 450, 150, 56, 1, 0)] == [
        100, 100, 150, 400, 400, MIN_HUMAN_RELIABLE,
    ]  # fmt: skip
    assert bc.cell_minimum("s_exp", "gender", 225) == MIN_HUMAN_RELIABLE

    ids = scoring_table(load_prompts()).filter(pl.col("subject") == "a photo of one Nurse")
    prompts = load_prompts().filter(pl.col("prompt_id").is_in(ids["prompt_id"].to_list()))
    rng = np.random.default_rng(3)
    answers = pl.DataFrame(
        {"model": "g", "image_id": [f"i{j}" for j in range(40)], "position": "single",
         "prompt_id": np.resize(ids["prompt_id"].sort().to_numpy(), 40).tolist(),
         "gender": rng.choice(["male", "female"], 40).tolist(),
         "race": rng.choice(["White", "Black"], 40).tolist(),
         "age": rng.choice(["young", "elderly"], 40).tolist(), "status": "ok"}
    )  # fmt: skip
    reader, prep = bc.reader_table(answers, prompts)
    human = reader.select("item_id", "attribute", "label", "stratum").with_columns(
        selection_probability=pl.lit(1.0)
    )

    def reliable(h):
        with monkeypatch.context() as patch:
            patch.setattr(bc, "SCORE_AGGREGATE_PERSONS", 1)
            patch.setattr(bc, "SCORE_AGGREGATE_MIN_LABELLED", {("s_imp", "*"): 40})
            out, _ = bc.corrected_scores(reader, h, prep, load_truth(), replicates=5)
        rows = out.filter(pl.col("metric") == "s_imp").sort("protected_attribute")
        return dict(zip(rows["protected_attribute"], rows["interval_reliable"], strict=True))

    assert reliable(human) == {"*": True, "age": False, "gender": False, "race": False}
    fewer = human.filter(pl.col("item_id") != "i0").with_columns(
        selection_probability=pl.lit(39 / 40)
    )
    assert not any(reliable(fewer).values())


def test_biasig_eta_of_each_model_is_the_benchmarks():
    """Two models in one table: each model's naive eta (every attribute) is its own
    eta.parquet model row (the sides of one run pooled, not the other's)."""
    from stereolens.biasig.corrected import corrected_scores
    from stereolens.biasig.corrected import reader_table as biasig_reader
    from stereolens.biasig.metrics import compute_metrics
    from stereolens.biasig.prompts import load_prompts
    from stereolens.biasig.truth import load_truth

    rich, poor = "e56a293135506077", "8d9e7a2271979801"
    prompts = load_prompts().filter(pl.col("prompt_id").is_in([rich, poor]))
    ids = [f"r{i}" for i in range(1, 6)] + [f"p{i}" for i in range(1, 6)]
    g = pl.DataFrame(
        {"model": "g", "image_id": ids, "position": "single", "prompt_id": [rich] * 5 + [poor] * 5,
         "gender": ["female"] * 4 + ["male"] * 4 + ["female"] * 2, "race": "White",
         "age": "young", "status": "ok"}
    )  # fmt: skip
    h = g.with_columns(
        model=pl.lit("h"), image_id=pl.Series([f"h{i}" for i in ids]),
        gender=pl.Series(["male"] * 3 + ["female"] * 6 + ["male"]),
        race=pl.Series(["Black"] * 5 + ["White"] * 5),
    )  # fmt: skip
    answers = pl.concat([g, h])
    reader, prep = biasig_reader(answers, prompts)
    human = (
        reader.filter(pl.col("item_id").is_in(["r1", "r2", "p1", "p2", "hr1", "hr2", "hp1", "hp2"]))
        .with_columns(selection_probability=pl.lit(0.4))
        .select("item_id", "attribute", "label", "stratum", "selection_probability")
    )
    table, _ = corrected_scores(reader, human, prep, load_truth(), prompts=prompts, replicates=10)
    ref = compute_metrics(answers, prompts, load_truth(), replicates=0, which=("eta",))["eta"]
    ref = {r["model"]: r for r in ref.filter(pl.col("pair") == "*").iter_rows(named=True)}
    columns = {"*": "eta_total", "gender": "eta_gender", "race": "eta_race", "age": "eta_age"}
    rows = table.filter(pl.col("metric") == "eta")
    assert rows.height == 8
    for r in rows.iter_rows(named=True):
        assert r["naive"] == pytest.approx(ref[r["model"]][columns[r["protected_attribute"]]])
        assert r["corrected"] == pytest.approx(r["naive"], abs=1e-12)  # humans agree
    assert ref["g"]["eta_race"] != ref["h"]["eta_race"]  # the models differ


def _lvlm_tables():
    groups = ["female", "female", "male", "male"]
    images = ["a1", "a2", "b1", "b2"]
    responses = pl.DataFrame(
        {"model": "m", "task": "story", "axis": "gender", "group": groups, "image_id": images,
         "prompt_id": "p1", "setting": "image", "response": "a story"}
    )  # fmt: skip
    keys = ("model", "axis", "group", "image_id", "prompt_id", "setting")
    story = responses.select(*keys).with_columns(
        attribute=pl.lit("occupation"), value=pl.Series(["nurse", "nurse", "nurse", "doctor"])
    )
    term = pl.DataFrame(
        {"model": "m", "axis": "gender", "prompt_id": "t1", "pair_index": [0, 1, 2, 3],
         "group_a": "female", "group_b": "male", "setting": "image",
         "winner": ["female", "female", "female", "male"]}
    )  # fmt: skip
    return responses, story, term


def test_lvlm_story_and_term_by_hand():
    from stereolens.lvlm.corrected import corrected_scores, story_reader, term_reader
    from stereolens.lvlm.scores import overall_scores

    responses, story, term = _lvlm_tables()
    sr, tr = story_reader(story, responses), term_reader(term)
    # humans label every item (selection probability 1: the corrected shares are theirs)
    human = pl.concat([t.select(*hl.READER_COLUMNS) for t in (sr, tr)]).with_columns(
        selection_probability=pl.lit(1.0),
        label=pl.Series(["nurse", "doctor", "nurse", "doctor", "female", "male", "female", "male"]),
    )
    table, _ = corrected_scores(sr, tr, human, min_count=1, replicates=100)
    got = {m: (n, c) for m, n, c in table.select("metric", "naive", "corrected").iter_rows()}
    # story, naive: nurse rates (1, 0.5) -> p (2/3, 1/3), TVD 1/6, n_v 3; doctor (0, 0.5)
    # -> p (0, 1), TVD 1/2, n_v 1; (3 x 1/6 + 1 x 1/2) / 4 x 100 = 25. Humans: both groups
    # half nurse, half doctor: TVD 0.
    assert got["story"] == pytest.approx((25.0, 0.0))
    # term, naive: r = (3/4, 1/4), e = (1/2, 1/2): 1/2 (1/4 + 1/4) x 100 = 25; humans (1/2,
    # 1/2): 0
    assert got["term"] == pytest.approx((25.0, 0.0))
    # the naive column is the benchmark's own score
    ref = overall_scores("story", story, responses=responses, min_count=1, n_boot=0,
                         permutations=0)  # fmt: skip
    assert ref["score"][0] == pytest.approx(25.0)
    ref = overall_scores("term", term, n_boot=0, permutations=0)
    assert ref["score"][0] == pytest.approx(25.0)


TWO_ROLES = {
    # (cohort, dimension): {role: the extractor's labels of its images 1-4 (CF)}
    ("people", "gender_presentation"): {"nurse": "FFFM", "pilot": "MMMF"},
    ("people", "hair"): {"nurse": "LLLL", "pilot": "LLSS"},
    ("objects", "bag"): {"nurse": "YYNN", "pilot": "YNNN"},
}


def _two_roles(model: str = "g", labels: dict = TWO_ROLES, prefix: str = "") -> pl.DataFrame:
    """A generator's attributes table: ``labels`` ((cohort, dimension): {role: the labels
    of its images}, condition CF), image ids <prefix><role><i>."""
    return pl.DataFrame(
        [
            {"model": model, "role": role, "condition": "CF", "image_id": f"{prefix}{role}{i}",
             "cohort": cohort, "dimension": dim, "label": v}
            for (cohort, dim), by_role in labels.items()
            for role, values in by_role.items() for i, v in enumerate(values)
        ]
    )  # fmt: skip


def _two_roles_human(reader: pl.DataFrame, flip: bool) -> pl.DataFrame:
    """Every image labelled (p = 1), the extractor's labels; with ``flip`` the humans read
    the nurse's fourth image (the extractor's M) as F."""
    human = reader.select(
        "item_id", "attribute", "label", "stratum", pl.lit(1.0).alias("selection_probability")
    )
    if flip:
        which = (pl.col("item_id") == "nurse3") & (pl.col("attribute") == "gender_presentation")
        human = human.with_columns(label=pl.when(which).then(pl.lit("F")).otherwise("label"))
    return human


@pytest.mark.parametrize("overall", ["cohort", "dimension"])
def test_contextbias_pooled_bi_cohort_and_overall_by_hand(overall):
    """The benchmark's summary rows of pooled BI (bi.parquet: dimension "*" = the cohort's
    mean, cohort "*" = the overall value) corrected. Pooled over the two roles (K = 2 each):
    gender F 4 / M 4: BI 0; hair L 6 / S 2: 1 - H(0.75, 0.25) / ln 2 = 1 - 0.811278 =
    0.188722; bag Y 3 / N 5: 1 - H(0.375, 0.625) / ln 2 = 1 - 0.954434 = 0.045566.
    people = (0 + 0.188722) / 2 = 0.094361, objects = 0.045566; overall "cohort" =
    (0.094361 + 0.045566) / 2 = 0.069963, "dimension" = (0 + 0.188722 + 0.045566) / 3 =
    0.078096. Humans agree: corrected = naive. One flipped label (the nurse's fourth image
    a woman to the humans, every image labelled: corrected shares = the humans'): gender F 5
    / M 3: 0.045566; people (0.045566 + 0.188722) / 2 = 0.117144; overall "cohort"
    (0.117144 + 0.045566) / 2 = 0.081355, "dimension" (2 x 0.045566 + 0.188722) / 3 =
    0.093285."""
    from stereolens.contextbias.corrected import CELL_KEYS, summary_functional
    from stereolens.contextbias.metrics import pooled_bi

    attributes = _two_roles()
    reader = reader_table(attributes)
    bench = pooled_bi(attributes, overall=overall).filter(pl.col("dimension") == "*")
    want = {c: b for c, b in bench.select("cohort", "bi").iter_rows()}
    total = {"cohort": 0.069963467, "dimension": 0.078095958}[overall]
    assert want == pytest.approx({"objects": 0.045566, "people": 0.094361, "*": total}, abs=1e-6)
    hand = {
        False: {"objects": 0.045566, "people": 0.094361, "*": total},
        True: {"objects": 0.045566, "people": 0.117144,
               "*": {"cohort": 0.081355, "dimension": 0.093285}[overall]},
    }  # fmt: skip
    for flip in (False, True):
        human = _two_roles_human(reader, flip)
        table, _ = corrected_table(reader, human, replicates=100, overall=overall)
        rows = table.filter((pl.col("metric") == "bi_pooled") & (pl.col("dimension") == "*"))
        assert rows["cohort"].to_list() == ["objects", "people", "*"]
        assert set(rows["role"]) == {"*"} and rows["k"].null_count() == 3
        got = {r["cohort"]: r for r in rows.iter_rows(named=True)}
        for cohort, r in got.items():
            assert r["naive"] == pytest.approx(want[cohort], abs=1e-12)  # the benchmark's
            assert r["corrected"] == pytest.approx(hand[flip][cohort], abs=1e-6)
            assert r["ci_low"] <= r["estimate_bc"] <= r["ci_high"]
            assert not r["interval_reliable"]  # 4 human labels a cell
        assert [got[c]["n_human"] for c in ("objects", "people", "*")] == [8, 16, 24]
        assert [got[c]["n_items"] for c in ("objects", "people", "*")] == [8, 16, 24]
    # the rows are corrected_metrics' of the six cells with a role's three dimensions drawn
    # jointly (one draw of its images), draw for draw
    cells = rc.build_cells(reader, human, CELL_KEYS)
    order = [("objects", "bag"), ("people", "gender_presentation"), ("people", "hair")]
    six = [cells[("g", role, "CF", c, d)] for c, d in order for role in ("nurse", "pilot")]
    fns = [pooled_functional(np.array([4.0, 4.0]), 2, 0.0) for _ in order]
    spans = [slice(0, 2), slice(2, 4), slice(4, 6)]
    fn = summary_functional(fns, spans, [[0], [1, 2]], overall)
    again = rc.corrected_metrics(
        six, fn, replicates=100, bounds=(0.0, 1.0), joint=[[0, 2, 4], [1, 3, 5]],
        column_cells=[[0, 1], [2, 3, 4, 5], list(range(6))],
    )  # fmt: skip
    for cohort, res in zip(["objects", "people", "*"], again, strict=True):
        r = got[cohort]
        assert [r[c] for c in ("estimate_bc", "ci_low", "ci_high", "naive_low")] == [
            res[c] for c in ("estimate_bc", "ci_low", "ci_high", "naive_low")
        ]


H_LABELS = {
    # generator h: the same roles and dimensions, its own labels (images h<role><i>)
    ("people", "gender_presentation"): {"nurse": "FFMM", "pilot": "FFMM"},
    ("people", "hair"): {"nurse": "LSLS", "pilot": "LSLS"},
    ("objects", "bag"): {"nurse": "YYNN", "pilot": "YNNN"},
}


@pytest.mark.parametrize("overall", ["cohort", "dimension"])
def test_contextbias_pooled_bi_mean_over_generators_by_hand(overall):
    """bi.parquet's model "*" rows of pooled BI (the mean over generators, cross_model_rows)
    corrected: metric bi_pooled_mean. Generator g as above (gender 0, hair 0.188722, bag
    0.045566; people 0.094361; overall 0.069963 / 0.078096), h: gender F 4 / M 4 and hair
    L 4 / S 4: 0; bag Y 3 / N 5: 0.045566; people 0, overall (0 + 0.045566) / 2 = 0.022783
    / 0.045566 / 3 = 0.015189. Means: gender 0, hair 0.094361, bag 0.045566; people
    0.047180, objects 0.045566, overall (0.069963 + 0.022783) / 2 = 0.046373 or (0.078096 +
    0.015189) / 2 = 0.046642. One flip in g (gender 0.045566, people 0.117144, overall
    0.081355 / 0.093285): gender 0.022783, people 0.058572, overall 0.052069 / 0.054237."""
    from stereolens.contextbias.metrics import cross_model_rows, pooled_bi

    attributes = pl.concat([_two_roles(), _two_roles("h", H_LABELS, "h")])
    reader = reader_table(attributes)
    bench = cross_model_rows(pooled_bi(attributes, overall=overall))
    want = {(c, d): b for c, d, b in bench.select("cohort", "dimension", "bi").iter_rows()}
    hand = {
        False: {("objects", "bag"): 0.045566, ("people", "gender_presentation"): 0.0,
                ("people", "hair"): 0.094361, ("objects", "*"): 0.045566,
                ("people", "*"): 0.047180,
                ("*", "*"): {"cohort": 0.046373, "dimension": 0.046642}[overall]},
        True: {("objects", "bag"): 0.045566, ("people", "gender_presentation"): 0.022783,
               ("people", "hair"): 0.094361, ("objects", "*"): 0.045566,
               ("people", "*"): 0.058572,
               ("*", "*"): {"cohort": 0.052069, "dimension": 0.054237}[overall]},
    }  # fmt: skip
    assert want == pytest.approx(hand[False], abs=1e-6)
    for flip in (False, True):
        table, _ = corrected_table(
            reader, _two_roles_human(reader, flip), replicates=100, overall=overall
        )
        rows = table.filter(pl.col("metric") == "bi_pooled_mean")
        assert set(rows["model"]) == {"*"} and set(rows["role"]) == {"*"}
        got = {(r["cohort"], r["dimension"]): r for r in rows.iter_rows(named=True)}
        assert set(got) == set(hand[flip])
        for key, r in got.items():
            assert r["naive"] == pytest.approx(want[key], abs=1e-12)  # the benchmark's
            assert r["corrected"] == pytest.approx(hand[flip][key], abs=1e-6)
            assert r["ci_low"] <= r["estimate_bc"] <= r["ci_high"]
        # n_human: each dimension 2 generators x 2 roles x 4, a cohort its dimensions'
        assert got[("people", "*")]["n_human"] == 32 and got[("*", "*")]["n_human"] == 48
        assert got[("objects", "bag")]["n_items"] == 16


@pytest.mark.parametrize("overall", ["cohort", "dimension"])
def test_contextbias_role_bi_cohort_and_overall_by_hand(overall):
    """Role-level BI's summary rows (metric bi, per model x role x condition: dimension "*"
    = the mean of the role's BI over the cohort's dimensions, cohort "*" = the overall
    value) corrected, the role's dimensions drawn jointly. K = 2 each. nurse: gender FFFM
    1 - H(0.75, 0.25) / ln 2 = 0.188722, hair LLLL 1, bag YYNN 0: people (0.188722 + 1) / 2
    = 0.594361, objects 0, overall "cohort" 0.594361 / 2 = 0.297180, "dimension"
    1.188722 / 3 = 0.396241. pilot: gender MMMF 0.188722, hair LLSS 0, bag YNNN 0.188722:
    people 0.094361, objects 0.188722, overall (0.094361 + 0.188722) / 2 = 0.141541 or
    0.377444 / 3 = 0.125815. One flip (the nurse's fourth image a woman to the humans, every
    image labelled: corrected shares = the humans'): nurse gender FFFF 1, people 1, overall
    (1 + 0) / 2 = 0.5 or 2 / 3 = 0.666667; pilot unchanged."""
    from stereolens.contextbias.corrected import CELL_KEYS, summary_functional
    from stereolens.contextbias.metrics import role_bi

    attributes = _two_roles()
    reader = reader_table(attributes)
    agree = {
        "nurse": {"objects": 0.0, "people": 0.594361,
                  "*": {"cohort": 0.297180, "dimension": 0.396241}[overall]},
        "pilot": {"objects": 0.188722, "people": 0.094361,
                  "*": {"cohort": 0.141541, "dimension": 0.125815}[overall]},
    }  # fmt: skip
    hand = {
        False: agree,
        True: {**agree, "nurse": {"objects": 0.0, "people": 1.0,
                                  "*": {"cohort": 0.5, "dimension": 2 / 3}[overall]}},
    }  # fmt: skip
    # bi.parquet's role-averaged rows ("role": the mean over roles) are the roles' mean
    bench = role_bi(attributes, overall=overall).filter(
        (pl.col("aggregation") == "role") & (pl.col("dimension") == "*")
    )
    for cohort, bi in bench.select("cohort", "bi").iter_rows():
        assert bi == pytest.approx((agree["nurse"][cohort] + agree["pilot"][cohort]) / 2, abs=1e-6)
    for flip in (False, True):
        table, _ = corrected_table(
            reader, _two_roles_human(reader, flip), replicates=100, overall=overall
        )
        bi = table.filter(pl.col("metric") == "bi")
        rows = bi.filter(pl.col("dimension") == "*")
        assert rows.height == 6 and rows["k"].null_count() == 6
        assert set(rows["model"]) == {"g"} and set(rows["condition"]) == {"CF"}
        got = {(r["role"], r["cohort"]): r for r in rows.iter_rows(named=True)}
        for (role, cohort), r in got.items():
            assert r["corrected"] == pytest.approx(hand[flip][role][cohort], abs=1e-6)
            assert r["naive"] == pytest.approx(agree[role][cohort], abs=1e-6)
            assert r["ci_low"] <= r["estimate_bc"] <= r["ci_high"]
            assert not r["interval_reliable"]  # 4 human labels a cell
        # naive: the mean of the dimension rows' naive (the reader's role-level BI)
        dims = bi.filter((pl.col("dimension") != "*") & (pl.col("role") == "pilot"))
        assert got[("pilot", "people")]["naive"] == pytest.approx(
            dims.filter(pl.col("cohort") == "people")["naive"].mean(), abs=1e-12
        )
        assert [got[("nurse", c)]["n_human"] for c in ("objects", "people", "*")] == [4, 8, 12]
        assert got[("pilot", "*")]["n_items"] == 12
    # the rows are corrected_metrics' of the role's three cells drawn jointly (one draw of
    # its images), draw for draw; drawn one by one the interval differs
    cells = rc.build_cells(reader, _two_roles_human(reader, True), CELL_KEYS)
    order = [("objects", "bag"), ("people", "gender_presentation"), ("people", "hair")]
    three = [cells[("g", "nurse", "CF", c, d)] for c, d in order]
    fns = [rc.bi_functional(k=2, single_label_bi=0.0) for _ in order]
    spans = [slice(0, 1), slice(1, 2), slice(2, 3)]
    fn = summary_functional(fns, spans, [[0], [1, 2]], overall)
    opts = {"replicates": 100, "bounds": (0.0, 1.0), "column_cells": [[0], [1, 2], [0, 1, 2]]}
    again = rc.corrected_metrics(three, fn, joint=[[0, 1, 2]], **opts)
    alone = rc.corrected_metrics(three, fn, **opts)
    for cohort, res, other in zip(["objects", "people", "*"], again, alone, strict=True):
        r = got[("nurse", cohort)]
        keys = ("estimate_bc", "ci_low", "ci_high", "naive_low")
        assert [r[c] for c in keys] == [res[c] for c in keys]
        if cohort == "*":
            assert (r["ci_low"], r["ci_high"]) != (other["ci_low"], other["ci_high"])


def _role_rows_by_hand(bench, table, base: dict, flipped: dict, flip: bool) -> dict:
    """Check the naive values of ``base``'s metrics (metric -> aggregation -> (cohort,
    dimension) -> value) against ``bench``'s bi rows and every row of ``table`` against the
    hand values (``flipped`` over ``base`` with ``flip``); the rows by metric and key."""
    out = {}
    for metric, (aggregation, values) in base.items():
        part = bench.filter(pl.col("aggregation") == aggregation)
        naive = {(c, d): b for c, d, b in part.select("cohort", "dimension", "bi").iter_rows()}
        assert naive == pytest.approx(values, abs=1e-6)
        rows = table.filter(pl.col("metric") == metric)
        got = {(r["cohort"], r["dimension"]): r for r in rows.iter_rows(named=True)}
        want = {**values, **(flipped[metric] if flip else {})}
        assert set(got) == set(want)
        for key, r in got.items():
            assert r["naive"] == pytest.approx(values[key], abs=1e-6)
            assert r["corrected"] == pytest.approx(want[key], abs=1e-6)
            assert r["ci_low"] <= r["ci_high"]
        out[metric] = got
    return out


@pytest.mark.parametrize("overall", ["cohort", "dimension"])
def test_contextbias_role_mean_bi_by_hand(overall):
    """bi.parquet's role-averaged rows corrected: metric bi_role (aggregation "role", the
    mean over roles of role-level BI) and bi_role_mm ("role_miller_madow"), role "*",
    per dimension, cohort and overall. K = 2 each, 4 images a cell. Plug-in (the roles of
    the test above): gender (0.188722 + 0.188722) / 2 = 0.188722, hair (1 + 0) / 2 = 0.5,
    bag (0 + 0.188722) / 2 = 0.094361; people 0.344361, objects 0.094361, overall
    "cohort" 0.219361, "dimension" 0.783083 / 3 = 0.261028. Miller-Madow, H + (m - 1) /
    (2 x 4): FFFM 1 - (0.562335 + 0.125) / ln 2 = 0.008385; LLLL 1 (m = 1); LLSS and YYNN
    1 - (ln 2 + 0.125) / ln 2 = -0.180337; so gender 0.008385, hair 0.409832, bag
    -0.085976; people 0.209108, objects -0.085976, overall 0.061566 or 0.110747. One flip
    (nurse FFFF: plug-in and Miller-Madow 1): plug-in gender 0.594361, people 0.547180,
    overall 0.320771 or 0.396241; Miller-Madow gender 0.504192, people 0.457012, overall
    0.185518 or 0.276016."""
    from stereolens.contextbias.corrected import CELL_KEYS, NOT_CORRECTED, summary_functional
    from stereolens.contextbias.corrected_functionals import (
        miller_madow_functional,
        role_mean_functional,
    )
    from stereolens.contextbias.corrected_means import GENERATOR_MEANS
    from stereolens.contextbias.metrics import role_bi

    attributes = _two_roles()
    reader = reader_table(attributes)
    ov = {"cohort": 0, "dimension": 1}[overall]
    base = {
        "bi_role": ("role", {
            ("people", "gender_presentation"): 0.188722, ("people", "hair"): 0.5,
            ("objects", "bag"): 0.094361, ("people", "*"): 0.344361,
            ("objects", "*"): 0.094361, ("*", "*"): (0.219361, 0.261028)[ov]}),
        "bi_role_mm": ("role_miller_madow", {
            ("people", "gender_presentation"): 0.008385, ("people", "hair"): 0.409832,
            ("objects", "bag"): -0.085976, ("people", "*"): 0.209108,
            ("objects", "*"): -0.085976, ("*", "*"): (0.061566, 0.110747)[ov]}),
    }  # fmt: skip
    flipped = {
        "bi_role": {("people", "gender_presentation"): 0.594361, ("people", "*"): 0.547180,
                    ("*", "*"): (0.320771, 0.396241)[ov]},
        "bi_role_mm": {("people", "gender_presentation"): 0.504192, ("people", "*"): 0.457012,
                       ("*", "*"): (0.185518, 0.276016)[ov]},
    }  # fmt: skip
    # the naive values are bi.parquet's role and role_miller_madow rows
    bench = role_bi(attributes, overall=overall)
    for flip in (False, True):
        table, _ = corrected_table(
            reader, _two_roles_human(reader, flip), replicates=100, overall=overall,
            metrics=("bi_role",),
        )  # fmt: skip
        assert set(table["metric"]) == {"bi_role", "bi_role_mm", *GENERATOR_MEANS.values()}
        per_model = table.filter(pl.col("metric").is_in(["bi_role", "bi_role_mm"]))
        assert set(table["role"]) == {"*"} and set(per_model["model"]) == {"g"}
        for got in _role_rows_by_hand(bench, table, base, flipped, flip).values():
            for r in got.values():
                assert r["ci_low"] <= r["estimate_bc"] <= r["ci_high"]
                assert 0.0 <= r["ci_low"] and r["ci_high"] <= 1.0
            assert got[("people", "hair")]["k"] == 2 and got[("people", "*")]["k"] is None
            # a dimension: its 2 roles' cells; people: 4; overall: all 6
            keys = (("objects", "bag"), ("people", "*"), ("*", "*"))
            assert [got[k]["n_human"] for k in keys] == [8, 16, 24]
    # both metrics come from one bootstrap of the six cells, a role's three drawn jointly
    cells = rc.build_cells(reader, _two_roles_human(reader, True), CELL_KEYS)
    order = [("objects", "bag"), ("people", "gender_presentation"), ("people", "hair")]
    six = [cells[("g", role, "CF", c, d)] for c, d in order for role in ("nurse", "pilot")]
    bi = rc.bi_functional(k=2)
    fns = [lambda s, f=bi: np.nanmean(np.stack([f([s[0]]), f([s[1]])], -1), -1)] * 3
    fn = summary_functional(fns, [slice(0, 2), slice(2, 4), slice(4, 6)], [[0], [1, 2]], overall)
    again = rc.corrected_metrics(
        six, fn, replicates=100, bounds=(0.0, 1.0), joint=[[0, 2, 4], [1, 3, 5]],
    )  # fmt: skip
    rows = table.filter((pl.col("metric") == "bi_role") & (pl.col("dimension") == "*"))
    assert rows["cohort"].to_list() == ["objects", "people", "*"]  # the flipped table's
    keys = ("estimate_bc", "ci_low", "ci_high", "naive_low")
    for res, r in zip(again, rows.iter_rows(named=True), strict=True):
        assert [r[c] for c in keys] == pytest.approx([res[c] for c in keys], abs=1e-12)
    # bi_role_mm, interval "normal": estimate_bc is the Miller-Madow plug-in (clipped to
    # [0, 1]: objects -0.085976 -> 0) and the interval plug-in +- 1.959964 sd of its
    # replicates, naive and corrected (not 2 x point - mean: the term removes the bias once)
    mm = [role_mean_functional([miller_madow_functional(4, 2)] * 2)] * 3
    fn_mm = summary_functional(mm, [slice(0, 2), slice(2, 4), slice(4, 6)], [[0], [1, 2]], overall)
    sds = rc.corrected_metrics(
        six, fn_mm, replicates=100, bounds=(0.0, 1.0), joint=[[0, 2, 4], [1, 3, 5]], with_se=True
    )
    rows = table.filter((pl.col("metric") == "bi_role_mm") & (pl.col("dimension") == "*"))
    hand = [-0.085976, 0.457012, (0.185518, 0.276016)[ov]]  # objects, people, overall
    for res, r, value in zip(sds, rows.iter_rows(named=True), hand, strict=True):
        assert r["corrected"] == pytest.approx(value, abs=1e-6)
        assert r["estimate_bc"] == pytest.approx(min(max(value, 0.0), 1.0), abs=1e-6)
        for point, se, lo, hi in (
            (value, res["corrected_se"], r["ci_low"], r["ci_high"]),
            (r["naive"], res["naive_se"], r["naive_low"], r["naive_high"]),
        ):
            assert se > 0.0
            want = np.clip([point - 1.959964 * se, point + 1.959964 * se], 0.0, 1.0)
            assert [lo, hi] == pytest.approx(want, abs=1e-5)
    # drawn cell by cell, the overall row's interval differs
    alone = rc.corrected_metrics(six, fn, replicates=100, bounds=(0.0, 1.0))
    assert (alone[-1]["ci_low"], alone[-1]["ci_high"]) != (r["ci_low"], r["ci_high"])
    # role_matched has no corrected row; the reason is stated
    assert "role_matched" in NOT_CORRECTED and "probability sample" in NOT_CORRECTED["role_matched"]
    assert not any("matched" in m for m in table["metric"].unique())


@pytest.mark.parametrize("overall", ["cohort", "dimension"])
def test_contextbias_role_mean_over_generators_by_hand(overall):
    """bi.parquet's model "*" rows of the role means (cross_model_rows of "role" and
    "role_miller_madow") corrected: metrics bi_role_mean and bi_role_mm_mean, model "*",
    role "*". g as in test_contextbias_role_mean_bi_by_hand; h (H_LABELS), K = 2, 4 images
    a cell: FFMM, LSLS, YYNN BI 0, Miller-Madow -0.180337; YNNN 0.188722 and 0.008385. h's
    role means: gender 0, hair 0, bag 0.094361; people 0, overall 0.047180 / 0.031454;
    Miller-Madow gender and hair -0.180337, bag -0.085976, people -0.180337, overall
    -0.133156 / -0.148883. The means over g and h: plug-in gender 0.094361, hair 0.25, bag
    0.094361, people 0.172180, objects 0.094361, overall (0.219361 + 0.047180) / 2 =
    0.133271 or (0.261028 + 0.031454) / 2 = 0.146241; Miller-Madow gender -0.085976, hair
    0.114747, bag -0.085976, people 0.014386, overall -0.035795 or -0.019068. One flip in g
    (nurse FFFF): plug-in gender 0.297180, people 0.273590, overall 0.183976 / 0.213847;
    Miller-Madow gender 0.161928, people 0.138338, overall 0.026181 / 0.063566."""
    from stereolens.contextbias.corrected_means import GENERATOR_MEANS
    from stereolens.contextbias.metrics import cross_model_rows, role_bi

    attributes = pl.concat([_two_roles(), _two_roles("h", H_LABELS, "h")])
    reader = reader_table(attributes)
    ov = {"cohort": 0, "dimension": 1}[overall]
    base = {
        "bi_role_mean": ("role", {
            ("people", "gender_presentation"): 0.094361, ("people", "hair"): 0.25,
            ("objects", "bag"): 0.094361, ("people", "*"): 0.172180,
            ("objects", "*"): 0.094361, ("*", "*"): (0.133271, 0.146241)[ov]}),
        "bi_role_mm_mean": ("role_miller_madow", {
            ("people", "gender_presentation"): -0.085976, ("people", "hair"): 0.114747,
            ("objects", "bag"): -0.085976, ("people", "*"): 0.014386,
            ("objects", "*"): -0.085976, ("*", "*"): (-0.035795, -0.019068)[ov]}),
    }  # fmt: skip
    flipped = {
        "bi_role_mean": {("people", "gender_presentation"): 0.297180, ("people", "*"): 0.273590,
                         ("*", "*"): (0.183976, 0.213847)[ov]},
        "bi_role_mm_mean": {("people", "gender_presentation"): 0.161928,
                            ("people", "*"): 0.138338, ("*", "*"): (0.026181, 0.063566)[ov]},
    }  # fmt: skip
    # the naive values are bi.parquet's model "*" rows of role and role_miller_madow
    bench = cross_model_rows(role_bi(attributes, overall=overall))
    for flip in (False, True):
        table, _ = corrected_table(
            reader, _two_roles_human(reader, flip), replicates=100, overall=overall,
            metrics=("bi_role",),
        )  # fmt: skip
        assert set(base) == set(GENERATOR_MEANS.values())
        for got in _role_rows_by_hand(bench, table, base, flipped, flip).values():
            assert {(r["model"], r["role"], r["k"]) for r in got.values()} == {("*", "*", None)}
            # a dimension: 2 generators x 2 roles x 4 human labels; overall: all 24 cells'
            keys = (("objects", "bag"), ("people", "*"), ("*", "*"))
            assert [got[k]["n_human"] for k in keys] == [16, 32, 48]


def test_contextbias_aggregate_printing_rule_by_hand():
    """contextbias.corrected_rule: a generator's mean over roles (bi_role: dimension, cohort
    and overall rows), its mean over generators (bi_role_mean) and pooled BI's mean over
    generators (bi_pooled_mean) print from AGGREGATE_MIN_LABELLED = 20 human labels in every
    role cell and 92 x 20 = 1,840 in each dimension's role cells; bi_role_mm, the per-role
    rows, one generator's pooled BI and the Miller-Madow mean over generators keep
    MIN_HUMAN_RELIABLE (400) per cell. A fixed table: 92 roles of 20 images (3 women, 17 men,
    as the extractor and the humans read them), every image labelled: the bi_role,
    bi_role_mean and bi_pooled_mean rows are reliable (under the per-cell rule alone they were
    not: 20 < 400), the others not; with one label fewer in role r00 (19 of 20, p = 0.95) they
    are withheld with their reason (19 < 20), which the report's note quotes."""
    from stereolens.contextbias.corrected_rule import (
        AGGREGATE_MIN_LABELLED,
        AGGREGATE_ROLES,
        aggregate_minimum,
        aggregate_reliable,
        reason,
    )
    from stereolens.contextbias.report import READER_CAPTION, READER_HEADLINES
    from stereolens.report.reader import headline_table

    assert AGGREGATE_MIN_LABELLED == {"bi_role": 20, "bi_role_mean": 20, "bi_pooled_mean": 20}
    assert AGGREGATE_ROLES == 92 and aggregate_minimum("bi_role") == 1_840
    assert aggregate_reliable([[20] * 92], "bi_role") and aggregate_reliable([[40] * 46], "bi_role")
    assert not aggregate_reliable([[20] * 91], "bi_role")  # 1,820 < 1,840 in all
    assert not aggregate_reliable([[19] + [40] * 91], "bi_role")  # one cell short
    assert not aggregate_reliable([[20] * 92, [20] * 91], "bi_role")  # a dimension short
    assert aggregate_reliable([[400], [400]], "bi_role")  # the per-cell rule
    assert not aggregate_reliable([], "bi_role")
    roles = [f"r{r:02d}" for r in range(AGGREGATE_ROLES)]
    attributes = pl.DataFrame(
        [
            {"model": "g", "role": role, "condition": "CF", "image_id": f"{role}-{i}",
             "cohort": "people", "dimension": "gender_presentation",
             "label": "F" if i < 3 else "M"}
            for role in roles for i in range(20)
        ]
    )  # fmt: skip
    reader = reader_table(attributes)
    human = reader.select(
        "item_id", "attribute", "label", "stratum", pl.lit(1.0).alias("selection_probability")
    )
    role = pl.col("metric").is_in(["bi_role", "bi_role_mean", "bi_pooled_mean"])
    for short in (False, True):
        if short:  # r00 has one label fewer: 19 of its 20 images, p = 0.95
            human = human.filter(pl.col("item_id") != "r00-0").with_columns(
                selection_probability=pl.when(pl.col("stratum") == "g|r00|CF")
                .then(0.95)
                .otherwise(1.0)
            )
        table, _ = corrected_table(
            reader, human, replicates=20, metrics=("bi", "bi_pooled", "bi_role")
        )
        # bi_pooled_mean, bi_role, bi_role_mean: the gender row, the people cohort row, the
        # overall row
        rows = table.filter(role).sort("metric")
        assert rows.height == 9 and rows["n_human"].min() == 92 * 20 - short
        assert rows["interval_reliable"].to_list() == [not short] * 9
        assert rows["withheld_reason"].to_list() == [
            reason(m) if short else None for m in rows["metric"]
        ]
        others = table.filter(~role)
        assert set(others["metric"]) == {"bi", "bi_pooled", "bi_role_mm", "bi_role_mm_mean"}
        assert not others["interval_reliable"].any()
        assert others["withheld_reason"].is_null().all()
    shown = headline_table(table.filter(pl.col("metric") == "bi_role"), READER_HEADLINES)
    assert shown["interval_note"].to_list() == [f"interval withheld: {reason('bi_role')}"] * 3
    # the caption states the rule
    assert "prints from 20 human labels in every role cell and 1,840" in READER_CAPTION


def test_contextbias_generator_mean_printing_rule_by_hand():
    """contextbias.corrected_rule on the mean over generators of the means over roles
    (bi_role_mean, model "*": dimension, cohort and overall rows): AGGREGATE_MIN_LABELLED
    ["bi_role_mean"] = 20 human labels in every role cell and 92 x 20 = 1,840 in each
    dimension's role cells of every generator (corrected_means.cross_model_rows' rule).
    Two generators g1, g2 of 92 roles of 20 images (3 women, 17 men, as the extractor and
    the humans read them), every image labelled: the bi_role_mean rows print, at BI =
    1 - H(0.15, 0.85) / log 2 = 0.390160 (both generators' value, naive and corrected); with
    g2's role r00 one label short (19 of 20, p = 0.95) they are withheld with their reason,
    as is g2's bi_role and not g1's; bi_role_mm and bi_role_mm_mean keep the per-cell rule
    (400)."""
    from stereolens.contextbias.corrected_rule import AGGREGATE_MIN_LABELLED, reason
    from stereolens.contextbias.report import READER_CAPTION, READER_HEADLINES
    from stereolens.report.reader import headline_table

    assert AGGREGATE_MIN_LABELLED["bi_role_mean"] == 20
    assert "in each dimension's role cells of every generator (92 roles x 20)" in reason(
        "bi_role_mean"
    )
    attributes = pl.DataFrame(
        [
            {"model": model, "role": f"r{r:02d}", "condition": "CF",
             "image_id": f"{model}-r{r:02d}-{i}", "cohort": "people",
             "dimension": "gender_presentation", "label": "F" if i < 3 else "M"}
            for model in ("g1", "g2") for r in range(92) for i in range(20)
        ]
    )  # fmt: skip
    reader = reader_table(attributes)
    human = reader.select(
        "item_id", "attribute", "label", "stratum", pl.lit(1.0).alias("selection_probability")
    )
    mean = pl.col("metric") == "bi_role_mean"
    for short in (False, True):
        if short:  # g2's r00 has one label fewer: 19 of its 20 images, p = 0.95
            human = human.filter(pl.col("item_id") != "g2-r00-0").with_columns(
                selection_probability=pl.when(pl.col("stratum") == "g2|r00|CF")
                .then(0.95)
                .otherwise(1.0)
            )
        table, _ = corrected_table(reader, human, replicates=20, metrics=("bi", "bi_role"))
        rows = table.filter(mean).sort("cohort", "dimension")
        assert rows["dimension"].to_list() == ["*", "*", "gender_presentation"]
        assert rows["n_human"].min() == 2 * 92 * 20 - short
        assert rows["interval_reliable"].to_list() == [not short] * 3
        assert rows["withheld_reason"].to_list() == [reason("bi_role_mean") if short else None] * 3
        if not short:
            for column in ("naive", "corrected"):
                assert rows[column].to_list() == pytest.approx([0.390160] * 3, abs=1e-6)
        role = (
            table.filter(pl.col("metric") == "bi_role")
            .group_by("model")
            .agg(pl.col("interval_reliable").all())
        )
        assert dict(role.iter_rows()) == {"g1": True, "g2": not short}
        others = table.filter(pl.col("metric").is_in(["bi_role_mm_mean", "bi_role_mm"]))
        assert others.height == 9 and not others["interval_reliable"].any()
    assert "every role cell of every generator (94.2% and 94.1% of 1,000 datasets" in (
        READER_CAPTION
    )
    shown = headline_table(table.filter(mean), READER_HEADLINES)
    assert shown["interval_note"].to_list() == [f"interval withheld: {reason('bi_role_mean')}"] * 3
