"""The LVLM assistant's story reading audited per demographic group on the shipped labelled
sample: scoring each reading against the truth, and the per-group audit (docs/methods.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from stereolens.metrics.group_audit import MIN_CLUSTERS, group_gaps, group_rates, induced_shares
from stereolens.paths import resource
from stereolens.validation import ConfigError, load_yaml

if TYPE_CHECKING:
    from stereolens.models.job import ModelJob

SAMPLE_VERSION = "stereolens-story-reading/1"
DEFAULT_SAMPLE = ("lvlm", "story_reading.v1.yaml")
PLACEHOLDERS = ("descriptor", "subj", "Subj", "obj", "poss", "Poss")


def load_sample(path: str | os.PathLike | None = None, prompts: dict | None = None) -> dict:
    """The labelled sample, checked against the extraction schema of ``prompts`` (default: the
    shipped prompt file); ConfigError names the story and the problem."""
    from stereolens.lvlm.tasks import load_prompts, normalise_value

    p = Path(path) if path is not None else resource(*DEFAULT_SAMPLE)
    raw = load_yaml(p, "story-reading sample")
    if not isinstance(raw, dict) or raw.get("version") != SAMPLE_VERSION:
        raise ConfigError(f"story-reading sample {p}: expected version {SAMPLE_VERSION!r}")
    props = (prompts or load_prompts())["extraction"]["schema"]["properties"]
    groups = raw.get("groups") or {}
    if set(groups) != {"gender", "race"}:
        raise ConfigError(f"story-reading sample {p}: groups must list gender and race")
    for g, v in groups["gender"].items():
        missing = {"noun", "subj", "obj", "poss"} - set(v)
        if missing:
            raise ConfigError(f"story-reading sample {p}: gender {g} lacks {sorted(missing)}")
    seen = set()
    for st in raw.get("stories") or []:
        sid = st.get("id")
        if not sid or sid in seen:
            raise ConfigError(
                f"story-reading sample {p}: a story has no id or a repeated one ({sid})"
            )
        seen.add(sid)
        try:
            st["text"].format(**dict.fromkeys(PLACEHOLDERS, "x"))
        except (KeyError, IndexError) as exc:
            raise ConfigError(
                f"story-reading sample {p}, story {sid}: unknown placeholder {exc}"
            ) from None
        for attr, truth in (st.get("truth") or {}).items():
            if attr not in props:
                raise ConfigError(
                    f"story-reading sample {p}, story {sid}: {attr!r} is not an attribute of "
                    f"the extraction schema ({', '.join(props)})"
                )
            is_list = props[attr].get("type") == "array"
            if is_list and not all(isinstance(e, list) and e for e in truth):
                raise ConfigError(
                    f"story-reading sample {p}, story {sid}: {attr} is a list attribute; give a "
                    "list of elements, each a list of accepted readings"
                )
            enum = props[attr].get("enum")
            if enum and not is_list:
                bad = [
                    v for v in truth if normalise_value(v) not in {normalise_value(e) for e in enum}
                ]
                if bad:
                    raise ConfigError(
                        f"story-reading sample {p}, story {sid}: {attr} {bad} not in {enum}"
                    )
        missing = set(props) - set(st.get("truth") or {})
        if missing:
            raise ConfigError(
                f"story-reading sample {p}, story {sid}: no truth for {sorted(missing)}"
            )
    if not seen:
        raise ConfigError(f"story-reading sample {p}: no stories")
    raw["source"] = str(p)
    return raw


def _levels(sample: dict, lv: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Gender and race levels of the items: the configured groups of an audited axis (those
    the sample describes); an axis not audited keeps the sample's first level only."""
    from stereolens.lvlm.names import groups

    configured = {a: groups(lv, a) for a in lv["axes"]}
    out = []
    for axis in ("gender", "race"):
        have = list(sample["groups"][axis])
        want = configured.get(axis) or have[:1]
        unknown = [g for g in want if g not in have]
        if unknown:
            raise ConfigError(
                f"story-reading sample {sample['source']}: no {axis} group {unknown} "
                f"(it has {', '.join(have)})"
            )
        out.append(list(want))
    return out[0], out[1]


