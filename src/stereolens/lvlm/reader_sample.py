"""The human sample of the LVLM reader correction, designed and drawn: its strata, the labels a
target width needs, the stratified draw of stories and judged term pairs written as two blinded
text forms, the template and the allocation (docs/statistics.md, "Designing the human sample")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import polars as pl

from stereolens.atomic import write_parquet, write_text
from stereolens.lvlm import reader_forms as rf
from stereolens.lvlm.corrected import readers_of
from stereolens.lvlm.tasks import load_prompts
from stereolens.metrics import human_labels as hl
from stereolens.metrics import sample_design as sd
from stereolens.metrics.reader_correction import MIN_HUMAN_RELIABLE

TASKS = ("story", "term")
FILES = {
    "story": "story",
    "term": "term",
    "template": "human_labels_template.csv",
    "design": "design.parquet",
}
"""What export_reader_sample writes into its folder: a form folder per task (form.html,
key.parquet), the human-label template and the allocation per stratum."""

# ---------------------------------------------------------------- the draw


def _strata(items: pl.DataFrame, disagreement: float | pl.DataFrame) -> pl.DataFrame:
    """(model: the allocation's group "<model>|<task>", stratum, n_items, disagreement)."""
    strata = items.group_by("group", "stratum").agg(pl.len().cast(pl.Int64).alias("n_items"))
    strata = strata.rename({"group": "model"})
    return sd.with_disagreement(strata, disagreement, ["stratum"])


def reader_items(reader: pl.DataFrame, task: str) -> pl.DataFrame:
    """One row per item of a story_reader / term_reader table: item_id, stratum, model,
    task and group = "<model>|<task>" (one allocation per audited model and task)."""
    return (
        reader.select("item_id", "stratum", "model")
        .unique()
        .with_columns(
            pl.lit(task).alias("task"),
            pl.concat_str(pl.col("model"), pl.lit(f"|{task}")).alias("group"),
        )
    )


def pilot_disagreement(
    readers: dict[str, pl.DataFrame],
    human: pl.DataFrame,
    default: dict[str, float],
    strata: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """stratum, disagreement of ``strata`` (model = "<model>|<task>", stratum; default: the
    readers' own) from a pilot's reader tables by task and human labels
    (sample_design.disagreement_rates); ``default[task]`` where the pilot has no label of it."""
    out = []
    for task, reader in readers.items():
        items = reader_items(reader, task)
        grouped = reader.join(items.select("item_id", "group"), on="item_id")
        wanted = items.select(pl.col("group").alias("model"), "stratum").unique()
        if strata is not None:
            wanted = strata.filter(pl.col("model").str.ends_with(f"|{task}"))
        ids = reader.select("item_id", "attribute").unique()
        own = human.join(ids, on=["item_id", "attribute"], how="semi")
        table, _ = sd.disagreement_rates(
            grouped.select(*hl.READER_COLUMNS, pl.col("group").alias("model")),
            own,
            wanted.select("model", "stratum"),
            default[task],
        )
        out.append(table.select("stratum", "disagreement"))
    return pl.concat(out)


def pilot_readers(pilot: Path) -> dict[str, pl.DataFrame]:
    """The story and term reader tables of a pilot's results folder (results/lvlm/
    responses, story_attributes, term_judgements .parquet), those it has."""
    from stereolens.lvlm.layout import LAYOUT

    def table(name: str) -> pl.DataFrame | None:
        path = LAYOUT.at(pilot, "table", table=name)
        return pl.read_parquet(path) if path.is_file() else None

    return readers_of(*(table(n) for n in ("responses", "story_attributes", "term_judgements")))


def export_reader_sample(
    responses: pl.DataFrame,
    story_attributes: pl.DataFrame | None,
    term_judgements: pl.DataFrame | None,
    out_dir: str | os.PathLike,
    *,
    target_width: float = 0.05,
    disagreement: dict[str, float] | pl.DataFrame | None = None,
    allocation: str = "neyman",
    seed: int = 0,
    prompts: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """Draw the human sample of the LVLM reader correction and write FILES into ``out_dir``: per
    audited model and task (items and strata: lvlm.corrected) sample_design.allocate_by_model
    gives n_h for ``target_width`` at ``disagreement`` (per task, or a table stratum,
    disagreement from a pilot), at least MIN_HUMAN_RELIABLE where a stratum has that many
    items, drawn with ``seed``. The forms show no model, group, user image or id. Returns the
    paths (story_form, story_key, term_form, term_key, template, design; no form for a task
    without a reader table)."""
    prompts = prompts or load_prompts()
    version = f"lvlm-prompts/{prompts.get('version')}"
    disagreement = {"story": 0.14, "term": 0.03} if disagreement is None else disagreement
    readers = readers_of(responses, story_attributes, term_judgements)
    if not readers:
        raise ValueError("LVLM reader sample: no story attributes and no term judgements")
    items = pl.concat([reader_items(r, t) for t, r in readers.items()])
    if isinstance(disagreement, dict):
        parts = [
            _strata(items.filter(pl.col("task") == t), float(disagreement[t])) for t in readers
        ]
        strata = pl.concat(parts)
    else:
        strata = _strata(items, disagreement)
    strata = strata.with_columns(pl.lit(MIN_HUMAN_RELIABLE, pl.Int64).alias("minimum"))
    design, summary = sd.allocate_by_model(strata, target_width, allocation=allocation)
    sample = sd.draw_sample(items, design, seed)
    out = Path(out_dir)
    paths: dict[str, Path] = {}
    templates = []
    for task, reader in readers.items():
        drawn = reader.join(sample.select("item_id"), on="item_id", how="semi")
        if task == "story":
            attributes = reader["attribute"].unique().to_list()
            questions = rf.story_questions(prompts, attributes, reader)
            sets = rf.story_sets(drawn, responses)
        else:
            questions = rf.term_questions(prompts)
            sets = rf.term_sets(drawn, term_judgements, responses)
        got = rf.write_text_form(sets, questions, task, version, seed, out / FILES[task])
        paths[f"{task}_form"], paths[f"{task}_key"] = got["form"], got["key"]
        templates.append(
            drawn.select("item_id", "attribute", "stratum")
            .unique()
            .join(sample.select("item_id", "selection_probability"), on="item_id")
            .with_columns(pl.lit("").alias("label"))
            .select(list(hl.HUMAN_COLUMNS))
        )
    template = pl.concat(templates).cast(hl.HUMAN_COLUMNS).sort("stratum", "item_id", "attribute")
    write_text(out / FILES["template"], template.write_csv())
    write_parquet(
        out / FILES["design"],
        design.with_columns(
            *sd.planned_widths(summary, target_width),
            pl.col("model").str.extract(r"\|([^|]+)$").alias("task"),
            pl.col("model").str.replace(r"\|[^|]+$", "").alias("model"),
        ).select("model", "task", pl.exclude("model", "task")),
    )  # fmt: skip
    return {**paths, "template": out / FILES["template"], "design": out / FILES["design"]}


# ---------------------------------------------------------------- the plan


def plan_strata(config: dict[str, Any]) -> pl.DataFrame:
    """The configured run's strata as lvlm.corrected names them: model ("<audited model>|<task>"),
    stratum and n_items (story: images_per_group stories a group; term: images_per_group
    rounds of |A|(|A|-1)/2 judged pairs a prompt)."""
    from stereolens.lvlm.names import groups
    from stereolens.lvlm.plugin import settings
    from stereolens.lvlm.respond import task_items

    lv = config["lvlm"]
    prompts = load_prompts(lv["prompts"])
    rows = []
    for task in TASKS:
        if task not in lv["tasks"]:
            continue
        ids = [p.prompt_id for p in task_items(task, lv, prompts)]
        n = int(lv["tasks"][task]["images_per_group"])
        for model in sorted(lv["models"]):
            for setting in settings(lv, task):
                for axis in lv["axes"]:
                    for pid in ids:
                        head = f"{model}|{setting}|{axis}|{pid}"
                        names = groups(lv, axis)
                        if task == "story":
                            rows += [(f"{model}|{task}", f"{head}|{g}", n) for g in names]
                        else:
                            pairs = len(names) * (len(names) - 1) // 2
                            rows.append((f"{model}|{task}", head, n * pairs))
    return pl.DataFrame(
        rows, schema={"model": pl.String, "stratum": pl.String, "n_items": pl.Int64}, orient="row"
    ).sort("model", "stratum")


def plan_rates(
    config: dict[str, Any], strata: pl.DataFrame, pilot: Path | None
) -> tuple[pl.DataFrame, str, list[str]]:
    """``strata`` with their disagreement: lvlm.reader_sample.disagreement per task, or a
    ``pilot`` results folder's rates (pilot_disagreement) from its reader tables and human
    labels (lvlm.reader_correction.human_labels, else its SIMULATED ones). Returns the
    table, the rates' source and notes."""
    from stereolens.lvlm.layout import LAYOUT

    rate = config["lvlm"]["reader_sample"]["disagreement"]
    task = pl.col("model").str.extract(r"\|([^|]+)$")
    default = strata.with_columns(
        task.replace_strict({t: float(rate[t]) for t in TASKS}, return_dtype=pl.Float64)
        .alias("disagreement")
    )  # fmt: skip
    if pilot is None:
        return default, "default", []
    given = config["lvlm"]["reader_correction"]["human_labels"]
    human_path = Path(given) if given else LAYOUT.at(pilot, "human_labels_simulated")
    readers = pilot_readers(Path(pilot))
    if not readers or not human_path.is_file():
        return default, "default", [
            f"LVLM reader: no reader tables or no human labels in the pilot ({human_path}); "
            f"disagreement story {rate['story']:g}, term {rate['term']:g} "
            "(lvlm.reader_sample.disagreement)"
        ]  # fmt: skip
    human = hl.read_human_labels(human_path)
    rates = pilot_disagreement(readers, human, dict(rate), strata)
    table = default.join(rates.rename({"disagreement": "_pilot"}), on="stratum", how="left")
    table = table.with_columns(pl.coalesce("_pilot", "disagreement").alias("disagreement"))
    notes = []
    if human_path.suffix == ".parquet" and "simulated" in pl.read_parquet_schema(human_path):
        notes.append(
            f"LVLM reader: the pilot's human labels {human_path} are SIMULATED; their "
            "disagreement is the simulation's flip fraction, not the assistant's"
        )
    return table.drop("_pilot"), f"pilot {human_path}", notes


def labels_needed(config: dict[str, Any], pilot: Path | None) -> dict[str, Any]:
    """The planner's reader rows of the LVLM: per audited model and task the human labels for
    lvlm.reader_sample.target_width at plan_rates' disagreement, and those that print every
    TVD row's interval (sample_design.planner_part)."""
    section = config["lvlm"]["reader_sample"]
    strata = plan_strata(config)
    if not strata.height:
        return {"benchmark": "lvlm", "rows": [], "notes": []}
    strata, source, notes = plan_rates(config, strata, pilot)
    knob = {
        m: (f"lvlm.tasks.{m.rsplit('|', 1)[1]}.images_per_group", float(
            config["lvlm"]["tasks"][m.rsplit("|", 1)[1]]["images_per_group"]))
        for m in strata["model"].unique()
    }  # fmt: skip
    part = sd.planner_part("lvlm", "items", section, strata, source, notes, knob)
    for r in part["rows"]:
        model, task = r["model"].rsplit("|", 1)
        r["model"] = f"{model}, {task} ({'stories' if task == 'story' else 'term pairs'})"
    return part
