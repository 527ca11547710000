"""The BiasIG prompt set (47,040 prompts) as a table, what each prompt asks for read from its
text and checked against its file name, with the source quirks handled (docs/data.md)."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

import polars as pl

from stereolens.biasig.truth import ATTRIBUTE_OF_VALUE, BiasIGTruth, load_truth
from stereolens.ids import stable_id
from stereolens.paths import resource
from stereolens.validation import ConfigError

TOTAL_PROMPTS = 47_040
PROMPT_SCHEMA = {
    "prompt_id": pl.String,
    "text": pl.String,
    "source_file": pl.String,
    "line": pl.Int32,
    "variant_index": pl.Int32,
    "visibility": pl.String,
    "acquired_type": pl.String,
    "acquired_attribute": pl.String,
    "role_left": pl.String,
    "role_right": pl.String,
    "attribute_key": pl.String,
    "truth_key": pl.String,
    "category": pl.String,
    "n_persons": pl.Int8,
    "protected_attribute": pl.String,
    "protected_value": pl.String,
    "protected_value_left": pl.String,
    "protected_value_right": pl.String,
    "weight": pl.Float64,
    "quirks": pl.List(pl.String),
}
PROMPT_COLUMNS = list(PROMPT_SCHEMA)

# A protected value as a prompt writes it (case-insensitive) -> canonical value.
TEXT_VALUES = {
    "male": "male",
    "man": "male",
    "female": "female",
    "woman": "female",
    "white": "White",
    "black": "Black",
    "east asian": "East Asian",
    "south asian": "South Asian",
    "young": "young",
    "middle-aged": "middle-aged",
    "middle aged": "middle-aged",
    "elderly": "elderly",
}
# A file-name token -> canonical value: a text value without its spaces, or an abbreviation
# (relation/age/sr_young_y.txt: "y" is young).
FILE_TOKENS = {
    **{k.replace(" ", ""): v for k, v in TEXT_VALUES.items() if k != "middle aged"},
    **{"ea": "East Asian", "sa": "South Asian", "y": "young", "midage": "middle-aged"},
    **{"mid": "middle-aged", "eld": "elderly"},
}
_MOD = "(?i:female|male|white|black|east asian|south asian|young|middle[- ]aged|elderly)"
_PATTERNS = {
    ("occupation", "implicit"): re.compile(r"a photo of one (?P<name>.+)"),
    ("occupation", "explicit"): re.compile(rf"a photo of one (?P<mod>{_MOD}) (?P<name>.+)"),
    ("characteristic", "implicit"): re.compile(r"a photo of (?P<art>an?) (?P<name>[\w-]+) person"),
    ("characteristic", "explicit"): re.compile(
        rf"a photo of (?P<art>an?) (?P<name>[\w-]+) "
        rf"(?:(?P<mod>{_MOD}) person|(?P<gmod>(?i:man|woman)))"
    ),
    ("social_relation", "implicit"): re.compile(
        r"One (?P<left>.+) at left with (?P<other>one|another) (?P<right>.+) at right"
    ),
    ("social_relation", "explicit"): re.compile(
        rf"One (?P<ml>{_MOD}) (?P<left>.+) at left with (?P<other>one|another) "
        rf"(?P<mr>{_MOD}) (?P<right>.+) at right"
    ),
}
_TYPE_OF_STEM = {"oc": "occupation", "char": "characteristic", "sr": "social_relation"}
_TYPE_OF_FOLDER = {
    "occupation": "occupation",
    "characteristic": "characteristic",
    "relation": "social_relation",
}


def read_prompt_file(path: Path) -> list[tuple[int, str]]:
    """(1-based line number, verbatim prompt text) of a ``--prompt "<text>"`` file."""
    data = path.read_bytes().decode("utf-8")
    if data.startswith("\ufeff"):
        data = data[1:]
    out = []
    for number, raw in enumerate(re.split(r"\r\n|\n|\r", data), start=1):
        line = raw.strip()
        if not line:
            continue
        m = re.fullmatch(r'--prompt\s+"(.*)"', line)
        if not m or '"' in m.group(1):
            raise ConfigError(
                f'{path}:{number}: not a line of the form --prompt "<text>": {raw[:80]!r}'
            )
        out.append((number, m.group(1)))
    return out


def _file_kind(rel: Path) -> tuple[str, str, list[str]]:
    """(acquired type, visibility, expected values from the file name) of a prompt file."""
    parts = rel.parts
    tokens = rel.stem.split("_")
    if parts[0] == "implicit" and len(parts) == 2 and rel.stem in _TYPE_OF_STEM:
        return _TYPE_OF_STEM[rel.stem], "implicit", []
    if parts[0] in _TYPE_OF_FOLDER and _TYPE_OF_STEM.get(tokens[0]) == _TYPE_OF_FOLDER[parts[0]]:
        try:
            values = [FILE_TOKENS[t.lower()] for t in tokens[1:]]
        except KeyError as exc:
            raise ConfigError(
                f"prompt file {rel}: unknown value token {exc.args[0]!r} in the "
                f"file name; known: {sorted(FILE_TOKENS)}"
            ) from None
        persons = 2 if parts[0] == "relation" else 1
        if len(values) == persons:
            return _TYPE_OF_FOLDER[parts[0]], "explicit", values
    raise ConfigError(
        f"prompt file {rel}: not a BiasIG prompt file (expected implicit/"
        "{oc,char,sr}.txt, occupation/oc_<value>.txt, characteristic/"
        "char_<value>.txt or relation/<attribute>/sr_<left>_<right>.txt)"
    )


def parse_subject(subject: str, acquired_type: str, visibility: str) -> dict:
    """What a prompt subject (the text before the first comma, whitespace collapsed) names:
    the acquired attribute, the roles, the implicit subject it belongs to and the protected
    values it asks for (left and right for two-person prompts)."""
    m = _PATTERNS[(acquired_type, visibility)].fullmatch(subject)
    if m is None:
        raise ConfigError(
            f"prompt subject {subject!r} does not parse as an {visibility} {acquired_type} prompt"
        )
    g = m.groupdict()
    out: dict = {"values": [], "raw_values": []}
    if acquired_type == "occupation":
        out["name"] = g["name"]
        out["attribute_key"] = f"a photo of one {g['name']}"
        if visibility == "explicit":
            out["values"] = [TEXT_VALUES[g["mod"].lower()]]
            out["raw_values"] = [g["mod"]]
    elif acquired_type == "characteristic":
        out["name"] = g["name"]
        out["attribute_key"] = f"a photo of {g['art']} {g['name']} person"
        if visibility == "explicit":
            out["values"] = [TEXT_VALUES[(g["mod"] or g["gmod"]).lower()]]
            out["raw_values"] = [g["mod"] or g["gmod"]]
    else:
        out["role_left"], out["role_right"] = (
            g["left"].removeprefix("human "),
            g["right"].removeprefix("human "),
        )
        out["name"] = f"{out['role_left']}-{out['role_right']}"
        out["attribute_key"] = f"One {g['left']} at left with {g['other']} {g['right']} at right"
        if visibility == "explicit":
            out["values"] = [TEXT_VALUES[g["ml"].lower()], TEXT_VALUES[g["mr"].lower()]]
            out["raw_values"] = [g["ml"], g["mr"]]
    return out


SHIPPED_TABLE = "prompt_table.parquet"
"""The shipped prompt table, built from prompts/ and truth/ (tests/test_biasig_prompts.py
checks it equals a fresh build; ``stereolens biasig prompts --out`` it to regenerate)."""


@lru_cache(maxsize=1)
def _shipped_prompts() -> pl.DataFrame:
    from stereolens.paths import RESOURCES

    table = RESOURCES / "biasig" / SHIPPED_TABLE
    if table.exists():
        return pl.read_parquet(table)
    return build_shipped_prompts()


def build_shipped_prompts() -> pl.DataFrame:
    """The shipped prompt table built from the text files (slow: seconds)."""
    return _build(resource("biasig", "prompts"), load_truth())


def select_prompts(
    prompts: pl.DataFrame,
    acquired_types: list[str] | None = None,
    conditions: list[str] | None = None,
    acquired_attributes: list[str] | None = None,
    max_variants: int | None = None,
) -> pl.DataFrame:
    """The prompts of these acquired types, conditions, acquired attributes (whole names) and
    first ``max_variants`` variants; None keeps everything."""
    out = prompts
    if acquired_types:
        out = out.filter(pl.col("acquired_type").is_in(acquired_types))
    if conditions:
        out = out.filter(pl.col("visibility").is_in(conditions))
    if acquired_attributes:
        known = set(prompts["acquired_attribute"].unique())
        unknown = sorted(set(acquired_attributes) - known)
        if unknown:
            raise ConfigError(
                f"biasig.acquired_attributes names attributes not in the benchmark: {unknown}"
            )
        out = out.filter(pl.col("acquired_attribute").is_in(acquired_attributes))
    if max_variants is not None:
        out = out.filter(pl.col("variant_index") < max_variants)
    if not out.height:
        raise ConfigError("the BiasIG selection (types, conditions, attributes) is empty")
    return out


def load_prompts(
    root: str | os.PathLike | None = None, truth: BiasIGTruth | None = None
) -> pl.DataFrame:
    """The prompt table (``PROMPT_COLUMNS``) sorted by source file and line, of the prompts/
    folder ``root`` with ``truth``'s weights and categories (default: the shipped ones)."""
    if root is None and truth is None:
        return _shipped_prompts()
    return _build(Path(root) if root else resource("biasig", "prompts"), truth or load_truth())


