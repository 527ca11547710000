"""stereolens regenerate: which outputs a selection forces (the command runs snakemake
--forcerun on them; tests/test_faults_files.py runs it for real)."""

import pytest

from stereolens.regenerate import select_outputs, summary_rows

SUMMARY = "\n".join(
    "\t".join(row)
    for row in [
        ("output_file", "date", "rule", "log-file(s)", "status", "plan"),
        ("results/contextbias/images/sdxl/nurse/CF/0", "d", "generate_images", "l", "ok", "no"),
        ("results/contextbias/images/flux/nurse/CF/0", "d", "generate_images", "l", "ok", "no"),
        (
            "results/contextbias/extractions/qwen/sdxl/nurse/CF/0.jsonl",
            "d",
            "extract_contextbias_attributes",
            "l",
            "ok",
            "no",
        ),
        (
            "results/biasig/images/sdxl/occupation/implicit/0",
            "d",
            "generate_images",
            "l",
            "ok",
            "n",
        ),
        (
            "results/lvlm/responses/qwen/image/story/gender/female/0.jsonl",
            "d",
            "respond_lvlm",
            "",
            "",
            "",
        ),
        ("results/contextbias/attributes.parquet", "d", "merge_contextbias_attributes", "", "", ""),
    ]
)


def test_summary_rows_and_selections():
    rows = summary_rows(SUMMARY)
    assert len(rows) == 6 and rows[0] == (
        "results/contextbias/images/sdxl/nurse/CF/0",
        "generate_images",
    )
    # a model, whatever its role: sdxl's generation in both benchmarks and the extraction
    # of its images; never a merged table (it follows as downstream)
    assert select_outputs(rows, models=["sdxl"]) == [
        "results/contextbias/images/sdxl/nurse/CF/0",
        "results/contextbias/extractions/qwen/sdxl/nurse/CF/0.jsonl",
        "results/biasig/images/sdxl/occupation/implicit/0",
    ]
    assert select_outputs(rows, models=["sdxl"], benchmarks=["biasig"]) == [
        "results/biasig/images/sdxl/occupation/implicit/0"
    ]
    # an extractor or audited LVLM is a model too
    assert select_outputs(rows, models=["qwen"]) == [
        "results/contextbias/extractions/qwen/sdxl/nurse/CF/0.jsonl",
        "results/lvlm/responses/qwen/image/story/gender/female/0.jsonl",
    ]
    assert select_outputs(rows, benchmarks=["lvlm"]) == [
        "results/lvlm/responses/qwen/image/story/gender/female/0.jsonl"
    ]
    assert select_outputs(rows, shards=["results/contextbias/images/flux/nurse/CF/0/"]) == [
        "results/contextbias/images/flux/nurse/CF/0"
    ]
    assert select_outputs(rows, rules=["merge_contextbias_attributes"]) == [
        "results/contextbias/attributes.parquet"
    ]
    with pytest.raises(ValueError, match="not an output of this workflow"):
        select_outputs(rows, shards=["results/contextbias/images/nope/x/CF/0"])


# ---- damaged tables (issue 24, item 3): detected where read, named with the command that
# mends them; a run is refused while one is there, so Snakemake never calls it complete


def _finished_tables(root):
    """A results folder with a merged part, the merged tables and an extraction shard."""
    import polars as pl

    part = root / "results/contextbias/merged/qwen/sdxl"
    part.mkdir(parents=True)
    frame = pl.DataFrame({"extractor": ["qwen"] * 3, "model": ["sdxl"] * 3, "x": [1, 2, 3]})
    frame.write_parquet(part / "attributes_raw.parquet")
    frame.write_parquet(part / "images.parquet")
    frame.write_parquet(root / "results/contextbias/images.parquet")
    shard = root / "results/contextbias/extractions/qwen/sdxl/nurse/CF/0.jsonl"
    shard.parent.mkdir(parents=True)
    shard.write_text('{"a": 1}\n{"a": 2}\n')
    return part / "attributes_raw.parquet", shard


def _truncate(path, keep=None):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep is None else keep])


def test_damage_check_sees_truncated_parquet_and_cut_jsonl(tmp_path):
    from stereolens.damage import problem, scan

    part, shard = _finished_tables(tmp_path)
    assert scan(tmp_path / "results") == []
    _truncate(part)
    shard.write_text('{"a": 1}\n{"a": ')
    # an image shard's files and a cache are not scanned (images are verified by hash)
    cut = tmp_path / "results/contextbias/images/sdxl/nurse/CF/0/metadata.jsonl"
    cut.parent.mkdir(parents=True)
    cut.write_text("{")
    found = dict(scan(tmp_path / "results"))
    assert set(found) == {str(part), str(shard)}
    assert "footer" in found[str(part)] and "newline" in found[str(shard)]
    assert "too short" in problem(_write(tmp_path / "x.parquet", b"PAR1"))
    assert "magic" in problem(_write(tmp_path / "y.parquet", b"x" * 40))
    assert problem(_write(tmp_path / "empty.jsonl", b"")) is None
    assert problem(tmp_path / "absent.parquet") is None


