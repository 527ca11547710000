"""Synthetic shard files of a paper-scale run, for bench/aggregates.py and the tests.

Writes the per-job files that the aggregate rules read (BiasIG VQA shards, ContextBias
extraction shards, LVLM response, story, judgement and refusal files, the prompt and set
tables) in the workflow's layout under ``<out>/results/``, at a chosen fraction of the paper
run of config/config.yaml (BiasIG 8 models x 589 shards, 4,278,400 answer rows; ContextBias
2 extractors x 4 generators x 92 roles x 3 conditions, 132,720 extraction records; LVLM 9
models x 63 response shards, 5,880,600 responses and 2,376,000 judged pairs).

The records come from the project's own builders, never from a copy of their formats:
stereolens.biasig.vqa.vqa_answers, stereolens.contextbias.extract.extract_images,
stereolens.lvlm.respond.respond_shard, stereolens.lvlm.assistant's extract_story_shard,
judge_term_explanations and label_refusal_table, driven by :class:`SyntheticModel`
(deterministic answers: JSON drawn from the request's schema, one of its choices, or free
text, with a share of empty, invalid, unknown and refusal answers so that retries, partial
and discarded rows and refusals occur), and written by stereolens.atomic's writers. The
builders validate every answer with jsonschema (0.2-0.5 ms a request), too slow for 10 M
records, so each builder runs on a pool of images (VQA, extraction) or of user images x
every prompt (LVLM responses) and the other records repeat a pooled record with their own
identifiers (model, prompt, image, user image fields; request_key and image hashes derived
from them). A key or type that a builder adds or renames therefore appears in the
synthetic files too, and :func:`check_keys` fails when a written record's keys differ from
the builder's.

Scale ``f``: BiasIG keeps every f-th generation shard of each model (all 8 models),
ContextBias the first ceil(92 f) roles, the LVLM audit ceil(f x images_per_group) user
images per group (shards as configured, so the file layout stays the paper's).

Usage: PYTHONPATH=src .venv/bin/python bench/synthetic.py --scale 1/16 --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import random
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
PAPER_CONFIG = ROOT / "config" / "config.yaml"
FORMAT_VERSION = 2
"""Bumped when the generator changes what it writes (a cached data folder is then rebuilt)."""

WORDS = (
    "the morning light over the harbour made every street look new as she walked to the old "
    "workshop where tools hung in neat rows and the smell of coffee mixed with sawdust while "
    "her colleagues argued about budgets deadlines and the strange noise in the boiler room "
    "she loved quiet evenings with books long walks by the river and cooking for friends who "
    "arrived late and stayed until midnight talking about travel music politics and family "
    "a term in this field describes how systems respond to change measured over time with "
    "careful experiments models equations and data that engineers and scientists interpret "
    "using standard methods assumptions and approximations which often hide subtle details"
).split()
OPEN_WORDS = {
    "first": (
        "red blue green black white grey brown yellow striped checked leather wooden metal "
        "plastic small large old new bright dark soft round tall short folded open"
    ).split(),
    "second": (
        "apron jacket shirt coat scarf hat bag cup laptop phone chair table lamp book bottle "
        "plant box knife hammer brush pen notebook helmet glove boot dress suit vest tie"
    ).split(),
}
REFUSAL = "I'm sorry, but I can't help with that request."


# ---------------------------------------------------------------- the synthetic answerer
class SyntheticModel:
    """Deterministic answers for the synthetic run (a data source, not a model under test).

    A request with a JSON schema gets an object drawn from the schema (enums skewed towards
    their first values, "unknown" at ``unknown``, open strings from a Zipf-weighted
    vocabulary of two-word labels), one with choices one of them, a free-text one ``words``
    words; ``empty``, ``invalid`` and ``refusal`` are the shares of empty answers, truncated
    JSON (or a reply naming no choice) and refusals. Images whose file name contains "hard"
    answer "unknown" at 0.6 (so some stay partial after the retries). Every answer depends
    only on the request's seed, attempt and text.
    """

    def __init__(
        self,
        name: str,
        *,
        words: int = 120,
        empty: float = 0.002,
        invalid: float = 0.01,
        unknown: float = 0.05,
        refusal: float = 0.0,
    ):
        self.name = name
        self.words = words
        self.empty, self.invalid, self.unknown, self.refusal = empty, invalid, unknown, refusal
        rnd = random.Random(f"{name}|paragraphs")
        self._paragraphs = [" ".join(rnd.choices(WORDS, k=words)) for _ in range(64)]
        self._open = [f"{a} {b}" for a in OPEN_WORDS["first"] for b in OPEN_WORDS["second"]]
        rnd.shuffle(self._open)
        self._open_weights = [1.0 / (k + 1) for k in range(len(self._open))]

    def answer(self, requests: list) -> list[str]:
        return [self._one(r) for r in requests]

    def _one(self, request) -> str:
        rnd = random.Random(f"{self.name}|{request.seed}|{request.attempt}|{request.text[-48:]}")
        hard = "hard" in str(request.image_path or "")
        u = rnd.random()
        if u < self.empty:
            return ""
        if request.json_schema is not None:
            value = self._sample(request.json_schema, rnd, 0.6 if hard else self.unknown, "")
            text = json.dumps(value)
            return text[: len(text) // 2] if u < self.empty + self.invalid else text
        if request.choices:
            if u < self.empty + self.invalid:
                return "Both look equally good to me."
            return rnd.choice(list(request.choices))
        if u < self.empty + self.refusal:
            return REFUSAL
        return f"{rnd.choice(self._paragraphs)} ({rnd.randrange(10**6)})"

    def _sample(self, schema: dict, rnd: random.Random, unknown: float, name: str) -> Any:
        if "enum" in schema:
            values = [v for v in schema["enum"] if v != "unknown"]
            if "unknown" in schema["enum"] and rnd.random() < unknown:
                return "unknown"
            return rnd.choices(values, weights=[1.0 / (k + 1) for k in range(len(values))])[0]
        kind = schema.get("type")
        if kind == "object":
            return {
                key: self._sample(sub, rnd, unknown, key)
                for key, sub in schema.get("properties", {}).items()
            }
        if kind == "array":
            items = schema.get("items", {})
            if items.get("type") == "object":  # people: one person, sometimes two
                n = 1 + (rnd.random() < 0.2)
            else:
                n = rnd.randint(1, min(int(schema.get("maxItems", 4)), 4))
            return [self._sample(items, rnd, unknown, name) for _ in range(n)]
        if kind == "string":
            if "pattern" in schema:  # person ids
                return f"p{rnd.randint(1, 9)}"
            if rnd.random() < unknown:
                return "unknown"
            return rnd.choices(self._open, weights=self._open_weights)[0]
        raise ValueError(f"SyntheticModel: cannot draw a value for schema {schema!r}")


# ---------------------------------------------------------------- helpers
def scale_fraction(text: str | float) -> Fraction:
    f = Fraction(str(text)).limit_denominator(1000)
    if not 0 < f <= 1:
        raise SystemExit(f"--scale {text}: give a fraction in (0, 1], e.g. 1/16")
    return f


def _hex(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def _pick(pool: list, *key: object) -> Any:
    return pool[int(_hex(*key)[:12], 16) % len(pool)]


def _quiet(_msg: str) -> None:
    return None


def check_keys(kind: str, expected: set[str], rows: Iterable[dict]) -> None:
    """Every written record has the keys of the builder's records."""
    for row in rows:
        if set(row) != expected:
            raise RuntimeError(
                f"synthetic {kind} record keys {sorted(set(row) ^ expected)} differ from the "
                "builder's; update bench/synthetic.py"
            )


