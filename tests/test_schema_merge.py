"""Attribute schema (paper Table 6), answer flattening and the merge."""

import json

import polars as pl
import pytest

from stereolens.contextbias.merge import merge_extractions
from stereolens.contextbias.schema import AttributeSchema


@pytest.fixture(scope="module")
def schema():
    return AttributeSchema.load()


def answer(people=None, items=None):
    return {
        "scene": {
            "mood": "calm",
            "color_temperature": "unknown",
            "aesthetic_qualities": [],
            "dominant_colors": ["white", "blue", "white"],
            "weather": "unknown",
        },
        "camera": {"depth_of_field": "shallow", "framing": "medium", "perspective": "eye_level"},
        "objects": {"items": items if items is not None else ["Stethoscope ", "clipboard"]},
        "people": people if people is not None else [],
    }


def person(pid, **kw):
    base = {
        "person_id": pid,
        "age_range": "young_adult",
        "body_type": "average",
        "gender_presentation": "female",
        "skin_tone": "light",
        "expression": "smiling",
        "pose": "standing",
        "activities": [],
        "accessories": ["none"],
        "hair_present": "yes",
        "hair_style": "long",
        "hair_color": "brown",
        "eyewear_present": "no",
        "eyewear_type": "none",
        "facial_hair_present": "no",
        "facial_hair_style": "none",
        "facial_hair_color": "unknown",
        "head_covering_present": "no",
        "head_covering_type": "none",
        "tattoo_present": "no",
        "clothing_garment": ["scrubs"],
    }
    return {**base, **kw}


def test_schema_has_the_papers_30_dimensions(schema):
    assert len(schema.dimensions) == 30
    assert schema.cohorts == ("scene", "camera", "objects", "people")
    assert len(schema.counted_dimensions) == 29  # person_id is an identifier
    vocab = schema.vocabulary()
    assert vocab["items"] is None and vocab["clothing_garment"] is None
    assert vocab["gender_presentation"] == ("female", "male", "nonbinary")
    assert "none" not in vocab["accessories"] and "unknown" not in vocab["mood"]


def test_json_schema_validates_answers(schema):
    good = answer(people=[person("p1")])
    assert schema.validate(good) == []
    bad = answer(people=[person("p1", gender_presentation="woman")])
    problems = schema.validate(bad)
    assert problems and "people/0/gender_presentation" in problems[0]
    missing = answer()
    del missing["camera"]["framing"]
    assert any("framing" in p for p in schema.validate(missing))


def test_labels_drop_unknown_none_and_count_once(schema):
    two = answer(people=[person("p1"), person("p2", gender_presentation="male")])
    labels = schema.labels(two)
    dims = [(d, lab) for _, d, lab in labels]
    assert ("gender_presentation", "female") in dims and ("gender_presentation", "male") in dims
    assert dims.count(("clothing_garment", "scrubs")) == 1  # two people, counted once
    assert dims.count(("dominant_colors", "white")) == 1
    assert ("items", "stethoscope") in dims  # normalised case and whitespace
    assert not any(lab in ("unknown", "none", "") for _, lab in dims)
    assert not any(d in ("person_id", "accessories", "eyewear_type") for d, _ in dims)


def test_merge(schema, tmp_path):
    base = {
        "extractor": "x",
        "model": "m",
        "role": "nurse",
        "condition": "CF",
        "variant": "phrasing",
        "prompt_id": "p",
        "schema_version": schema.version,
    }
    recs = [
        {
            **base,
            "image_id": "a",
            "seed": 1,
            "status": "ok",
            "attempts": 1,
            "attributes": answer(people=[person("p1")]),
        },
        {
            **base,
            "image_id": "b",
            "seed": 2,
            "status": "discarded",
            "attempts": 3,
            "reason": "invalid JSON after 3 attempts",
            "attributes": None,
        },
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    attrs, images = merge_extractions([path], schema)
    assert images.height == 2
    assert images.filter(pl.col("image_id") == "b")["reason"].item().startswith("invalid")
    assert set(attrs["image_id"]) == {"a"}
    assert attrs.filter(pl.col("dimension") == "gender_presentation")["label"].to_list() == [
        "female"
    ]
    assert images.filter(pl.col("image_id") == "a")["n_labels"].item() == attrs.height
    with pytest.raises(ValueError, match="twice"):
        merge_extractions([path, path], schema)
    (tmp_path / "broken.jsonl").write_text('{"image_id": ')
    with pytest.raises(ValueError, match="broken.jsonl:1"):
        merge_extractions([tmp_path / "broken.jsonl"], schema)


def test_jsonl_survives_unicode_line_separators(schema, tmp_path):
    """A sampled VLM can put U+2028 in an open-vocabulary label; json.dumps leaves it
    unescaped, so splitting on every Unicode line break would corrupt the record."""
    from stereolens.atomic import read_jsonl, write_jsonl

    rec = {
        "extractor": "x",
        "model": "m",
        "role": "nurse",
        "condition": "CF",
        "prompt_id": "p",
        "image_id": "a",
        "seed": 1,
        "status": "ok",
        "attempts": 1,
        "attributes": answer(items=["odd\u2028label", "tab\x85here"]),
    }
    path = tmp_path / "s.jsonl"
    write_jsonl(path, [rec, {**rec, "image_id": "b"}])
    assert [r["image_id"] for r in read_jsonl(path)] == ["a", "b"]
    attrs, _ = merge_extractions([path], schema)
    assert "odd label" in attrs["label"].to_list()  # labels have whitespace normalised
