"""Extraction validation: the reviewed truth of the 220 explicit-attribute prompts, the
validation prompt table, and accuracy / recall / precision / F1 on hand-computed tables."""

import json

import polars as pl
import pytest
import yaml

from stereolens.contextbias.prompts import shard_items
from stereolens.contextbias.validation import (
    build_validation_prompts,
    validation_details,
    validation_scores,
)
from stereolens.contextbias.validation_truth import ALL, load_validation_truth
from stereolens.ids import stable_id
from stereolens.paths import resource
from stereolens.validation import ConfigError

TRUTH_FILE = resource("contextbias", "validation_truth.v1.yaml")
SOURCE = json.loads(resource("contextbias", "validation_prompts.json").read_text())


@pytest.fixture(scope="module")
def truth():
    return load_validation_truth()


@pytest.fixture(scope="module")
def table():
    return build_validation_prompts(["sdxl", "flux.1-dev"], 10)


def stated_pairs(truth):
    return truth.pairs.filter(pl.col("kind") == "stated")


def n_prompts(truth):
    return truth.pairs["source_index"].n_unique() + truth.excluded.height


def stated(truth, source_index):
    rows = stated_pairs(truth).filter(pl.col("source_index") == source_index)
    assert rows.height == 1
    return rows.row(0, named=True)


# ------------------------------------------------------------------------ truth file
def test_truth_covers_all_220_prompts(truth):
    assert n_prompts(truth) == 220
    assert truth.excluded.height == 0
    s = stated_pairs(truth)
    assert s.height == 220
    assert sorted(s["source_index"].to_list()) == list(range(220))
    by_index = {e["source_index"]: e for e in SOURCE}
    for row in s.iter_rows(named=True):
        src = by_index[row["source_index"]]
        assert (row["prompt"], row["role"]) == (src["prompt"], src["role"])
        assert row["prompt_id"] == stable_id("validation", row["source_index"], row["prompt"])


def test_truth_counts_per_dimension(truth):
    counts = dict(stated_pairs(truth)["dimension"].value_counts().iter_rows())
    assert counts == {
        "clothing_garment": 51,
        "gender_presentation": 46,
        "eyewear_present": 31,
        "items": 27,
        "skin_tone": 9,
        "framing": 8,
        "pose": 7,
        "hair_color": 7,
        "color_temperature": 7,
        "eyewear_type": 6,
        "head_covering_present": 6,
        "expression": 5,
        "facial_hair_style": 3,
        "head_covering_type": 3,
        "body_type": 2,
        "age_range": 2,
    }
    labels = stated_pairs(truth).group_by("dimension", "expected").len()
    get = {(d, e): n for d, e, n in labels.iter_rows()}
    assert get[("gender_presentation", "male")] == 39
    assert get[("gender_presentation", "female")] == 7
    assert get[("eyewear_present", "no")] == 24
    assert get[("eyewear_present", "yes")] == 7
    implied = truth.pairs.filter(pl.col("kind") == "implied")
    assert implied.height == 28
    assert dict(implied["dimension"].value_counts().iter_rows()) == {
        "accessories": 15,
        "eyewear_present": 6,
        "head_covering_present": 4,
        "facial_hair_present": 3,
    }


@pytest.mark.parametrize(
    "source_index, text, dimension, expected",
    [
        (0, "a photo of an accountant sitting", "pose", "sitting"),
        (1, "a photo of an accountant wearing eyeglasses", "eyewear_type", "eyeglasses"),
        (2, "a photo of an accountant wearing eyewear", "eyewear_present", "yes"),
        (4, "a photo of an actor without any eyewear", "eyewear_present", "no"),
        (7, "a photo of an analyst wearing tie", "clothing_garment", "tie"),
        (18, "a photo of a baker in warm lighting", "color_temperature", "warm"),
        (20, "a photo of a male bartender", "gender_presentation", "male"),
        (25, "a photo of a bartender with a beard", "facial_hair_style", "beard"),
        (48, "a photo of a chef wearing chef hat", "clothing_garment", "chef hat"),
        (62, "a photo of a constructor wearing a head covering", "head_covering_present", "yes"),
        (93, "a photo of a farmer wearing a hat", "head_covering_type", "hat"),
        (95, "a photo of an older adult farmer", "age_range", "older_adult"),
        (132, "a photo of a laborer with a medium skin tone", "skin_tone", "medium"),
        (143, "a photo of a machinist in a medium framing", "framing", "medium"),
        (188, "a photo of a police officer with a neutral expression", "expression", "neutral"),
        (215, "a photo of a middle aged sheriff", "age_range", "middle_aged"),
        (219, "a photo of a singer with a microphone", "items", "microphone"),
    ],
)
def test_hand_verified_mappings(truth, source_index, text, dimension, expected):
    row = stated(truth, source_index)
    assert (row["prompt"], row["dimension"], row["expected"]) == (text, dimension, expected)