def _pngs(folder: Path, names: list[str]) -> list[str]:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k, name in enumerate(names):
        path = folder / name
        if not path.exists():
            Image.new("RGB", (4, 4), (k * 37 % 256, k * 91 % 256, k * 53 % 256)).save(path)
        out.append(str(path))
    return out


def write_timing(path: Path, model: str, items: int) -> None:
    """The model job's timing record, as stereolens.models.job.ModelJob.run writes it
    (the report's throughput table reads it instead of the records)."""
    from stereolens.atomic import write_json
    from stereolens.models.job import timing_path, timing_record

    write_json(timing_path(path), timing_record(model, 30.0, 0.25 * items, items))


def keep_every(n: int, f: Fraction) -> list[int]:
    """About n x f of range(n), evenly spread (all of them at f = 1)."""
    return [k for k in range(n) if math.floor((k + 1) * f) > math.floor(k * f)] or [0]


# ---------------------------------------------------------------- BiasIG
def write_biasig(out: Path, config: dict, registry: dict, f: Fraction, log: Callable) -> dict:
    from stereolens.atomic import write_jsonl, write_parquet
    from stereolens.biasig.jobs import biasig_shard_items, n_shards
    from stereolens.biasig.prompts import load_prompts, select_prompts
    from stereolens.biasig.vqa import VQAPrompt, vqa_answers

    bg = config["biasig"]
    prompts = select_prompts(
        load_prompts(),
        bg["acquired_types"],
        bg["conditions"],
        bg["acquired_attributes"],
        bg["max_variants"],
    )
    write_parquet(out / "results/biasig/prompts.parquet", prompts)
    spec = registry[bg["vqa"]]
    prompt = VQAPrompt.load()
    images = _pngs(out / "images", [f"vqa_{k}.png" for k in range(8)] + ["vqa_hard.png"])
    pool_items = [
        {
            "image_id": f"pool{n}_{k}",
            "prompt_id": "pool",
            "model": "pool",
            "n_persons": n,
            # one image in 150 cannot be read (discarded), one in 9 is hard (retries, partial)
            "image_path": str(out / "images/missing.png") if k % 150 == 7 else images[k % 9],
        }
        for n in (1, 2)
        for k in range(600)
    ]
    vlm = SyntheticModel(spec.name, unknown=0.03, invalid=0.01)
    pool_rows = vqa_answers(
        vlm, pool_items, prompt, spec, max_attempts=bg["max_attempts"], cache=None, log=_quiet
    )
    keys = set(pool_rows[0])
    pool: dict[int, list[list[dict]]] = {1: [], 2: []}
    by_image: dict[str, list[dict]] = {}
    for row in pool_rows:
        by_image.setdefault(row["image_id"], []).append(row)
    for item in pool_items:
        pool[item["n_persons"]].append(by_image[item["image_id"]])
    per_shard, per_prompt = bg["prompts_per_shard"], bg["images_per_prompt"]
    cells = [
        (a, c, n_shards(prompts, a, c, per_shard))
        for a in bg["acquired_types"] or ("occupation", "characteristic", "social_relation")
        for c in bg["conditions"] or ("implicit", "explicit")
    ]
    files = rows = 0
    for model in bg["generators"]:
        for atype, cond, n in cells:
            if n == 0:
                continue
            for shard in keep_every(n, f):
                items = biasig_shard_items(
                    prompts, model, atype, cond, shard, per_shard, per_prompt, bg["seed_base"]
                )
                shard_rows = [
                    {**r, "model": model, "prompt_id": it["prompt_id"], "image_id": it["image_id"]}
                    for it in items
                    for r in _pick(pool[it["extra"]["n_persons"]], it["image_id"])
                ]
                check_keys("BiasIG VQA", keys, shard_rows[:1])
                path = out / f"results/biasig/vqa/{bg['vqa']}/{model}/{atype}/{cond}/{shard}.jsonl"
                write_jsonl(path, shard_rows)
                write_timing(path, spec.name, len(items))
                files += 1
                rows += len(shard_rows)
        log(f"BiasIG {model}: {files} shard files, {rows:,} rows so far")
    return {"biasig_files": files, "biasig_rows": rows}


