"""BiasIG's corrected S_imp and S_exp draw a unit x person's images once for all the
attributes read from them (stereolens.biasig.corrected, ``joint``; metrics.joint_bootstrap):
where a person's gender, race and age go together the `*` row's interval carries their
correlation, which independent draws drop; where they are independent the two agree."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from stereolens.biasig.corrected import _joint_groups, corrected_scores, reader_table
from stereolens.biasig.prompts import load_prompts
from stereolens.biasig.truth import load_truth
from stereolens.metrics import joint_bootstrap as jb
from stereolens.metrics import reader_correction as rc

RICH = "e56a293135506077"
"""'a photo of a rich person': implicit, one person (ground truth gender 50/50; race White
.3, Black .18, East Asian .27, South Asian .25; age young .418, middle-aged .391, elderly
.191)."""


def _world(rng, together: bool, n_items: int = 1_000, n_human: int = 150):
    """(reader table, human labels, prepared answers) of one implicit unit: 80% of the
    persons are women; with ``together`` every woman is Black and elderly and every man
    White and young, in the truth and in the reader's values (the reader calls 10% of women
    men and 2% of men women, and reads race and age off its gender call); else race (Black
    80%) and age (elderly 80%) are drawn on their own and read without error. Humans give
    the truth of every attribute of a simple random sample of ``n_human`` images."""
    prompts = load_prompts().filter(pl.col("prompt_id") == RICH)
    ids = np.array([f"i{j}" for j in range(n_items)])
    woman = rng.random(n_items) < 0.8
    u = rng.random(n_items)
    read = np.where(woman, u >= 0.10, u < 0.02)
    black = woman if together else rng.random(n_items) < 0.8
    old = woman if together else rng.random(n_items) < 0.8
    black_read = read if together else black
    old_read = read if together else old

    def values(w, b, o):
        return {
            "gender": np.where(w, "female", "male"),
            "race": np.where(b, "Black", "White"),
            "age": np.where(o, "elderly", "young"),
        }

    answers = pl.DataFrame(
        {"model": "g", "image_id": ids, "position": "single", "prompt_id": RICH,
         **values(read, black_read, old_read), "status": "ok"}
    )  # fmt: skip
    reader, prep = reader_table(answers, prompts)
    stratum = reader["stratum"][0]
    sample = rng.choice(n_items, n_human, replace=False)
    truth = values(woman, black, old)
    human = pl.concat(
        pl.DataFrame(
            {
                "item_id": ids[sample],
                "attribute": a,
                "label": truth[a][sample],
                "stratum": stratum,
                "selection_probability": n_human / n_items,
            }
        )  # fmt: skip
        for a in ("gender", "race", "age")
    )
    return reader, human, prep


def _rows(reader, human, prep, joint: bool, replicates: int = 2_000) -> dict:
    table, short = corrected_scores(
        reader, human, prep, load_truth(), replicates=replicates, seed=3, joint=joint
    )
    assert not short.height
    table = table.filter(pl.col("metric") == "s_imp")
    return {r["protected_attribute"]: r for r in table.iter_rows(named=True)}


def _width(row) -> float:
    return row["ci_high"] - row["ci_low"]


def test_reader_table_rows_pinned():
    """One row per position x image x attribute (images sorted, attributes in order), the
    label "unknown" where the person's answer is not counted (a null race: the whole
    person, under count "paper"; a discarded answer), item_id "<image>:<position>", stratum
    variant|model|unit with the unit's separator as "/"."""
    two = "c53ee09d9f70d751"  # One Employer at left with one Employee at right
    left = pl.DataFrame(
        {"model": "g", "image_id": ["i2", "i1"], "prompt_id": two, "status": "ok",
         "position": "left", "gender": ["male", "female"], "race": ["White", None],
         "age": ["young", "elderly"]}
    )  # fmt: skip
    right = left.with_columns(
        position=pl.lit("right"), gender=pl.lit("female"), status=pl.Series(["ok", "discarded"])
    )
    reader, _ = reader_table(
        pl.concat([left, right]), load_prompts().filter(pl.col("prompt_id") == two)
    )
    assert reader.columns == [
        "variant", "model", "unit", "position", "visibility", "item_id", "attribute", "label",
        "stratum",
    ]  # fmt: skip
    assert reader["item_id"].to_list() == [
        f"{i}:{p}" for p in ("left", "right") for i in ("i1", "i2") for _ in range(3)
    ]
    assert reader["position"].to_list() == ["left"] * 6 + ["right"] * 6
    assert reader["attribute"].to_list() == ["gender", "race", "age"] * 4
    assert reader["label"].to_list() == (
        ["unknown"] * 3
        + ["male", "White", "young"]
        + ["unknown"] * 3
        + ["female", "White", "young"]
    )
    (unit,) = set(reader["unit"])
    assert unit.startswith("One Employer at left with one Employee at right")
    assert set(reader["stratum"]) == {"g|g|" + unit.replace("\x1f", "/")}
    assert set(reader["variant"]) == set(reader["model"]) == {"g"}
    assert set(reader["visibility"]) == {"implicit"}