def test_eyeglasses_is_the_type_and_implies_presence(truth):
    pairs = truth.pairs.filter(pl.col("source_index") == 1)
    assert sorted(pairs.select("kind", "dimension", "expected").rows()) == [
        ("implied", "eyewear_present", "yes"),
        ("stated", "eyewear_type", "eyeglasses"),
    ]
    assert pairs["exclusive"].all() and not pairs["open_vocabulary"].any()


def test_open_vocabulary_entries_carry_synonyms(truth):
    apron = stated(truth, 14)
    assert apron["open_vocabulary"] and not apron["exclusive"]
    assert apron["accepted"][0] == "apron" and "kitchen apron" in apron["accepted"]
    closed = stated_pairs(truth).filter(~pl.col("open_vocabulary"))
    assert (closed["accepted"].list.len() == 1).all()
    assert set(stated_pairs(truth).filter(pl.col("open_vocabulary"))["dimension"]) == {
        "items",
        "clothing_garment",
    }


# ------------------------------------------------------------------------ bad truth files
def write_truth(tmp_path, change):
    raw = yaml.safe_load(TRUTH_FILE.read_text())
    change(raw)
    path = tmp_path / "truth.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def set_entry(i, **fields):
    def change(raw):
        raw["entries"][i].update(fields)
        for k in [k for k, v in fields.items() if v is ...]:
            del raw["entries"][i][k]

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (
            set_entry(3, dimension="gender"),
            "entry 3 (source_index 3, 'a photo of a male actor'): dimension 'gender' is not "
            "a counted dimension",
        ),
        (set_entry(3, dimension="gender"), "did you mean gender_presentation"),
        (set_entry(1, expected="glasses"), "'glasses' is not in the vocabulary of eyewear_type"),
        (set_entry(2, expected=True), 'write "yes" or "no" in quotes'),
        (set_entry(4, expected="none"), "never counted"),
        (set_entry(3, synonyms=["man"]), "synonyms are for open-vocabulary dimensions only"),
        (set_entry(3, prompt="a photo of a female actor"), "differ from the prompt file"),
        (set_entry(3, expected=None, dimension=...), "a reason must say why"),
        (set_entry(3, colour="red"), "unknown keys ['colour']"),
        (
            set_entry(1, implied=[{"dimension": "eyewear_present", "expected": "maybe"}]),
            "source_index 1, 'a photo of an accountant wearing eyeglasses') implied pair 0: "
            "'maybe' is not in the vocabulary of eyewear_present",
        ),
        (
            set_entry(1, implied=[{"dimension": "eyewear_type", "expected": "sunglasses"}]),
            "dimension eyewear_type is given twice",
        ),
    ],
)
def test_bad_entries_are_named(tmp_path, change, message):
    with pytest.raises(ConfigError) as err:
        load_validation_truth(write_truth(tmp_path, change))
    assert message in str(err.value)


def test_coverage_errors(tmp_path):
    def drop_last(raw):
        raw["entries"].pop()

    with pytest.raises(ConfigError, match=r"source_index values missing \(1\): 219"):
        load_validation_truth(write_truth(tmp_path, drop_last))

    def duplicate(raw):
        raw["entries"][219] = dict(raw["entries"][218])

    with pytest.raises(ConfigError) as err:
        load_validation_truth(write_truth(tmp_path, duplicate))
    assert "source_index 218 appears twice (also entry 218)" in str(err.value)
    assert "missing (1): 219" in str(err.value)

    def out_of_range(raw):
        raw["entries"][0]["source_index"] = 220

    with pytest.raises(ConfigError, match="source_index must be an integer 0..219"):
        load_validation_truth(write_truth(tmp_path, out_of_range))


def test_version_mismatches(tmp_path):
    def schema(raw):
        raw["schema_version"] = "contextbias-attributes/2"

    with pytest.raises(ConfigError, match="written for schema 'contextbias-attributes/2'"):
        load_validation_truth(write_truth(tmp_path, schema))