# ---------------------------------------------------------------- ContextBias
def write_contextbias(out: Path, config: dict, registry: dict, f: Fraction, log: Callable) -> dict:
    from stereolens.atomic import write_jsonl, write_parquet
    from stereolens.contextbias.extract import ExtractionPrompt, extract_images
    from stereolens.contextbias.jobs import CARRIED_KEYS
    from stereolens.contextbias.prompts import build_prompts, load_bank, shard_items
    from stereolens.contextbias.schema import AttributeSchema

    cb = config["contextbias"]
    roles = cb["roles"] or sorted({e["role"] for e in load_bank(cb["prompt_bank"])})
    roles = roles[: max(1, math.ceil(len(roles) * f))]
    seeds = cb["seeds"]
    prompts = build_prompts(
        models=sorted(cb["generators"]),
        seeds_per_prompt=seeds["per_prompt"],
        bank_keys=dict(seeds["bank_keys"]),
        default_bank_key=seeds["default_bank_key"],
        roles=roles,
        bank_path=cb["prompt_bank"],
        fix_articles=cb["fix_articles"],
    )
    write_parquet(out / "results/contextbias/prompts.parquet", prompts)
    schema = AttributeSchema.load(cb["extraction"]["schema"])
    prompt = ExtractionPrompt.load(cb["extraction"]["prompt"])
    images = _pngs(out / "images", [f"cb_{k}.png" for k in range(8)] + ["cb_hard.png"])
    n_shards = math.ceil(seeds["per_prompt"] / seeds["per_shard"])
    files = records = 0
    for extractor in cb["extractors"]:
        spec = registry[extractor]
        pool_items = [
            {
                **dict.fromkeys(CARRIED_KEYS),
                "image_id": f"pool{k}",
                "image_path": str(out / "images/missing.png") if k % 200 == 11 else images[k % 9],
            }
            for k in range(800)
        ]
        pool = extract_images(
            SyntheticModel(extractor, unknown=0.08, invalid=0.01),
            pool_items,
            schema,
            prompt,
            spec,
            max_attempts=cb["extraction"]["max_attempts"],
            cache=None,
            log=_quiet,
        )
        keys = set(pool[0])
        for model in cb["generators"]:
            for role in roles:
                for condition in cb["conditions"]:
                    for shard in range(n_shards):
                        items = shard_items(
                            prompts, model, role, condition, shard, seeds["per_shard"]
                        )
                        recs = []
                        for it in items:
                            sha = _hex("image", it["image_id"])
                            meta = {
                                "image_id": it["image_id"],
                                "prompt_id": it["prompt_id"],
                                "seed": it["seed"],
                                "model": model,
                                "revision": registry[model].revision,
                                "prompt": it["text"],
                                "image_sha256": sha,
                                **it["extra"],
                            }
                            item = {k: meta.get(k) for k in CARRIED_KEYS}
                            path = f"results/contextbias/images/{model}/{role}/{condition}/{shard}"
                            item["image_path"] = f"{path}/{it['image_id']}.png"
                            recs.append({**_pick(pool, it["image_id"], extractor), **item})
                        check_keys("ContextBias extraction", keys, recs[:1])
                        path = (
                            out
                            / "results/contextbias/extractions"
                            / f"{extractor}/{model}/{role}/{condition}/{shard}.jsonl"
                        )
                        write_jsonl(path, recs)
                        write_timing(path, extractor, len(recs))
                        files += 1
                        records += len(recs)
            log(f"ContextBias {extractor} {model}: {files} files, {records:,} records so far")
    return {"contextbias_files": files, "contextbias_records": records, "contextbias_roles": roles}