def _write(path, data):
    path.write_bytes(data)
    return path


def test_reading_a_damaged_table_names_it_and_the_mend_command(tmp_path, monkeypatch):
    from stereolens.contextbias.merge import merge_extraction_parts
    from stereolens.damage import DamagedTable
    from stereolens.tables import read_table

    monkeypatch.chdir(tmp_path)
    part, _ = _finished_tables(tmp_path)
    rel = part.relative_to(tmp_path)
    _truncate(part)
    with pytest.raises(DamagedTable) as err:
        read_table(rel, "attributes table")
    text = str(err.value)
    assert str(rel) in text and f"stereolens regenerate --shard {rel}" in text, text
    # the merge of the parts refuses before reading any of them
    images = rel.parent / "images.parquet"
    with pytest.raises(DamagedTable) as err:
        merge_extraction_parts([rel], [images], tmp_path / "a.parquet", tmp_path / "i.parquet")
    assert f"regenerate --shard {rel}" in str(err.value)
    assert not (tmp_path / "i.parquet").exists()
    # a hand-made table elsewhere that does not parse is named, without the regenerate hint
    bad = _write(tmp_path / "mine.csv", b'a,b\n1,"2\n')
    with pytest.raises(Exception) as err:
        read_table(bad, "attributes table")
    assert "mine.csv" in str(err.value) and "regenerate" not in str(err.value)


def test_parse_check_refuses_a_damaged_results_folder_and_regenerate_only_warns(
    tmp_path, monkeypatch, capsys
):
    from stereolens.damage import REGENERATING_ENV, DamagedTable
    from stereolens.workflow_support import check_inputs, check_results_intact, housekeeping

    monkeypatch.chdir(tmp_path)
    part, _ = _finished_tables(tmp_path)
    check_results_intact(["config/run.yaml"])
    _truncate(part)
    rel = part.relative_to(tmp_path)
    with pytest.raises(DamagedTable) as err:
        check_results_intact(["config/run.yaml"])
    assert f"regenerate --shard {rel} --configfile config/run.yaml" in str(err.value)
    with pytest.raises(DamagedTable):
        check_inputs([str(rel), str(rel.parent / "images.parquet")])
    # an unlock only warns (regenerate refuses to run on a locked folder)
    check_results_intact(["config/run.yaml"], warn_only=housekeeping(["--unlock"]))
    assert str(rel) in capsys.readouterr().err
    assert not housekeeping(["-n", "--configfile", "c.yaml"])
    monkeypatch.setenv(REGENERATING_ENV, "1")
    check_results_intact(["config/run.yaml"])
    assert str(rel) in capsys.readouterr().err


@pytest.mark.slow
def test_snakemake_dry_run_refuses_while_a_merged_part_is_damaged(tmp_path):
    """The issue's run: a finished output's input is damaged; `snakemake -n` must not say
    "Nothing to be done" (nor plan around it): it refuses, naming the file and the mend."""
    import subprocess

    from conftest import copy_workflow, workflow_env
    from test_workflow import SNAKEMAKE

    wd = copy_workflow(tmp_path / "wd")
    part, _ = _finished_tables(wd)
    _truncate(part)
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", "config/demo.yaml"],
        cwd=wd,
        env=workflow_env(),
        capture_output=True,
        text=True,
    )
    text = out.stdout + out.stderr
    rel = "results/contextbias/merged/qwen/sdxl/attributes_raw.parquet"
    assert out.returncode != 0, text[-2000:]
    assert f"stereolens regenerate --shard {rel} --configfile config/demo.yaml" in text, text
    assert "Nothing to be done" not in text


def test_regenerate_runs_snakemake_with_the_damage_check_warning_only(tmp_path, monkeypatch):
    """The parse refuses while a table is damaged; regenerate is how one is mended, so its
    Snakemake calls (the summary and the forced run) carry REGENERATING_ENV."""
    import stat

    from stereolens.cli import main
    from stereolens.damage import REGENERATING_ENV

    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "snakemake"
    part = "results/contextbias/merged/qwen/sdxl/attributes_raw.parquet"
    fake.write_text(
        "#!/bin/sh\n"
        f'[ "${REGENERATING_ENV}" = 1 ] || {{ echo "refused: damaged" >&2; exit 1; }}\n'
        f'echo "{part}\td\tmerge_contextbias_model_attributes\tl\tok\tno"\n'
        'echo "$@" > forced.txt\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.delenv(REGENERATING_ENV, raising=False)
    rc = main(["regenerate", "--shard", part, "--snakemake", str(fake)])
    assert rc == 0
    assert f"--forcerun {part}" in (tmp_path / "forced.txt").read_text()