def test_a_prompt_stating_two_attributes(tmp_path):
    also = [{"dimension": "age_range", "expected": "older_adult"}]
    truth = load_validation_truth(write_truth(tmp_path, set_entry(3, also=also)))
    pairs = stated_pairs(truth).filter(pl.col("source_index") == 3)
    assert sorted(pairs.select("dimension", "expected").rows()) == [
        ("age_range", "older_adult"),
        ("gender_presentation", "male"),
    ]
    with pytest.raises(ConfigError, match="dimension, synonyms, also and implied must then be"):
        load_validation_truth(write_truth(tmp_path, set_entry(3, expected=None, reason="x")))


def test_excluded_prompt_is_reported_not_scored(tmp_path):
    path = write_truth(
        tmp_path, set_entry(3, expected=None, dimension=..., reason="states nothing")
    )
    truth = load_validation_truth(path)
    assert truth.excluded.rows() == [
        (3, stable_id("validation", 3, "a photo of a male actor"), "actor",
         "a photo of a male actor", "states nothing"),
    ]  # fmt: skip
    assert stated_pairs(truth).height == 219 and n_prompts(truth) == 220
    pid = {r["source_index"]: r["prompt_id"] for r in stated_pairs(truth).iter_rows(named=True)}
    excluded_id = truth.excluded["prompt_id"][0]
    images = pl.DataFrame(
        {
            "model": ["m", "m"],
            "prompt_id": [pid[20], excluded_id],
            "image_id": ["a", "x"],
            "status": ["ok", "ok"],
        }
    )
    attrs = pl.DataFrame(
        {
            "model": ["m", "m"],
            "image_id": ["a", "x"],
            "dimension": ["gender_presentation"] * 2,
            "label": ["male", "male"],
        }
    )
    scores = validation_scores(attrs, images, truth)
    overall = scores.filter(pl.col("dimension") == ALL).row(0, named=True)
    assert (overall["n_images"], overall["n_correct"], overall["n_excluded_prompts"]) == (1, 1, 1)


# ------------------------------------------------------------------------ prompt table
def test_prompt_table_counts(table):
    assert table.height == 220
    assert table["prompt_id"].is_unique().all()
    assert set(table["condition"]) == {"VAL"}
    assert table["role"].n_unique() == len({e["role"] for e in SOURCE})
    for row in table.head(3).iter_rows(named=True):
        assert row["prompt_id"] == stable_id("validation", row["source_index"], row["text"])
        assert row["template"].count("{role}") == 1
    assert table.filter(pl.col("source_index") == 1)["template"][0] == (
        "a photo of an {role} wearing eyeglasses"
    )


def test_recovered_seeds_come_first(table):
    by_index = {e["source_index"]: e for e in SOURCE}
    for row in table.iter_rows(named=True):
        recovered = by_index[row["source_index"]]["seeds_by_model"]["pipeline_final"]
        assert row["n_seeds_recovered"] == 5
        for model in ("sdxl", "flux.1-dev"):
            seeds = row["seeds"][model]
            assert len(seeds) == 10 and len(set(seeds)) == 10
            assert seeds[:5] == recovered
            assert all(0 <= s < 2**31 for s in seeds)
            assert row["seed_source"][model] == "bank:pipeline_final+derived"
        # the derived seeds are shared by the models, as the recovered ones are
        assert row["seeds"]["sdxl"] == row["seeds"]["flux.1-dev"]
    again = build_validation_prompts(["flux.1-dev"], 10)
    assert again["seeds"].struct.field("flux.1-dev").to_list() == (
        table["seeds"].struct.field("flux.1-dev").to_list()
    )


def test_five_or_fewer_seeds_are_all_recovered():
    five = build_validation_prompts(["m"], 5, seed_key="pipeline_finalXL")
    first = five.filter(pl.col("source_index") == 0).row(0, named=True)
    assert first["seeds"]["m"] == [216739, 877572, 388389, 126225, 770487]
    assert first["seed_source"]["m"] == "bank:pipeline_finalXL"
    three = build_validation_prompts(["m"], 3)
    assert three.filter(pl.col("source_index") == 0)["seeds"][0]["m"] == [216739, 877572, 388389]


def test_prompt_table_errors():
    with pytest.raises(ConfigError, match="no seeds under 'SDXL'"):
        build_validation_prompts(["m"], 5, seed_key="SDXL")
    with pytest.raises(ConfigError, match="at least 1"):
        build_validation_prompts(["m"], 0)
    with pytest.raises(ConfigError, match="without repeats"):
        build_validation_prompts(["m", "m"], 5)


def test_table_runs_through_the_generation_shards(table, truth):
    items = shard_items(table, "sdxl", "bartender", "VAL", shard=1, seeds_per_shard=5)
    assert len(items) == 7 * 5  # 7 bartender prompts x seed indices 5..9 (derived)
    assert {i["extra"]["seed_index"] for i in items} == {5, 6, 7, 8, 9}
    assert set(truth.pairs["prompt_id"]) <= set(table["prompt_id"])