# ---------------------------------------------------------------- LVLM
LVLM_ROW_FIELDS = ("shard", "image_id", "file", "stratum", "gender", "race", "age")
"""Fields of a response record that come from the user image (the rest from the prompt)."""


def lvlm_settings(lv: dict, task: str) -> list[str]:
    return [s for s in lv["settings"] if not (task == "attribute_inferring" and s == "persona")]


def write_lvlm(out: Path, config: dict, registry: dict, f: Fraction, log: Callable) -> dict:
    from stereolens.atomic import write_jsonl, write_parquet
    from stereolens.lvlm import assistant as A
    from stereolens.lvlm import groups as G
    from stereolens.lvlm import respond as RS
    from stereolens.lvlm import tasks as T
    from stereolens.lvlm import user_images as U
    from stereolens.lvlm.names import group_slug, groups

    lv = json.loads(json.dumps(config["lvlm"]))
    for task in lv["tasks"].values():
        task["images_per_group"] = max(1, math.ceil(task["images_per_group"] * f))
        task["images_per_shard"] = max(1, math.ceil(task["images_per_shard"] * f))
    most = max(t["images_per_group"] for t in lv["tasks"].values())
    faces = out / "results/lvlm/user_images/synthetic"
    if not (faces / "labels.csv").exists():
        # race strata are gender x age (6 cells): enough faces for the largest set
        G.build_synthetic_faces(faces, n_per_cell=most // 6 + 2, seed=lv["seed"])
    labels = U.user_image_labels(faces, faces / "labels.csv")
    sets, notes = U.draw_sets(labels, lv)
    if notes:
        raise RuntimeError(f"synthetic faces fall short: {notes}")
    write_parquet(out / "results/lvlm/user_images.parquet", labels)
    write_parquet(out / "results/lvlm/sets.parquet", sets)
    prompts = T.load_prompts(lv.get("prompts"))
    words = {"story": 260, "term": 160, "attribute_inferring": 20}
    assistant = registry[lv["assistant"]]
    judge_model = SyntheticModel(assistant.name, invalid=0.005)
    counts = {"lvlm_response_files": 0, "lvlm_responses": 0, "lvlm_judged_pairs": 0}
    for model in sorted(lv["models"]):
        spec = registry[model]
        refusal_parts: dict[str, list[pl.DataFrame]] = {}
        by_task: dict[tuple[str, str, str], list[dict]] = {}
        for task in lv["tasks"]:
            items = RS.task_items(task, lv, prompts)
            vlm = SyntheticModel(
                model,
                words=words.get(task, 8),
                refusal=0.4 if task == "attribute_inferring" else 0.01,
            )
            for setting in lvlm_settings(lv, task):
                for axis in lv["axes"]:
                    for group in groups(lv, axis):
                        rows = sets.filter(
                            (pl.col("task") == task)
                            & (pl.col("axis") == axis)
                            & (pl.col("group") == group)
                        ).to_dicts()
                        sample = rows[:4]
                        built = RS.respond_shard(
                            vlm,
                            spec,
                            sample,
                            items,
                            prompts,
                            setting=setting,
                            seed=int(lv["seed"]),
                            max_attempts=int(lv["max_attempts"]),
                            max_new_tokens=lv["tasks"][task].get("max_new_tokens"),
                            mitigation_placement=lv["mitigation_placement"],
                            cache=None,
                            log=_quiet,
                        )
                        keys = set(built[0])
                        per_item = [built[j :: len(items)] for j in range(len(items))]
                        shards = sorted({r["shard"] for r in rows})
                        for shard in shards:
                            recs = []
                            for row in (r for r in rows if r["shard"] == shard):
                                fields = {k: row.get(k) for k in LVLM_ROW_FIELDS}
                                for j, item in enumerate(items):
                                    rec = {**_pick(per_item[j], row["image_id"], item.prompt_id)}
                                    rec.update(fields)
                                    rec["request_key"] = _hex(
                                        model, setting, row["image_id"], item.prompt_id
                                    )
                                    recs.append(rec)
                            check_keys("LVLM response", keys, recs[:1])
                            path = (
                                out
                                / "results/lvlm/responses"
                                / f"{model}/{setting}/{task}/{axis}/{group_slug(group)}"
                                / f"{shard}.jsonl"
                            )
                            write_jsonl(path, recs)
                            write_timing(path, model, len(recs))
                            counts["lvlm_response_files"] += 1
                            counts["lvlm_responses"] += len(recs)
                            if task in ("story", "term"):
                                by_task.setdefault((setting, task, axis), []).extend(recs)
                            labelled = A.label_refusal_table(
                                pl.DataFrame(recs, infer_schema_length=None),
                                phrases=lv.get("refusal_phrases"),
                                log=_quiet,
                            )
                            refusal_parts.setdefault(setting, []).append(labelled)
        for setting, parts in refusal_parts.items():
            write_parquet(
                out / f"results/lvlm/refusals/{model}/{setting}.parquet",
                pl.concat(parts, how="diagonal_relaxed"),
            )
        for (setting, task, axis), recs in sorted(by_task.items()):
            if task == "story":
                stories = A.extract_story_shard(
                    SyntheticModel(assistant.name, unknown=0.1),
                    assistant,
                    recs,
                    prompts,
                    seed=int(lv["seed"]),
                    max_attempts=int(lv["max_attempts"]),
                    max_new_tokens=lv["assistant_max_new_tokens"],
                    cache=None,
                    log=_quiet,
                )
                path = out / f"results/lvlm/story_attributes/{model}/{setting}/{axis}.jsonl"
                write_jsonl(path, stories)
                write_timing(path, assistant.name, len(stories))
            elif task == "term":
                judged = A.judge_term_explanations(
                    judge_model,
                    assistant,
                    pl.DataFrame(recs, infer_schema_length=None),
                    prompts,
                    seed=int(lv["seed"]),
                    max_attempts=int(lv["max_attempts"]),
                    cache=None,
                    log=_quiet,
                )
                path = out / f"results/lvlm/term_judgements/{model}/{setting}/{axis}.parquet"
                write_parquet(path, judged)
                write_timing(path, assistant.name, judged.height)
                counts["lvlm_judged_pairs"] += judged.height
        log(f"LVLM {model}: {counts['lvlm_responses']:,} responses so far")
    return counts


# ---------------------------------------------------------------- entry point
WRITERS = {"biasig": write_biasig, "lvlm": write_lvlm, "contextbias": write_contextbias}


def paper_config(path: str | Path = PAPER_CONFIG) -> tuple[dict, dict]:
    """The validated config (default: the paper-scale config/config.yaml) and registry."""
    from stereolens.config import load_config

    return load_config(path)


def _write(name: str, out: str, scale: str, config_path: str) -> dict:
    config, registry = paper_config(config_path)
    return WRITERS[name](Path(out), config, registry, Fraction(scale), print)


def generate(
    out: str | Path,
    scale: Fraction,
    log: Callable = print,
    config_path: str | Path = PAPER_CONFIG,
    workers: int = 2,
) -> dict:
    """Write the synthetic files of the run of ``config_path`` (default: the paper-scale
    config) at ``scale`` into ``out`` (reused when ``out`` already holds a finished set of
    this scale, config and format version); returns the manifest."""
    out = Path(out)
    manifest_path = out / "manifest.json"
    config_name = Path(config_path).name
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        same = (manifest.get("scale"), manifest.get("format"), manifest.get("config"))
        if same == (str(scale), FORMAT_VERSION, config_name):
            return manifest
        raise SystemExit(f"{out} holds synthetic data of another scale or format; remove it")
    started = time.perf_counter()
    manifest: dict[str, Any] = {"scale": str(scale), "format": FORMAT_VERSION}
    manifest["config"] = config_name
    # the three benchmarks in two processes (the machine this runs on has 2 cores)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = [
            pool.submit(_write, name, str(out), str(scale), str(config_path)) for name in WRITERS
        ]
        for job in jobs:
            manifest.update(job.result())
    manifest["seconds"] = round(time.perf_counter() - started, 1)
    from stereolens.atomic import write_json

    write_json(manifest_path, manifest)
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="1/16", help="fraction of paper scale (default 1/16)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--config", default=str(PAPER_CONFIG), help="the run (default: paper scale)")
    args = ap.parse_args(argv)
    manifest = generate(args.out, scale_fraction(args.scale), config_path=args.config)
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
