"""The ContextBench prompt table and the source quirks it handles."""

import polars as pl
import pytest

from stereolens.contextbias.prompts import build_prompts, clean_text, shard_items
from stereolens.ids import stable_id
from stereolens.validation import ConfigError

PAPER = dict(
    models=["sdxl", "sd3.5-large", "flux.1-dev", "qwen-image"],
    seeds_per_prompt=10,
    bank_keys={"sdxl": "SDXL", "sd3.5-large": "3.5", "flux.1-dev": "Flux", "qwen-image": "Qwen"},
    default_bank_key="Flux",
)


@pytest.fixture(scope="module")
def paper():
    return build_prompts(**PAPER)


def test_counts_match_the_bank(paper):
    assert paper.height == 1659
    assert paper["role"].n_unique() == 92
    counts = dict(paper["condition"].value_counts().iter_rows())
    assert counts == {"CF": 276, "CA-R": 672, "CA-U": 711}
    assert dict(paper["variant"].value_counts().iter_rows()) == {
        "phrasing": 1211,
        "substitution": 448,
    }
    assert paper["prompt_id"].is_unique().all()


def test_quirks_are_handled():
    assert clean_text("a photo of a accountant in a corporate office changed") == (
        "a photo of a accountant in a corporate office",
        ["changed_suffix_removed", "article_not_adjusted"],
    )
    assert clean_text("a photo of a guard in a caf")[0] == "a photo of a guard in a café"
    assert clean_text("a photo of a accountant in a office", fix_articles=True)[0] == (
        "a photo of an accountant in an office"
    )
    # whole words only: "cafeteria" and "a nurse" are left alone
    assert clean_text("a photo of a nurse in a cafeteria") == (
        "a photo of a nurse in a cafeteria",
        [],
    )


def test_no_text_keeps_an_artefact(paper):
    assert not paper["text"].str.ends_with(" changed").any()
    assert not paper["text"].str.contains(r"\bcaf\b").any()
    assert paper["text"].str.contains("café").sum() == 7
    assert paper.filter(pl.col("quirks").list.contains("ca_r_without_context")).height == 6


def test_prompt_id_is_a_stable_hash(paper):
    row = paper.filter(pl.col("text") == "a photo of a accountant in a office").row(0, named=True)
    assert row["prompt_id"] == stable_id(
        "accountant", "CA-R", "a photo of a accountant in a office"
    )
    assert row["template"] == "a photo of a {role} in a office"
    assert row["phrasing"] == "a photo of a"


def test_seeds_per_model(paper):
    row = paper.filter(pl.col("text") == "a photo of a accountant in a corporate office").row(
        0, named=True
    )
    assert row["seeds"]["sdxl"][:2] == [27027, 332990]
    assert row["seed_source"]["qwen-image"] == "bank:Qwen"
    # "a photo of a photographer in a studio" has SDXL seeds only: others fall back
    studio = paper.filter(pl.col("text") == "a photo of a photographer in a studio").row(
        0, named=True
    )
    assert studio["seed_source"]["sdxl"] == "bank:SDXL"
    assert studio["seed_source"]["flux.1-dev"] == "bank:SDXL"
    assert all(len(s) == 10 for s in studio["seeds"].values())


def test_new_model_does_not_change_existing_seeds(paper):
    more = build_prompts(**{**PAPER, "models": PAPER["models"] + ["my-model"]})
    assert (
        more["seeds"].struct.field("sdxl").to_list()
        == paper["seeds"].struct.field("sdxl").to_list()
    )
    assert more["seed_source"].struct.field("my-model").str.starts_with("bank:Flux").sum() > 1600


def test_derived_seeds_when_bank_has_none():
    p = build_prompts(
        ["x"], 3, default_bank_key=None, bank_keys={"x": "NoSuchKey"}, roles=["nurse"]
    )
    # falls back to another bank list before deriving
    assert p["seed_source"].struct.field("x").str.starts_with("bank:").all()
    p12 = build_prompts(["x"], 12, roles=["nurse"])  # bank has 10 seeds: derived
    seeds = p12["seeds"].struct.field("x").to_list()
    assert set(p12["seed_source"].struct.field("x")) == {"derived"}
    assert all(len(set(s)) == 12 for s in seeds)
    assert seeds == build_prompts(["x"], 12, roles=["nurse"])["seeds"].struct.field("x").to_list()


def test_shards_partition_the_seeds(paper):
    whole = shard_items(paper, "sdxl", "nurse", "CA-U", 0, 10)
    parts = (
        shard_items(paper, "sdxl", "nurse", "CA-U", 0, 4)
        + shard_items(paper, "sdxl", "nurse", "CA-U", 1, 4)
        + shard_items(paper, "sdxl", "nurse", "CA-U", 2, 4)
    )
    assert sorted(i["image_id"] for i in whole) == sorted(i["image_id"] for i in parts)
    assert len({i["image_id"] for i in whole}) == len(whole)
    n_prompts = paper.filter((pl.col("role") == "nurse") & (pl.col("condition") == "CA-U")).height
    assert len(whole) == 10 * n_prompts


def test_bad_roles_are_named():
    with pytest.raises(ConfigError, match="not_a_role"):
        build_prompts(["x"], 1, roles=["not_a_role"])


def test_bad_bank_entry(tmp_path):
    bank = tmp_path / "bank.json"
    bank.write_text('[{"role": "nurse", "context": "CX", "prompt": "a photo of a nurse"}]')
    with pytest.raises(ConfigError, match="CX"):
        build_prompts(["x"], 1, bank_path=bank)