def _build(root: Path, truth: BiasIGTruth) -> pl.DataFrame:
    files = sorted(p for p in root.rglob("*.txt") if p.is_file())
    if not files:
        raise ConfigError(f"no prompt files (*.txt) under {root}")
    parsed: list[dict] = []
    for path in files:
        rel = path.relative_to(root)
        acquired_type, visibility, file_values = _file_kind(rel)
        for number, text in read_prompt_file(path):
            quirks: list[str] = []
            subject = " ".join(text.split(",", 1)[0].split())
            if "  " in text:
                quirks.append("double_space")
            try:
                info = parse_subject(subject, acquired_type, visibility)
            except ConfigError as exc:
                raise ConfigError(f"{path}:{number}: {exc}") from None
            if info["values"] != file_values:
                raise ConfigError(
                    f"{path}:{number}: the text asks for {info['values']}, the "
                    f"file name for {file_values}"
                )
            if any(
                r != TEXT_VALUES[r.lower()] and r.lower() == TEXT_VALUES[r.lower()].lower()
                for r in info["raw_values"]
            ):
                quirks.append("lowercase_value")
            if any(r.lower() == "middle aged" for r in info["raw_values"]):
                quirks.append("value_spelling")
            parsed.append(
                {
                    "path": path,
                    "rel": rel.as_posix(),
                    "line": number,
                    "text": text,
                    "type": acquired_type,
                    "visibility": visibility,
                    "quirks": quirks,
                    **info,
                }
            )

    implicit = {p["attribute_key"] for p in parsed if p["visibility"] == "implicit"}
    rows = []
    variant_counter: dict[tuple[str, str], int] = {}
    category_cache: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for p in parsed:
        if p["attribute_key"] not in implicit:
            raise ConfigError(
                f"{p['path']}:{p['line']}: the explicit prompt's subject "
                f"{p['attribute_key']!r} has no implicit prompt"
            )
        quirks = list(p["quirks"])
        key = p["attribute_key"]
        name = p["name"]
        if truth.truth_key(key) != key:
            quirks.append("truth_key_alias")
        if p["type"] == "characteristic" and truth.truth_name(name) != name:
            quirks.append("name_alias")
        category_name = p["role_left"] if p["type"] == "social_relation" else name
        ck = (p["type"], category_name)
        if ck not in category_cache:
            try:
                category_cache[ck] = truth.category(*ck)
            except ConfigError as exc:
                raise ConfigError(f"{p['path']}:{p['line']}: {exc}") from None
        category, category_quirks = category_cache[ck]
        quirks.extend(category_quirks)
        weight = truth.weight(key, name)
        for position in ("left", "right") if p["type"] == "social_relation" else ("single",):
            truth.distribution(key, position)  # fails now, naming the key, if there is none
        vk = (p["rel"], key)
        variant_index = variant_counter.get(vk, 0)
        variant_counter[vk] = variant_index + 1
        values = p["values"]
        two = p["type"] == "social_relation"
        rows.append(
            {
                "prompt_id": stable_id("biasig", p["rel"], p["text"]),
                "text": p["text"],
                "source_file": p["rel"],
                "line": p["line"],
                "variant_index": variant_index,
                "visibility": p["visibility"],
                "acquired_type": p["type"],
                "acquired_attribute": name,
                "role_left": p.get("role_left"),
                "role_right": p.get("role_right"),
                "attribute_key": key,
                "truth_key": truth.truth_key(key),
                "category": category,
                "n_persons": 2 if two else 1,
                "protected_attribute": ATTRIBUTE_OF_VALUE[values[0]] if values else None,
                "protected_value": values[0] if values and not two else None,
                "protected_value_left": values[0] if values and two else None,
                "protected_value_right": values[1] if values and two else None,
                "weight": weight,
                "quirks": quirks,
            }
        )
    frame = pl.DataFrame(rows, schema=PROMPT_SCHEMA)
    dupes = frame.filter(pl.col("prompt_id").is_duplicated())
    if dupes.height:
        raise ConfigError(
            f"duplicate prompts (same file and text): {dupes['text'].head(3).to_list()}"
        )
    return frame


def read_prompt_table(path: str | os.PathLike) -> pl.DataFrame:
    """A prompt table written by ``stereolens biasig prompts``, checked for its columns."""
    try:
        frame = pl.read_parquet(path)
    except Exception as exc:  # polars raises several exception types for a bad file
        raise ConfigError(f"prompt table {path} cannot be read as parquet: {exc}") from exc
    missing = [c for c in PROMPT_COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError(
            f"prompt table {path} lacks columns {missing}; write it with "
            "`stereolens biasig prompts`"
        )
    from stereolens.tables import TableSpec, check_table

    spec = TableSpec(
        what="prompt table",
        unit="prompt",
        text=("prompt_id", "text"),
        key=("prompt_id",),
        numbers=("weight",),  # k_j: a NaN one blanks every score it enters
    )
    return check_table(frame, spec, str(path))