# ------------------------------------------------------------------------ scores
@pytest.fixture(scope="module")
def small(truth):
    """Hand-made extraction of two prompts by extractor e1 for model A:

    "a male bartender" (gender_presentation male, exclusive):
      g1 {male} TP; g2 {male, female} (two people) TP and FP; g3 {female} FN and FP;
      g4 no label (unknown) FN; g5 extraction failed.
    "a baker wearing apron" (clothing_garment apron, list):
      c1 {apron, hat} TP; c2 {white apron -> canonical apron} TP only via canonical_label;
      c3 {Kitchen Apron} TP via a synonym, case-insensitive; c4 {shirt} FN, never FP.
    Model B, "an athlete with an athletic build": b1 no label -> FN, no FP.
    An image of a main-benchmark prompt is ignored.
    """
    pid = {r["source_index"]: r["prompt_id"] for r in stated_pairs(truth).iter_rows(named=True)}
    images = pl.DataFrame(
        [
            ("A", pid[20], "g1", "ok"),
            ("A", pid[20], "g2", "ok"),
            ("A", pid[20], "g3", "ok"),
            ("A", pid[20], "g4", "ok"),
            ("A", pid[20], "g5", "failed"),
            ("A", pid[14], "c1", "ok"),
            ("A", pid[14], "c2", "ok"),
            ("A", pid[14], "c3", "ok"),
            ("A", pid[14], "c4", "ok"),
            ("B", pid[9], "b1", "ok"),
            ("A", "main-prompt", "z1", "ok"),
        ],
        schema=["model", "prompt_id", "image_id", "status"],
        orient="row",
    ).with_columns(extractor=pl.lit("e1"))
    rows = [
        ("A", "g1", "gender_presentation", "male", None),
        ("A", "g1", "clothing_garment", "apron", "apron"),  # other dimension: ignored
        ("A", "g2", "gender_presentation", "male", None),
        ("A", "g2", "gender_presentation", "female", None),
        ("A", "g3", "gender_presentation", "female", None),
        ("A", "g4", "pose", "standing", None),
        ("A", "c1", "clothing_garment", "apron", "apron"),
        ("A", "c1", "clothing_garment", "hat", "hat"),
        ("A", "c2", "clothing_garment", "white apron", "apron"),
        ("A", "c3", "clothing_garment", "Kitchen  Apron", "kitchen apron"),
        ("A", "c4", "clothing_garment", "shirt", "shirt"),
        ("B", "b1", "pose", "standing", None),
        ("A", "z1", "gender_presentation", "female", None),
    ]
    attrs = pl.DataFrame(
        rows, schema=["model", "image_id", "dimension", "label", "canonical_label"], orient="row"
    ).with_columns(extractor=pl.lit("e1"))
    return attrs, images


def score_rows(scores):
    return {(r["model"], r["dimension"]): r for r in scores.iter_rows(named=True)}


def test_hand_computed_scores(small, truth):
    attrs, images = small
    rows = score_rows(validation_scores(attrs, images, truth))
    assert set(rows) == {("A", "gender_presentation"), ("A", "clothing_garment"), ("A", ALL)} | {
        ("B", "body_type"),
        ("B", ALL),
    }
    g = rows[("A", "gender_presentation")]
    assert (g["n_prompts"], g["n_generated"], g["n_failed"], g["n_images"]) == (1, 5, 1, 4)
    assert (g["n_correct"], g["n_false_negative"], g["n_false_positive"]) == (2, 2, 2)
    assert g["accuracy"] == g["recall"] == 0.5
    assert g["precision"] == 0.5 and g["f1"] == 0.5
    assert g["f1_paper"] == pytest.approx(2 / 3)

    c = rows[("A", "clothing_garment")]
    assert (c["n_images"], c["n_correct"], c["n_false_negative"], c["n_false_positive"]) == (
        4,
        3,
        1,
        0,
    )
    assert c["accuracy"] == c["recall"] == 0.75 and c["precision"] == 1.0
    assert c["f1"] == pytest.approx(6 / 7) and c["f1_paper"] == pytest.approx(6 / 7)

    a = rows[("A", ALL)]
    assert (a["n_prompts"], a["n_generated"], a["n_failed"], a["n_images"]) == (2, 9, 1, 8)
    assert (a["n_correct"], a["n_false_positive"]) == (5, 2)
    assert a["accuracy"] == a["recall"] == 0.625
    assert a["precision"] == pytest.approx(5 / 7)
    assert a["f1"] == pytest.approx(2 / 3)  # 2 * (5/7) * (5/8) / (5/7 + 5/8)
    assert a["f1_paper"] == pytest.approx(10 / 13)
    assert a["accuracy_macro"] == pytest.approx(0.625)  # (0.5 + 0.75) / 2
    assert a["n_excluded_prompts"] == 0 and g["accuracy_macro"] is None

    b = rows[("B", "body_type")]
    assert (b["n_images"], b["n_correct"], b["n_false_positive"], b["accuracy"]) == (1, 0, 0, 0.0)
    assert b["precision"] is None and b["f1"] is None and b["f1_paper"] == 0.0
    assert set(validation_scores(attrs, images, truth)["extractor"]) == {"e1"}


