"""Reading a table from any of its file formats, the declared (pandera) schemas of the tables
the metrics read, and :func:`check_table`, the check every metrics CLI applies before computing
(docs/troubleshooting.md, "Bad input is refused")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from stereolens.validation import ConfigError
from stereolens.vocabulary import Vocabulary, apply_mapping, conform_all, rows_where

CONDITIONS = ("CF", "CA-R", "CA-U")
NOT_LABELS = ("unknown", "none", "")


@dataclass(frozen=True)
class TableSpec:
    """What a table must hold. ``text``/``ints``/``bools``: required columns of that type
    (``nullable``: the ones that may be null); ``optional``: (name, type) columns checked
    when present; ``key``: columns that identify a row (optional ones join the key when
    present); ``allowed``: column -> closed set of values; ``unit``: what a row is, for the
    messages."""

    what: str
    unit: str
    text: tuple[str, ...] = ()
    ints: tuple[str, ...] = ()
    bools: tuple[str, ...] = ()
    nullable: tuple[str, ...] = ()
    optional: tuple[tuple[str, type], ...] = ()
    key: tuple[str, ...] = ()
    allowed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    extra: Callable[[pl.DataFrame], list[str]] | None = None
    wide: tuple[str, ...] = ()
    """Long text columns a lazily read table is checked without loading (type and presence
    from the file's schema; values not checked)."""
    vocabularies: tuple[Vocabulary, ...] = ()
    """Closed vocabularies beyond ``allowed``, in order (a ``by`` column's own vocabulary
    first); a benchmark adds its own with dataclasses.replace."""
    numbers: tuple[str, ...] = ()
    """Numeric columns a formula needs: present ones must be set, finite and not negative."""

    def dtypes(self) -> dict[str, pl.DataType]:
        """The declared type of every column the spec names (for reading CSV and JSON)."""
        out = {n: pl.String for n in self.text} | {n: pl.Int64 for n in self.ints}
        out |= {n: pl.Boolean for n in self.bools} | {n: pl.Float64 for n in self.numbers}
        return out | {n: _TYPES[k] for n, k in self.optional}


def _no_missing_labels(frame: pl.DataFrame) -> list[str]:
    bad = frame.with_row_index("_row").filter(
        pl.col("label").str.strip_chars().str.to_lowercase().is_in(list(NOT_LABELS))
    )
    if not bad.height:
        return []
    rows = bad["_row"].head(5).to_list()
    return [
        f"column label: {bad.height} row(s) are unknown, none or empty (rows {rows}); drop "
        "them: they are never counted"
    ]


ATTRIBUTES = TableSpec(
    what="attributes table",
    unit="label of an image",
    text=("model", "role", "condition", "image_id", "cohort", "dimension", "label"),
    optional=(("extractor", str), ("variant", str), ("prompt_id", str)),
    key=("extractor", "model", "image_id", "dimension", "label"),
    allowed=(("condition", CONDITIONS),),
    extra=_no_missing_labels,
)
IMAGES = TableSpec(
    what="images table",
    unit="image",
    text=("model", "condition", "image_id"),
    optional=(("extractor", str), ("role", str), ("status", str)),
    key=("extractor", "model", "image_id"),
    allowed=(("condition", CONDITIONS),),
)
ANSWERS = TableSpec(
    what="answers table",
    unit="answer of an image and position",
    text=("model", "image_id", "position", "gender", "race", "age"),
    nullable=("gender", "race", "age"),
    optional=(("variant", str), ("status", str), ("prompt_id", str)),
)
RESPONSES = TableSpec(
    what="responses table",
    unit="response",
    text=("model", "task", "axis", "group", "image_id", "prompt_id", "response"),
    nullable=("response",),
    optional=(
        ("setting", str),
        ("subject", str),
        ("stratum", str),
        ("correct", bool),
        ("refusal", bool),
        ("refusal_rule", bool),
        ("refusal_judge", bool),
        ("refusal_phrase", str),
        ("empty", bool),
    ),
    wide=("response",),
    key=("model", "setting", "task", "axis", "group", "image_id", "prompt_id"),
)
STORY_ATTRIBUTES = TableSpec(
    what="story attributes table",
    unit="attribute value of a story",
    text=("model", "axis", "group", "image_id", "prompt_id", "attribute", "value"),
    optional=(("setting", str),),
    key=("model", "setting", "axis", "group", "image_id", "prompt_id", "attribute", "value"),
)
TERM_JUDGEMENTS = TableSpec(
    what="term judgements table",
    unit="judged pair",
    text=("model", "axis", "prompt_id", "group_a", "group_b", "winner"),
    ints=("pair_index",),
    nullable=("winner",),
    optional=(("setting", str),),
    key=("model", "setting", "axis", "prompt_id", "pair_index", "group_a", "group_b"),
)

_TYPES = {str: pl.String, int: pl.Int64, bool: pl.Boolean}
_TYPE_NAMES = {str: "text", int: "an integer", bool: "true/false"}


def _schema(spec: TableSpec, frame: pl.DataFrame):
    import pandera.polars as pa

    columns = {}
    for kind, names in ((str, spec.text), (int, spec.ints), (bool, spec.bools)):
        for name in names:
            columns[name] = pa.Column(_TYPES[kind], nullable=name in spec.nullable, required=True)
    for name, kind in spec.optional:
        if name in frame.columns:
            columns[name] = pa.Column(_TYPES[kind], nullable=True, required=False)
    key = [c for c in spec.key if c in columns]
    return pa.DataFrameSchema(columns, unique=key or None, strict=False), key


def _dtype_kind(dtype: pl.DataType) -> type | None:
    if dtype in (pl.String, pl.Categorical, pl.Enum) or isinstance(dtype, pl.Categorical):
        return str
    if dtype.is_integer():
        return int
    if dtype == pl.Boolean:
        return bool
    return None


def _type_problems(spec: TableSpec, frame: pl.DataFrame) -> list[str]:
    wanted = {n: str for n in spec.text} | {n: int for n in spec.ints}
    wanted |= {n: bool for n in spec.bools}
    wanted |= {n: k for n, k in spec.optional if n in frame.columns}
    out = []
    for name in spec.numbers:
        dtype = frame.schema.get(name)
        if dtype is not None and dtype != pl.Null and not dtype.is_numeric():
            out.append(f"column {name} has type {dtype}; it must be a number (convert it)")
    for name, kind in wanted.items():
        if name not in frame.columns:
            continue
        dtype = frame.schema[name]
        if dtype == pl.Null:  # an all-null column read from CSV or JSON
            continue
        got = _dtype_kind(dtype)
        if got is not kind:
            out.append(
                f"column {name} has type {dtype}; it must be {_TYPE_NAMES[kind]} (convert it, "
                f"e.g. pl.col({name!r}).cast(pl.{_TYPES[kind]}))"
            )
    return out


def read_table(
    path: str | Path,
    what: str = "table",
    *,
    lazy: bool = False,
    columns: list[str] | tuple[str, ...] | None = None,
    spec: TableSpec | None = None,
):
    """A table from parquet, CSV or JSON lines (by file suffix); an unreadable file is a
    ConfigError naming it. ``lazy``: a LazyFrame; ``columns``: only these (those it has);
    ``spec``: CSV and JSON lines read with its declared column types."""
    path = Path(path)
    suffix = path.suffix.lower()
    readers = {
        ".parquet": pl.scan_parquet,
        ".csv": pl.scan_csv,
        ".jsonl": pl.scan_ndjson,
        ".ndjson": pl.scan_ndjson,
    }
    if suffix not in readers:
        raise ConfigError(
            f"{what} {path}: unknown file type {suffix!r}; use .parquet, .csv or .jsonl"
        )
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        if spec is not None and suffix == ".csv":
            frame = pl.scan_csv(path, schema_overrides=spec.dtypes())
        elif spec is not None and suffix != ".parquet":  # overrides only of keys it has
            have = pl.scan_ndjson(path, infer_schema_length=None).collect_schema().names()
            dtypes = {c: t for c, t in spec.dtypes().items() if c in have}
            frame = pl.scan_ndjson(path, schema_overrides=dtypes, infer_schema_length=None)
        else:
            frame = readers[suffix](path)
        if columns is not None:
            have = frame.collect_schema().names()
            frame = frame.select([c for c in have if c in columns])
        return frame if lazy else frame.collect()
    except (pl.exceptions.PolarsError, OSError) as exc:
        from stereolens.damage import read_failure

        raise read_failure(path, exc, what) from exc


def check_table(frame, spec: TableSpec, source: str = ""):
    """``frame`` if it fits ``spec``, else ConfigError naming the table, the first problem
    and how many more there are. Categorical text comes back plain, a closed vocabulary's
    values in their allowed spelling; a LazyFrame is checked without loading its
    ``spec.wide`` columns and returned lazy."""
    if isinstance(frame, pl.LazyFrame):
        return _check_lazy(frame, spec, source)
    return _check(frame, spec, source)[0]


def _where(spec: TableSpec, source: str) -> str:
    return f"{spec.what}{f' {source}' if source else ''}"


def _check(frame: pl.DataFrame, spec: TableSpec, source: str):
    """(checked frame, [(vocabulary, mapping)] applied to it)."""
    import pandera.errors as pe

    where = _where(spec, source)
    required = [*spec.text, *spec.ints, *spec.bools]
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ConfigError(
            f"{where} lacks column(s) {', '.join(missing)}; it needs {', '.join(required)} "
            f"(one row per {spec.unit})"
        )
    if frame.height == 0:
        raise ConfigError(
            f"{where} is empty: there is nothing to score; check the step that wrote it"
        )
    frame = frame.with_columns(
        pl.col(c).cast(pl.String) for c, t in frame.schema.items() if isinstance(t, pl.Categorical)
    )
    # an all-null column (no exam rows: no subject) has no type of its own: give it its type
    expected = spec.dtypes()
    frame = frame.with_columns(
        pl.col(c).cast(expected[c])
        for c, t in frame.schema.items()
        if t == pl.Null and c in expected
    )
    problems = _type_problems(spec, frame)
    applied: list = []
    if not problems:
        frame, applied, problems = conform_all(frame, _vocabularies(spec), where)
    if not problems:
        problems = _number_problems(frame, spec)
    if not problems:
        schema, key = _schema(spec, frame)
        try:
            schema.validate(frame, lazy=True)
        except pe.SchemaErrors as exc:
            problems = _describe(exc.failure_cases, spec, key)
        except pe.SchemaError as exc:  # pragma: no cover - lazy=True reports SchemaErrors
            problems = [str(exc).splitlines()[0]]
    if not problems and spec.extra is not None:
        problems = spec.extra(frame)
    if problems:
        more = f" (+{len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise ConfigError(f"{where}: {problems[0]}{more}")
    return frame, applied


def _vocabularies(spec: TableSpec) -> list[Vocabulary]:
    return [Vocabulary(c, tuple(v)) for c, v in spec.allowed] + list(spec.vocabularies)


def _number_problems(frame: pl.DataFrame, spec: TableSpec) -> list[str]:
    out = []
    for name in spec.numbers:
        if name not in frame.columns:
            continue
        v = pl.col(name).cast(pl.Float64)
        for test, what in (
            (v.is_null(), "null"),
            (v.is_nan(), "NaN"),
            (v.is_infinite(), "infinite"),
            (v < 0, "negative"),
        ):
            n, rows = rows_where(frame, test)
            if n:
                out.append(
                    f"column {name}: {n} row(s) are {what} (rows {rows}); a formula needs a "
                    "finite, non-negative number there: fix or drop them"
                )
    return out


def _check_lazy(frame: pl.LazyFrame, spec: TableSpec, source: str) -> pl.LazyFrame:
    """check_table of a LazyFrame: ``spec.wide`` columns checked from the schema, the others
    loaded and checked; the frame comes back lazy, with check_table's casts."""
    schema = frame.collect_schema()
    wide = tuple(c for c in spec.wide if c in schema)
    where = _where(spec, source)
    required = [*spec.text, *spec.ints, *spec.bools]
    missing = [c for c in required if c not in schema]
    if missing:
        raise ConfigError(
            f"{where} lacks column(s) {', '.join(missing)}; it needs {', '.join(required)} "
            f"(one row per {spec.unit})"
        )
    problems = _type_problems(spec, pl.DataFrame(schema=schema).select(wide))
    if problems:
        raise ConfigError(f"{where}: {problems[0]}")
    narrow = replace(
        spec,
        text=tuple(c for c in spec.text if c not in wide),
        key=tuple(c for c in spec.key if c not in wide),
        wide=(),
    )
    wanted = set(narrow.dtypes())
    checked, applied = _check(
        frame.select([c for c in schema.names() if c in wanted]).collect(), narrow, source
    )
    out = frame.with_columns(pl.col(c).cast(t) for c, t in checked.schema.items())
    for vocab, mapping in applied:
        out = apply_mapping(out, vocab, mapping)
    return out


def _describe(cases: pl.DataFrame, spec: TableSpec, key: list[str]) -> list[str]:
    out = []
    for (column, check), group in cases.group_by("column", "check", maintain_order=True):
        rows = sorted(r for r in group["index"].to_list() if r is not None)[:5]
        n = group.height
        if check == "multiple_fields_uniqueness":
            out.append(
                f"{n} rows repeat the key ({', '.join(key)}) (rows {rows}): a {spec.unit} must "
                "appear once, or it is counted twice; drop the duplicates (e.g. .unique())"
            )
        elif check == "not_nullable":
            out.append(f"column {column}: {n} row(s) are null (rows {rows}); fill or drop them")
        else:
            out.append(f"column {column}: {n} row(s) fail {check} (rows {rows})")
    return out


def write_table(path: str | Path, frame: pl.DataFrame) -> None:
    """Write ``frame`` to ``path`` (parquet, atomically, its folder made if missing) and
    print one line saying so: what every command that writes a table prints."""
    from stereolens.atomic import write_parquet

    write_parquet(path, frame)
    print(f"wrote {path} ({frame.height} rows)")


def write_tables(out_dir: str | Path, tables: dict[str, pl.DataFrame]) -> None:
    """Write each table to ``out_dir``/<file name> (:func:`write_table`): every metrics CLI's."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        write_table(out / name, frame)


def check_exam_rows(responses: pl.DataFrame, source: str = "") -> None:
    """Exam rows need a subject and a true/false ``correct`` (``responses`` may be lazy)."""
    exam = responses.filter(pl.col("task") == "exam")
    if isinstance(exam, pl.LazyFrame):
        names = exam.collect_schema().names()
        exam = exam.select([c for c in ("subject", "correct") if c in names]).collect()
    if exam.height:
        check_table(
            exam,
            TableSpec(
                what="responses table (exam rows)",
                unit="graded exam answer",
                text=("subject",),
                bools=("correct",),
                nullable=("correct",),
            ),
            source,
        )