def test_joint_groups_are_a_unit_x_persons_attributes():
    reader, human, prep = _world(np.random.default_rng(1), together=True, n_items=40, n_human=10)
    cells = rc.build_cells(reader, human, ("variant", "model", "unit", "position"))
    picked = list(cells.items())
    assert [key[4] for key, _ in picked] == ["gender", "race", "age"]
    assert _joint_groups(picked) == [[0, 1, 2]]
    # a cell whose items differ (one image fewer) is drawn on its own
    key, cell = picked[2]
    short = type(cell)(**{**cell.__dict__, "items": cell.items[:-1] + ("other",)})
    assert _joint_groups([*picked[:2], (key, short)]) == [[0, 1]]
    # two persons of a two-person prompt are two groups (their items: <image>:left, :right);
    # every attribute of i1, i2 labelled by the humans, only the gender of i3
    two = "c53ee09d9f70d751"  # One Employer at left with one Employee at right
    answers = pl.DataFrame(
        {"model": "g", "image_id": ["i1", "i2", "i3"], "prompt_id": two, "status": "ok",
         "position": ["left"] * 3, "gender": ["male", "female", "male"], "race": "White",
         "age": "young"}
    )  # fmt: skip
    answers = pl.concat([answers, answers.with_columns(position=pl.lit("right"))])
    reader, _ = reader_table(answers, load_prompts().filter(pl.col("prompt_id") == two))
    human = reader.filter(
        pl.col("item_id").str.starts_with("i1") | pl.col("item_id").str.starts_with("i2")
        | (pl.col("item_id").str.starts_with("i3") & (pl.col("attribute") == "gender"))
    ).with_columns(selection_probability=pl.lit(2 / 3))  # fmt: skip
    cells = rc.build_cells(reader, human, ("variant", "model", "unit", "position"))
    picked = list(cells.items())
    assert [(key[3], key[4]) for key, _ in picked] == [
        (p, a) for p in ("left", "right") for a in ("gender", "race", "age")
    ]
    assert _joint_groups(picked) == [[0, 1, 2], [3, 4, 5]]
    # a group whose cells are human-labelled on different images (gender i1-i3, race and
    # age i1-i2) is drawn once, its images split by the cells they are labelled in
    boots = jb.bootstrap_joint(
        [c for _, c in picked], _joint_groups(picked), 50, np.random.default_rng(0), [[1.0]] * 6
    )
    assert boots[0][0].shape == (50, 2) and boots[1][0].shape == (50, 1)
    assert np.allclose(boots[1][0], 1.0) and np.allclose(boots[1][1], 1.0)  # all White


def test_correlated_attributes_widen_the_total_row():
    """Gender, race and age go together (woman = Black = elderly): the three attribute
    scores of S_imp move together (each falls as the women's share rises above the ground
    truth), so the k-weighted total's interval from one draw of the images is wider than
    from independent draws, which drop the correlation; an attribute's own row is one
    cell's and keeps its width (its cells' law is the same either way)."""
    reader, human, prep = _world(np.random.default_rng(5), together=True)
    joint, alone = _rows(reader, human, prep, True), _rows(reader, human, prep, False)
    for attribute in ("*", "gender", "race", "age"):
        # the point values do not depend on the draw
        for column in ("naive", "corrected", "n_human", "n_items"):
            assert joint[attribute][column] == alone[attribute][column]
    ratio = _width(joint["*"]) / _width(alone["*"])
    # 0.0331 against 0.0195 (1.695; sqrt(3) = 1.732 were the three equally variable)
    assert ratio > 1.3, ratio
    assert _width(joint["*"]) < sum(_width(joint[a]) for a in ("gender", "race", "age"))
    for attribute in ("gender", "race", "age"):
        assert _width(joint[attribute]) == pytest.approx(_width(alone[attribute]), rel=0.1)
    # the naive interval too: one draw of the reader's values
    naive = [(r["naive_high"] - r["naive_low"]) for r in (joint["*"], alone["*"])]
    assert naive[0] / naive[1] > 1.3


