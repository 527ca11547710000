"""Frozen settings per benchmark and the named presets (paper, released, a YAML file)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl
import pytest
import yaml
from polars.testing import assert_frame_equal
from test_contextbias_metrics import _bootstrap_table

from stereolens.biasig.settings import BiasIGSettings
from stereolens.cli import main
from stereolens.config import validate_config
from stereolens.contextbias.settings import ContextBiasSettings
from stereolens.lvlm.settings import LVLMSettings
from stereolens.settings import settings_json
from stereolens.validation import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "src/stereolens/resources/schemas"
PRESETS = ROOT / "src/stereolens"


def _defaults(bench: str, *path: str) -> dict:
    props = yaml.safe_load((SCHEMAS / f"{bench}.schema.yaml").read_text())["properties"]
    for key in path:
        props = props[key]["properties"]
    return {k: v["default"] for k, v in props.items() if "default" in v}


def test_paper_settings_are_the_schema_defaults():
    cb = dataclasses.asdict(ContextBiasSettings.preset())
    assert cb == {k: v for k, v in _defaults("contextbias", "metrics").items()}
    bg = dataclasses.asdict(BiasIGSettings.preset())
    assert bg == {k: v for k, v in _defaults("biasig").items() if k in bg}
    lv = LVLMSettings.preset()
    want = _defaults("lvlm", "metrics")
    assert {f.name: getattr(lv, f.name) for f in dataclasses.fields(lv)} == {
        **want,
        "formulas": lv.formulas,
        "seed": _defaults("lvlm")["seed"],
    }
    assert dict(lv.formulas) == {"story": "story_tvd", "term": "term_tvd", "exam": "exam_tvd"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        ContextBiasSettings.preset().k_definition = "cell"


def test_released_presets_list_only_what_differs():
    paper, released = ContextBiasSettings.preset(), ContextBiasSettings.preset("released")
    diff = {
        f.name: getattr(released, f.name)
        for f in dataclasses.fields(paper)
        if getattr(paper, f.name) != getattr(released, f.name)
    }
    assert diff == {
        "k_definition": "cell",
        "bootstrap_draws": "unpaired",
        "bootstrap_interval": "percentile",
    }
    shipped = yaml.safe_load((PRESETS / "contextbias/presets/released.yaml").read_text())
    assert shipped == {"metrics": diff}
    assert BiasIGSettings.preset("released") == dataclasses.replace(
        BiasIGSettings.preset(), eta_variant="released"
    )
    for bench in ("contextbias", "biasig", "lvlm"):
        assert yaml.safe_load((PRESETS / bench / "presets/paper.yaml").read_text()) == {}
    with pytest.raises(ConfigError, match="neither a shipped preset \\(paper\\)"):
        LVLMSettings.preset("released")  # no released code


def test_config_preset_key_and_written_keys_win(repo_root):
    config = yaml.safe_load((repo_root / "config/demo.yaml").read_text())
    config["contextbias"]["preset"] = "released"
    config["contextbias"]["metrics"] = {"bootstrap_interval": "bc-t"}
    config["biasig"]["preset"] = "released"
    config = validate_config(config)
    st = ContextBiasSettings.from_config(config["contextbias"])
    assert (st.k_definition, st.bootstrap_draws) == ("cell", "unpaired")
    assert st.bootstrap_interval == "bc-t"  # the config's own key wins over the preset
    assert BiasIGSettings.from_config(config["biasig"]).eta_variant == "released"
    plain = validate_config(yaml.safe_load((repo_root / "config/demo.yaml").read_text()))
    assert plain["contextbias"]["preset"] == "paper"
    assert ContextBiasSettings.from_config(plain["contextbias"]) == ContextBiasSettings.preset()


def test_a_user_preset_file_reaches_every_key(tmp_path):
    path = tmp_path / "strict.yaml"
    path.write_text("metrics:\n  alpha: 0.01\n  ccs_min_count: 3\n")
    st = ContextBiasSettings.preset(str(path))
    assert (st.alpha, st.ccs_min_count, st.k_definition) == (0.01, 3, "model")
    (tmp_path / "bad.yaml").write_text("metrics:\n  alpha: 2\n")
    with pytest.raises(ConfigError, match="alpha"):
        ContextBiasSettings.preset(str(tmp_path / "bad.yaml"))
    with pytest.raises(ConfigError, match="paper, released"):
        ContextBiasSettings.preset("relased")


def _run(tmp_path: Path, name: str, *flags: str) -> dict[str, pl.DataFrame]:
    out = tmp_path / name
    argv = ["contextbias", "metrics", "--attributes", str(tmp_path / "a.parquet")]
    argv += ["--images", str(tmp_path / "i.parquet"), "--out", str(out), *flags]
    argv += ["--preset", '{"metrics": {"replicates": 20, "matched_draws": 2}}']
    assert main(argv) == 0
    return {p.stem: pl.read_parquet(p) for p in sorted(out.glob("*.parquet"))}


def test_cli_preset_equals_a_file_of_its_keys_a_flag_and_the_rules_json(tmp_path):
    att, img = _bootstrap_table()
    att.write_parquet(tmp_path / "a.parquet")
    img.write_parquet(tmp_path / "i.parquet")
    keys = tmp_path / "keys.yaml"
    keys.write_text("metrics: {k_definition: cell, bootstrap_interval: percentile}\n")
    # a preset file of two of released's keys, its third key by the documented flag
    flags = _run(tmp_path, "flags", "--preset", str(keys), "--bootstrap-draws", "unpaired")
    preset = _run(tmp_path, "preset", "--preset", "released")
    paper = _run(tmp_path, "paper")
    for name, table in flags.items():
        assert_frame_equal(table, preset[name])
    boot = preset["bootstrap"]
    assert set(boot["draws"]) == {"unpaired"} and set(boot["interval"]) != set(
        paper["bootstrap"]["interval"]
    )
    assert set(paper["bootstrap"]["replicates"]) == {20}  # the later --preset on top
    # the workflow's rule passes the validated section as one JSON mapping
    section = {"metrics": dataclasses.asdict(ContextBiasSettings.preset("released"))}
    section["metrics"] |= {"replicates": 20, "matched_draws": 2}
    rule = _run(tmp_path, "rule", "--preset", settings_json(section, ("metrics",)))
    for name, table in flags.items():
        assert_frame_equal(table, rule[name])
    assert json.loads(settings_json(section, ("metrics",)))["metrics"]["k_definition"] == "cell"


def test_settings_json_passes_one_key_of_a_mapping():
    """A key "a.b" passes only b of a (the simulate rules: metrics.command.SIMULATE_SETTINGS), and
    the CLI fills the rest of a from the schema's defaults."""
    from stereolens.metrics.command import SIMULATE_SETTINGS
    from stereolens.settings import section_defaults

    section = section_defaults("contextbias")
    section["reader_correction"] |= {"replicates": 7, "flip_fraction": 0.3}
    got = json.loads(settings_json(section, SIMULATE_SETTINGS))
    assert got == {"reader_correction": {"sample_fraction": 0.5, "flip_fraction": 0.3, "seed": 0}}
    filled = section_defaults("contextbias", settings_json(section, SIMULATE_SETTINGS))
    assert filled["reader_correction"]["flip_fraction"] == 0.3
    assert (
        filled["reader_correction"]["replicates"]
        == section_defaults("contextbias")["reader_correction"]["replicates"]
    )