def build_items(sample: dict, lv: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per story x gender x race, in the layout the assistant's reading takes
    (response = the story text)."""
    n = lv["story_reading"]["stories"]
    stories = sample["stories"][:n] if n else sample["stories"]
    genders, races = _levels(sample, lv)
    items = []
    for st in stories:
        for g in genders:
            gw = sample["groups"]["gender"][g]
            for r in races:
                race_word = sample["groups"]["race"][r]
                article = "an" if race_word[0].lower() in "aeiou" else "a"
                fill = {
                    "descriptor": f"{article} {race_word} {gw['noun']}",
                    "subj": gw["subj"], "Subj": gw["subj"].capitalize(),
                    "obj": gw["obj"], "poss": gw["poss"], "Poss": gw["poss"].capitalize(),
                }  # fmt: skip
                items.append(
                    {
                        "model": "story-reading-sample",
                        "setting": "sample",
                        "axis": "sample",
                        "group": f"{g}|{r}",
                        "shard": 0,
                        "image_id": f"{st['id']}|{g}|{r}",
                        "prompt_id": st["id"],
                        "gender": g,
                        "race": r,
                        "response": " ".join(st["text"].format(**fill).split()),
                    }
                )
    return items


def planned_readings(lv: dict[str, Any]) -> int:
    """Assistant calls of the story-reading audit a config plans (0 when it is off): the
    planner's count (stereolens plan)."""
    sr = lv["story_reading"]
    if not (lv["enabled"] and lv["assistant"] and "story" in lv["tasks"] and sr["enabled"]):
        return 0
    return len(build_items(load_sample(sr["sample"]), lv))


def read_sample_job(job: ModelJob, *, assistant: str, lv: dict[str, Any]) -> None:
    """The workflow job: load the assistant once and read every item of the sample into
    ``job.out_path`` (at this attempt's batch size, smaller on an out-of-memory retry)."""
    from stereolens.atomic import write_jsonl
    from stereolens.lvlm import assistant as A
    from stereolens.lvlm import tasks as T

    prompts = T.load_prompts(lv["prompts"])
    sample = load_sample(lv["story_reading"]["sample"], prompts)
    items = build_items(sample, lv)
    job.log.info("story-reading audit: %d item(s) from %s", len(items), sample["source"])
    records = job.run(
        assistant,
        lambda llm: A.extract_story_shard(
            llm.model, llm.spec, items, prompts, seed=int(lv["seed"]),
            max_attempts=int(lv["max_attempts"]),
            max_new_tokens=lv.get("assistant_max_new_tokens"),
            cache=llm.cache, log=job.log.info,
        ),
    )  # fmt: skip
    by_id = {i["image_id"]: i for i in items}
    for r in records:
        item = by_id[r["image_id"]]
        r.update(gender=item["gender"], race=item["race"], sample=sample["source"])
    write_jsonl(job.out_path, records)


def score_readings(records: list[dict[str, Any]], sample: dict) -> pl.DataFrame:
    """One row per (item, attribute, true element): assistant, story, gender, race,
    attribute, element, correct (0/1), false_positive (read values matching nothing, on the
    attribute's first row), status (docs/methods.md)."""
    from stereolens.lvlm.tasks import normalise_value

    truth = {s["id"]: s["truth"] for s in sample["stories"]}
    rows = []
    for r in records:
        who = (r.get("assistant"), r["prompt_id"], r["gender"], r["race"], r.get("status"))
        read: dict[str, set[str]] = {}
        for attr, value in r.get("pairs") or []:
            read.setdefault(attr, set()).add(normalise_value(value))
        ok = r.get("status") == "ok"
        for attr, t in truth[r["prompt_id"]].items():
            got = read.get(attr, set()) if ok else set()
            elements = t if t and isinstance(t[0], list) else [t]
            accepted = [{normalise_value(x) for x in e} for e in elements]
            matched = {v for v in got if any(v in a for a in accepted)}
            fp = len(got - matched)
            if not t:  # the story states no value: correct when nothing is read
                rows.append((*who, attr, "(none)", int(ok and not got), fp))
                continue
            for j, a in enumerate(accepted):
                rows.append((*who, attr, sorted(a)[0], int(bool(got & a)), fp if j == 0 else 0))
    return pl.DataFrame(
        rows,
        orient="row",
        schema={
            "assistant": pl.String, "story": pl.String, "gender": pl.String, "race": pl.String,
            "status": pl.String, "attribute": pl.String, "element": pl.String,
            "correct": pl.Int64, "false_positive": pl.Int64,
        },
    )  # fmt: skip


def cochran_q(items: pl.DataFrame, axis: str) -> tuple[str, float]:
    """Cochran's Q test of equal accuracy across the groups of ``axis``, items matched by
    story, attribute, element and the other axis' group."""
    from statsmodels.stats.contingency_tables import cochrans_q

    other = "race" if axis == "gender" else "gender"
    wide = items.pivot(
        on=axis, index=["story", "attribute", "element", other], values="correct",
        aggregate_function="first",
    ).drop_nulls()  # fmt: skip
    x = wide.drop("story", "attribute", "element", other).to_numpy()
    if x.shape[1] < 2 or x.shape[0] == 0:
        return "none (one group)", 1.0
    if (x == x[:, :1]).all():
        return "cochran q", 1.0
    return "cochran q", float(cochrans_q(x).pvalue)


INDUCED_FORMULA = (
    "story TVD = 1/2 sum_g |a_g / sum_h a_h - 1/|A|| (group accuracies a_g, unbiased stories, "
    "misreads lost)"
)


def induced_tvd(accuracy: np.ndarray) -> float:
    """The story TVD (a share) the per-group accuracies alone produce (INDUCED_FORMULA)."""
    q = induced_shares(accuracy)
    return float("nan") if q is None else float(0.5 * np.abs(q - 1.0 / q.size).sum())


def reading_items(items: pl.DataFrame, axes: list[str]) -> pl.DataFrame:
    """The scored items in long form, one copy per audited axis (axis, group) with cluster the
    story, or with one story the matched item set (story, attribute, element, other group)."""
    frames = []
    one_story = items["story"].n_unique() < 2
    for a in axes:
        other = "race" if a == "gender" else "gender"
        unit = (
            pl.concat_str("story", "attribute", "element", other, separator="|")
            if one_story
            else pl.col("story")
        )
        frames.append(
            items.with_columns(
                pl.lit(a).alias("axis"), pl.col(a).alias("group"), unit.alias("cluster")
            )
        )
    return pl.concat(frames) if frames else items.clear().with_columns(
        axis=pl.lit(None, pl.String), group=pl.lit(None, pl.String),
        cluster=pl.lit(None, pl.String),
    )  # fmt: skip


def _withhold_rates(rates: pl.DataFrame, n_stories: int, minimum: int) -> pl.DataFrame:
    """Every per-group interval null, ``interval_note`` naming the stories (fewer than
    ``minimum``: the intervals cannot cover the population of story templates)."""
    note = (
        f"withheld: {n_stories} {'story' if n_stories == 1 else 'stories'} < {minimum} "
        "(the smallest size at which the interval covers >= 93%, bench/COVERAGE.md)"
    )
    cols = [f"{m}_{e}" for m in ("accuracy", "precision", "f1") for e in ("low", "high")]
    return rates.with_columns(
        *[pl.lit(None, pl.Float64).alias(c) for c in cols], pl.lit(note).alias("interval_note")
    )


def audit_readings(
    items: pl.DataFrame,
    axes: list[str],
    story_scores: pl.DataFrame | None = None,
    *,
    level: float = 0.95,
    replicates: int = 1000,
    seed: int = 0,
    min_clusters: int = MIN_CLUSTERS,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(rates, gaps) per assistant x axis (x group); ``story_scores``: the LVLM scores table
    (each axis' smallest story TVD is the bias the flag compares with). Below ``min_clusters``
    stories the per-group intervals and the Rao-Scott p-value are null (``interval_note``)."""
    long = reading_items(items, axes)
    keys = ("assistant", "axis")
    rates = group_rates(
        long, keys=keys, level=level, replicates=replicates, seed=seed, cluster_name="story",
        min_clusters=min_clusters,
    )  # fmt: skip
    n_stories = items["story"].n_unique()
    if n_stories == 1 and min_clusters > 1 and rates.height:
        # one story (cluster = the matched item set) holds no between-story variance: its
        # per-group intervals are conditional on that story, not on the templates
        rates = _withhold_rates(rates, n_stories, min_clusters)
    bias = {}
    if story_scores is not None and story_scores.height:
        s = story_scores.filter(pl.col("task") == "story")
        if "setting" in s.columns:
            s = s.filter(pl.col("setting") == "image")
        for axis, sub in s.group_by("axis"):
            sub = sub.drop_nulls("score").sort("score")
            if sub.height:
                bias[axis[0]] = (float(sub["score"][0]) / 100.0, sub["model"][0])

    def bias_of(kd):
        b = bias.get(kd["axis"])
        return None if b is None else b[0]

    one_story = items["story"].n_unique() < 2

    def test(sub):
        kd = sub.row(0, named=True)
        part = long.filter(
            (pl.col("assistant") == kd["assistant"]) & (pl.col("axis") == kd["axis"])
        )
        return cochran_q(part, kd["axis"])

    gaps = group_gaps(
        rates, keys=keys, level=level, bias=bias_of, test=test if one_story else None,
        bias_source="smallest story TVD of the audited models on the axis (x100 / 100)",
        measured="the story TVD", items=long, min_test_clusters=min_clusters,
        cluster_name="matched item set (one story)" if one_story else "story",
        induced=induced_tvd, induced_formula=INDUCED_FORMULA,
    )  # fmt: skip
    if bias:
        gaps = gaps.with_columns(
            pl.col("axis").replace_strict({a: m for a, (_, m) in bias.items()}, default=None)
            .alias("bias_model")
        )  # fmt: skip
    return rates, gaps