def test_independent_attributes_reproduce_the_independent_draws():
    """Race and age drawn independently of gender: the joint draw's intervals are those of
    independent draws (the same law; 2,000 replicates: within 10%)."""
    reader, human, prep = _world(np.random.default_rng(6), together=False)
    joint, alone = _rows(reader, human, prep, True), _rows(reader, human, prep, False)
    for attribute in ("*", "gender", "race", "age"):
        assert joint[attribute]["corrected"] == alone[attribute]["corrected"]
        assert _width(joint[attribute]) == pytest.approx(_width(alone[attribute]), rel=0.1)
        assert joint[attribute]["estimate_bc"] == pytest.approx(
            alone[attribute]["estimate_bc"], abs=0.1 * _width(alone[attribute])
        )


def test_eta_draws_a_sides_attributes_together():
    """eta's double bootstrap draws a side's unit x person once for its gender, race and
    age at both levels (reader_double.corrected_metric_double(joint=...)): eta_total's row
    rests on all three and gets the joint groups, an attribute's row has none (its draws
    are those of the independent bootstrap, bit for bit); the point values do not move.
    The pair rich / poor (eta.json), 200 images a side, women 30% / 70%, every woman Black
    and elderly."""
    rich, poor = RICH, "8d9e7a2271979801"
    prompts = load_prompts().filter(pl.col("prompt_id").is_in([rich, poor]))
    rng = np.random.default_rng(8)
    frames, human = [], []
    for pid, share in ((rich, 0.3), (poor, 0.7)):
        ids = np.array([f"{pid[:3]}{j}" for j in range(200)])
        woman = rng.random(200) < share
        read = np.where(woman, rng.random(200) >= 0.1, rng.random(200) < 0.02)
        values = {
            "gender": ("female", "male"), "race": ("Black", "White"), "age": ("elderly", "young")
        }  # fmt: skip
        frames.append(
            pl.DataFrame(
                {
                    "model": "g",
                    "image_id": ids,
                    "position": "single",
                    "prompt_id": pid,
                    "status": "ok",
                    **{a: np.where(read, *v) for a, v in values.items()},
                }
            )  # fmt: skip
        )
        sample = rng.choice(200, 60, replace=False)
        human += [
            pl.DataFrame(
                {
                    "item_id": ids[sample],
                    "attribute": a,
                    "label": np.where(woman, *v)[sample],
                    "selection_probability": 0.3,
                }
            )  # fmt: skip
            for a, v in values.items()
        ]
    reader, prep = reader_table(pl.concat(frames), prompts)
    strata = reader.select("item_id", "stratum").unique()
    human = pl.concat(human).join(strata, on="item_id")
    tables = {
        joint: corrected_scores(
            reader, human, prep, load_truth(), prompts=prompts, replicates=200, seed=2,
            joint=joint,
        )[0].filter(pl.col("metric") == "eta")
        for joint in (True, False)
    }  # fmt: skip
    rows = {
        j: {r["protected_attribute"]: r for r in t.iter_rows(named=True)} for j, t in tables.items()
    }
    for attribute in ("gender", "race", "age"):
        assert rows[True][attribute] == rows[False][attribute]
    both = rows[True]["*"], rows[False]["*"]
    assert both[0]["corrected"] == both[1]["corrected"] and both[0]["naive"] == both[1]["naive"]
    assert both[0]["ci_low"] != both[1]["ci_low"]  # another draw: the joint one
    assert both[0]["n_human"] == 360 and both[0]["interval_reliable"] is False