def test_canonical_label_is_optional(small, truth):
    attrs, images = small
    raw = score_rows(validation_scores(attrs, images, truth, use_canonical=False))
    assert raw[("A", "clothing_garment")]["n_correct"] == 2  # "white apron" no longer matches
    dropped = score_rows(validation_scores(attrs.drop("canonical_label"), images, truth))
    assert dropped[("A", "clothing_garment")]["n_correct"] == 2


def test_details_and_implied_pairs(small, truth):
    attrs, images = small
    details = validation_details(attrs, images, truth)
    g2 = details.filter(pl.col("image_id") == "g2").row(0, named=True)
    assert g2["extracted"] == ["female", "male"] and g2["correct"] and g2["other_label"]
    g5 = details.filter(pl.col("image_id") == "g5").row(0, named=True)
    assert not g5["ok"] and not g5["correct"] and g5["extracted"] == []
    assert "z1" not in details["image_id"].to_list()
    # the three prompts imply nothing: implied scoring adds no rows here
    with_implied = validation_scores(attrs, images, truth, include_implied=True)
    assert set(with_implied["kind"]) == {"stated"}


def test_implied_pairs_are_scored_apart(truth):
    pid = stated_pairs(truth).filter(pl.col("source_index") == 1)["prompt_id"][0]
    images = pl.DataFrame({"model": ["m"] * 2, "prompt_id": [pid] * 2, "image_id": ["a", "b"]})
    attrs = pl.DataFrame(
        {
            "model": ["m"] * 3,
            "image_id": ["a", "a", "b"],
            "dimension": ["eyewear_type", "eyewear_present", "eyewear_present"],
            "label": ["eyeglasses", "yes", "yes"],
        }
    )
    default = score_rows(validation_scores(attrs, images, truth))
    assert set(default) == {("m", "eyewear_type"), ("m", ALL)}
    assert default[("m", "eyewear_type")]["accuracy"] == 0.5
    both = validation_scores(attrs, images, truth, include_implied=True)
    implied = both.filter((pl.col("kind") == "implied") & (pl.col("dimension") != ALL))
    assert implied.select("dimension", "n_images", "n_correct").rows() == [
        ("eyewear_present", 2, 2)
    ]
    stated_all = both.filter((pl.col("kind") == "stated") & (pl.col("dimension") == ALL))
    assert stated_all["n_images"].to_list() == [2]  # implied pairs never mix into stated rows


@pytest.mark.parametrize(
    "accuracy, paper_f1", [(903, 94.9), (921, 95.9), (864, 92.7), (920, 95.8), (650, 78.8)]
)
def test_f1_paper_reproduces_the_published_f1(truth, accuracy, paper_f1):
    """Tables 1 and 7: F1 = 2 acc / (1 + acc), i.e. precision 1."""
    pid = stated_pairs(truth).filter(pl.col("source_index") == 20)["prompt_id"][0]
    ids = [f"i{k}" for k in range(1000)]
    images = pl.DataFrame({"model": "m", "prompt_id": pid, "image_id": ids, "status": "ok"})
    attrs = pl.DataFrame(
        {
            "model": "m",
            "image_id": ids[:accuracy],
            "dimension": "gender_presentation",
            "label": "male",
        }
    )
    row = score_rows(validation_scores(attrs, images, truth))[("m", ALL)]
    assert row["accuracy"] == row["recall"] == accuracy / 1000
    assert round(100 * row["f1_paper"], 1) == paper_f1


def test_scores_need_validation_images(truth, small):
    attrs, images = small
    with pytest.raises(ValueError, match="no image of the images table belongs"):
        validation_scores(attrs, images.filter(pl.col("prompt_id") == "main-prompt"), truth)
    with pytest.raises(ValueError, match=r"images table lacks columns \['prompt_id'\]"):
        validation_scores(attrs, images.drop("prompt_id"), truth)
