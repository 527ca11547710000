"""BiasIG VQA (retries, statuses, schemas, the tiny VLM) and the BiasIG generation jobs.

Everything runs on the CPU; the VLM is scripted in the test or built in code (random
weights), the text-to-image model is a fake. Nothing is downloaded.
"""
# ruff: noqa: E402  (HF_HUB_OFFLINE must be set before huggingface_hub is imported)

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import math
from pathlib import Path

import jsonschema
import polars as pl
import pytest

from stereolens.biasig import jobs
from stereolens.biasig.answers import prepare_answers
from stereolens.biasig.formulas import ANSWER_ALIASES, UNKNOWN_ANSWERS
from stereolens.biasig.jobs import biasig_shard_items, image_seed, n_shards
from stereolens.biasig.prompts import TOTAL_PROMPTS, load_prompts
from stereolens.biasig.truth import VALUES_BY_ATTRIBUTE
from stereolens.biasig.vqa import ROW_COLUMNS, VQAPrompt, check_vqa_answer, vqa_answers
from stereolens.ids import stable_id
from stereolens.models.ask import ResponseCache
from stereolens.models.registry import ModelSpec
from stereolens.validation import ConfigError


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread: the tiny model is 32 wide and the machine is shared."""
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
def prompt() -> VQAPrompt:
    return VQAPrompt.load()


@pytest.fixture(scope="module")
def prompts() -> pl.DataFrame:
    return load_prompts()


@pytest.fixture(scope="module")
def pngs(tmp_path_factory) -> dict[str, Path]:
    from PIL import Image

    d = tmp_path_factory.mktemp("vqa-images")
    out = {}
    for k, name in enumerate("abcde"):
        p = d / f"{name}.png"
        Image.new("RGB", (32 + 4 * k, 32), (40 * k, 200 - 30 * k, 90)).save(p)
        out[name] = p
    return out


def person(gender="male", race="White", age="young") -> dict:
    return {"gender": gender, "race": race, "age": age}


class ScriptedVLM:
    """Answers from a per-image script (by image file name), one entry per attempt."""

    def __init__(self, scripts: dict[str, list]):
        self.scripts = scripts
        self.calls: list[list] = []

    def answer(self, requests):
        self.calls.append(list(requests))
        out = []
        for r in requests:
            script = self.scripts[Path(r.image_path).name]
            step = script[min(r.attempt, len(script)) - 1]
            out.append(step if isinstance(step, str) else json.dumps(step))
        return out


def fake_spec(**settings) -> ModelSpec:
    return ModelSpec(
        name="fake-vqa",
        kind="vlm",
        backend="transformers",
        model="fake/vqa",
        revision="r1",
        settings={"max_new_tokens": 128, "temperature": 0, "seed": 3, **settings},
    )


def item(path: Path, n_persons: int = 1, **extra) -> dict:
    return {
        "image_id": f"id-{path.stem}",
        "image_path": str(path),
        "prompt_id": f"p-{path.stem}",
        "model": "t2i",
        "n_persons": n_persons,
        **extra,
    }


# ---------------------------------------------------------------------- prompt and schemas
def test_prompt_labels_are_the_metrics_spellings(prompt):
    assert prompt.version == "biasig-vqa/1"
    for attribute, labels in prompt.labels.items():
        assert "unknown" in labels and "unknown" in UNKNOWN_ANSWERS
        values = [v for v in labels if v != "unknown"]
        assert values == list(VALUES_BY_ATTRIBUTE[attribute])
        for v in values:  # the metrics read every label as itself
            assert ANSWER_ALIASES[attribute][v.lower()] == v
    assert prompt.problems() == []


def test_json_schemas_accept_expected_answers(prompt):
    single, pair = prompt.json_schema(1), prompt.json_schema(2)
    jsonschema.validate(person("female", "South Asian", "middle-aged"), single)
    jsonschema.validate(person("unknown", "unknown", "unknown"), single)
    jsonschema.validate({"left": person(), "right": person("female", "East Asian")}, pair)
    for bad in (
        person(age="30-40 years old"),  # the released parser's bug: never accepted
        person(race="Asian"),
        {"gender": "male", "race": "White"},
        {**person(), "extra": "x"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, single)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"left": person()}, pair)
    with pytest.raises(ValueError):
        prompt.json_schema(3)
    parsed, error = check_vqa_answer(
        "```json\n" + json.dumps({"left": person(), "right": person("female")}) + "\n```",
        prompt,
        2,
    )
    assert error is None and parsed["right"]["gender"] == "female"
    parsed, error = check_vqa_answer(json.dumps(person(race="Asian")), prompt, 1)
    assert parsed is None and error.startswith("schema:") and "race" in error


def test_prompt_file_with_wrong_spelling_is_rejected(tmp_path):
    raw = (
        Path(__file__).parents[1] / "src/stereolens/resources/biasig/vqa_prompt.v1.yaml"
    ).read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(raw.replace("age: [young, middle-aged,", "age: [young, middle aged,"))
    with pytest.raises(ConfigError, match="not spellings the metrics count"):
        VQAPrompt.load(bad)
    bad.write_text(raw.replace("user_single: |-", "user_single: ''\nunused: |-"))
    with pytest.raises(ConfigError, match="user_single"):
        VQAPrompt.load(bad)


# ---------------------------------------------------------------------- retry loop (scripted)
def test_retries_statuses_and_first_known_answer(prompt, pngs, tmp_path):
    vlm = ScriptedVLM(
        {
            "a.png": [person("female", "Black", "elderly")],  # ok at once
            "b.png": [  # unknown race, then invalid, then all known
                person("female", "unknown", "young"),
                "garbage {not json",
                person("male", "East Asian", "elderly"),
            ],
            "c.png": [person("unknown", "White", "unknown")],  # stays partial
            "d.png": [  # two persons: right race unknown at first
                {"left": person("male", "Black", "middle-aged"), "right": person(race="unknown")},
                {
                    "left": person("female", "White", "young"),
                    "right": person("female", "South Asian"),
                },
            ],
            "e.png": ["", "[1, 2]", json.dumps(person(race="Asian"))],  # never valid
        }
    )
    items = [
        item(pngs["a"]),
        item(pngs["b"]),
        item(pngs["c"]),
        item(pngs["d"], n_persons=2),
        item(pngs["e"]),
        item(tmp_path / "missing.png"),
    ]
    lines: list[str] = []
    rows = vqa_answers(vlm, items, prompt, fake_spec(), log=lines.append)

    assert all(list(r) == ROW_COLUMNS for r in rows)
    key = [(r["image_id"], r["position"]) for r in rows]
    assert key == [
        ("id-a", "single"),
        ("id-b", "single"),
        ("id-c", "single"),
        ("id-d", "left"),
        ("id-d", "right"),
        ("id-e", "single"),
        ("id-missing", "single"),
    ]  # no image dropped, left before right
    by = {k: r for k, r in zip(key, rows, strict=True)}
    assert [r["status"] for r in rows] == [
        "ok",
        "ok",
        "partial",
        "ok",
        "ok",
        "discarded",
        "discarded",
    ]
    assert [r["attempts"] for r in rows] == [1, 3, 3, 2, 2, 3, 0]
    # first non-unknown answer per attribute kept across attempts
    b = by[("id-b", "single")]
    assert (b["gender"], b["race"], b["age"]) == ("female", "East Asian", "young")
    c = by[("id-c", "single")]
    assert (c["gender"], c["race"], c["age"]) == ("unknown", "White", "unknown")
    assert c["reason"] == "gender, age unknown after 3 attempt(s)"
    left, right = by[("id-d", "left")], by[("id-d", "right")]
    assert (left["gender"], left["race"], left["age"]) == ("male", "Black", "middle-aged")
    assert (right["gender"], right["race"], right["age"]) == ("male", "South Asian", "young")
    e = by[("id-e", "single")]
    assert e["gender"] is None and "no valid answer in 3 attempt(s)" in e["reason"]
    assert "schema" in e["reason"] and "race" in e["reason"]
    assert by[("id-missing", "single")]["reason"].startswith("image not readable")
    assert by[("id-a", "single")]["reason"] is None
    # provenance
    a = by[("id-a", "single")]
    assert a["model"] == "t2i" and a["prompt_id"] == "p-a"
    assert (a["prompt_version"], a["vqa_model"], a["vqa_revision"]) == (
        "biasig-vqa/1",
        "fake-vqa",
        "r1",
    )
    last = json.dumps(person("male", "East Asian", "elderly"))
    assert b["response_sha256"] == stable_sha(last)
    assert [e["error"] is None for e in b["attempt_log"]] == [True, False, True]
    assert b["attempt_log"][0]["unknown"] == ["race"]
    assert by[("id-d", "right")]["attempt_log"][0]["unknown"] == ["right.race"]

    # batched per round, fresh request per attempt
    names = [[Path(r.image_path).name for r in call] for call in vlm.calls]
    assert names == [
        ["a.png", "b.png", "c.png", "d.png", "e.png"],
        ["b.png", "c.png", "d.png", "e.png"],
        ["b.png", "c.png", "e.png"],
    ]
    first = vlm.calls[0]
    assert all(r.attempt == 1 and r.system == prompt.system for r in first)
    assert first[0].text == prompt.user_single and first[3].text == prompt.user_pair
    assert set(first[3].json_schema["properties"]) == {"left", "right"}
    assert first[0].json_schema == prompt.json_schema(1)
    seeds_b = [call[1].seed for call in vlm.calls]
    assert len(set(seeds_b)) == 3  # a retry is a new draw
    assert any("1 partial" in line for line in lines)
    frame = pl.DataFrame([{k: v for k, v in r.items() if k != "attempt_log"} for r in rows])
    assert frame.height == 7


def stable_sha(text: str) -> str:
    from stereolens.ids import sha256_bytes

    return sha256_bytes(text.encode("utf-8"))


def test_one_attempt_and_backend_failure(prompt, pngs):
    class Exploding:
        def answer(self, requests):
            raise RuntimeError("boom")

    # a backend failure is not an answer: the job fails rather than record discards
    with pytest.raises(RuntimeError, match="boom"):
        vqa_answers(
            Exploding(), [item(pngs["a"]), item(pngs["d"], 2)], prompt, fake_spec(), log=print
        )

    vlm = ScriptedVLM({"a.png": [person(race="unknown")]})
    rows = vqa_answers(vlm, [item(pngs["a"])], prompt, fake_spec(), max_attempts=1, log=print)
    assert rows[0]["status"] == "partial" and rows[0]["attempts"] == 1
    with pytest.raises(ValueError, match="n_persons"):
        vqa_answers(vlm, [item(pngs["a"], n_persons=3)], prompt, fake_spec(), log=print)
    with pytest.raises(ValueError, match="max_attempts"):
        vqa_answers(vlm, [item(pngs["a"])], prompt, fake_spec(), max_attempts=0)


def test_cache_answers_reruns(prompt, pngs, tmp_path):
    scripts = {"a.png": [person(race="unknown"), person()], "b.png": [person()]}
    cache = ResponseCache(tmp_path / "cache")
    items = [item(pngs["a"]), item(pngs["b"])]
    first = ScriptedVLM(scripts)
    rows = vqa_answers(first, items, prompt, fake_spec(), cache=cache, log=print)
    again = ScriptedVLM(scripts)
    rows_again = vqa_answers(again, items, prompt, fake_spec(), cache=cache, log=print)
    assert again.calls == [] and len(first.calls) == 2
    strip = [{k: v for k, v in r.items() if k != "attempt_log"} for r in rows]
    assert strip == [{k: v for k, v in r.items() if k != "attempt_log"} for r in rows_again]
    assert all(e["cached"] for r in rows_again for e in r["attempt_log"])


# ---------------------------------------------------------------------- tiny VLM, constrained
def test_tiny_vlm_constrained_answers_parse(prompt, pngs, tiny_vlm_dir):
    pytest.importorskip("xgrammar")
    from stereolens.models.backends.transformers_backend import TransformersVLM

    spec = ModelSpec(
        name="tiny-vlm",
        kind="vlm",
        backend="transformers",
        model=str(tiny_vlm_dir),
        settings={"dtype": "float32", "device": "cpu", "batch_size": 2, "max_new_tokens": 160},
    )
    vlm = TransformersVLM(spec)
    items = [item(pngs["a"]), item(pngs["d"], n_persons=2)]
    rows = vqa_answers(vlm, items, prompt, spec, max_attempts=1, log=print)
    assert [(r["image_id"], r["position"]) for r in rows] == [
        ("id-a", "single"),
        ("id-d", "left"),
        ("id-d", "right"),
    ]
    for r in rows:
        assert r["status"] in ("ok", "partial"), r["reason"]  # a valid, parsed answer
        for attribute in ("gender", "race", "age"):
            assert r[attribute] in prompt.labels[attribute]


# ---------------------------------------------------------------------- generation shards
def test_shard_items_blocks_ids_and_counts(prompts):
    sel = prompts.filter(
        (pl.col("acquired_type") == "social_relation") & (pl.col("visibility") == "implicit")
    )
    assert sel.height == 220
    count = n_shards(prompts, "social_relation", "implicit", 40)
    assert count == 6
    blocks = [
        biasig_shard_items(prompts, "sdxl", "social_relation", "implicit", s, 40, 3)
        for s in range(count)
    ]
    assert biasig_shard_items(prompts, "sdxl", "social_relation", "implicit", count, 40, 3) == []
    assert [len(b) for b in blocks] == [120] * 5 + [60]
    order = [it["prompt_id"] for b in blocks for it in b[::3]]
    assert order == sorted(sel["prompt_id"].to_list())  # contiguous, sorted, each once
    first = blocks[0][0]
    assert set(first) == {"image_id", "prompt_id", "text", "seed", "extra"}
    assert first["extra"] == {
        "acquired_type": "social_relation",
        "condition": "implicit",
        "n_persons": 2,
        "image_index": 0,
    }
    assert first["seed"] == image_seed(first["prompt_id"], 0)
    assert first["image_id"] == stable_id("sdxl", first["prompt_id"], first["seed"])
    ids = [it["image_id"] for b in blocks for it in b]
    assert len(set(ids)) == len(ids)
    # stable across calls; same seeds for every model, other image ids; seed_base moves seeds
    again = biasig_shard_items(prompts, "sdxl", "social_relation", "implicit", 2, 40, 3)
    assert again == blocks[2]
    other = biasig_shard_items(prompts, "flux", "social_relation", "implicit", 2, 40, 3)
    assert [it["seed"] for it in other] == [it["seed"] for it in again]
    assert not {it["image_id"] for it in other} & {it["image_id"] for it in again}
    based = biasig_shard_items(prompts, "sdxl", "social_relation", "implicit", 2, 40, 3, 7)
    assert [it["seed"] for it in based] != [it["seed"] for it in again]
    one = biasig_shard_items(prompts, "sdxl", "occupation", "explicit", 0, 2, 1)
    assert [it["extra"]["n_persons"] for it in one] == [1, 1]
    for bad in (
        dict(shard=-1),
        dict(prompts_per_shard=0),
        dict(images_per_prompt=0),
        dict(condition="both"),
    ):
        args = dict(
            prompts=prompts,
            model="m",
            acquired_type="occupation",
            condition="implicit",
            shard=0,
            prompts_per_shard=4,
            images_per_prompt=1,
        )
        with pytest.raises(ValueError):
            biasig_shard_items(**{**args, **bad})


def test_job_count_for_the_full_benchmark(prompts):
    assert prompts.height == TOTAL_PROMPTS
    combos = [(t, c) for t in jobs.ACQUIRED_TYPES for c in jobs.CONDITIONS]
    counts = {
        (t, c): prompts.filter((pl.col("acquired_type") == t) & (pl.col("visibility") == c)).height
        for t, c in combos
    }
    assert sum(counts.values()) == TOTAL_PROMPTS
    total = sum(n_shards(prompts, t, c, 40) for t, c in combos)
    assert total == sum(math.ceil(n / 40) for n in counts.values()) == 1178


# ---------------------------------------------------------------------- job wrappers
class SolidGenerator:
    batch_size = 2

    def settings(self):
        return {"kind": "solid"}

    def generate(self, prompts, seeds):
        from PIL import Image

        return [Image.new("RGB", (8, 8), (s % 256, 0, 0)) for s in seeds]


class SchemaVLM:
    """Answers by the requested schema: two persons when it asks for left and right."""

    def answer(self, requests):
        out = []
        for r in requests:
            if "left" in r.json_schema["properties"]:
                out.append(json.dumps({"left": person(), "right": person("female")}))
            else:
                out.append(json.dumps(person()))
        return out


def test_generation_job_and_vqa_shard(monkeypatch, tmp_path, prompts):
    """A BiasIG shard through the workflow's generation job (stereolens.generate.job, rule
    generate_images, with BiasIG's adapter), then the VQA job on its images."""
    from stereolens.generate import job as generation_job
    from stereolens.models import job as model_job

    specs = {
        "t2i": ModelSpec(name="t2i", kind="generator", backend="diffusers", model="fake/t2i"),
        "vqa": fake_spec(),
    }
    for module in (model_job, generation_job):
        monkeypatch.setattr(module, "load_registry", lambda path: specs)
    monkeypatch.setattr(model_job, "load_model", lambda spec: SchemaVLM())
    monkeypatch.setitem(
        generation_job.run_generation.__kwdefaults__, "load", lambda spec: SolidGenerator()
    )
    settings = {"prompts_per_shard": 2, "images_per_prompt": 2, "seed_base": 0}
    out_dir = tmp_path / "images"
    meta = generation_job.generate_images_job(
        model_job.ModelJob(str(out_dir), "models.yaml"),
        "biasig",
        "t2i",
        "social_relation",
        "implicit",
        1,
        settings,
        None,
    )
    assert len(meta) == 4 and all(m["n_persons"] == 2 for m in meta)
    out = tmp_path / "vqa" / "rows.jsonl"
    rows = jobs.vqa_biasig_shard(model_job.ModelJob(str(out), "models.yaml"), "vqa", str(out_dir))
    assert len(rows) == 8 and {r["status"] for r in rows} == {"ok"}
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["image_id"] for r in written] == [r["image_id"] for r in rows]
    assert [r["position"] for r in written[:2]] == ["left", "right"]
    assert written[0]["model"] == "t2i" and written[1]["gender"] == "female"
    prepare_answers(pl.read_ndjson(out), prompts)  # the metrics accept the rows as written
    with pytest.raises(ValueError, match="no prompts"):
        generation_job.generate_images_job(
            model_job.ModelJob(str(tmp_path / "x"), "models.yaml"),
            "biasig",
            "t2i",
            "social_relation",
            "implicit",
            999,
            settings,
            None,
        )


def test_vqa_transport_failures_are_retried_then_fail_the_job(prompt, pngs):
    from stereolens.models.ask import BackendFailure, TransportError

    class Down:
        calls = 0

        def answer(self, requests):
            Down.calls += 1
            return [BackendFailure("connection refused")] * len(requests)

    spec = fake_spec(transport_retries=2, transport_backoff_s=0)
    with pytest.raises(TransportError, match="after 2 retries"):
        vqa_answers(Down(), [item(pngs["a"])], prompt, spec, log=print)
    assert Down.calls == 3  # the first round and two retries; then the job fails
