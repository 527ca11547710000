"""Bad input is refused before the queue (at parse time, `snakemake -n` fails), naming the
file and what to do; the same checks back `stereolens check-config`."""

import json
import subprocess

import pytest
import yaml
from conftest import copy_workflow, workflow_env
from test_workflow import SNAKEMAKE

from stereolens.config import load_config
from stereolens.contextbias.prompts import ROLE_PATTERN, check_prompt_bank, role_slug
from stereolens.validation import ConfigError


def _config(tmp_path, bank=None, **contextbias):
    config = yaml.safe_load(open("config/demo.yaml"))
    config["contextbias"].update(contextbias)
    if bank is not None:
        path = tmp_path / "bank.json"
        path.write_text(json.dumps(bank))
        config["contextbias"]["prompt_bank"] = str(path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _bank(role="nurse", conditions=("CF", "CA-R", "CA-U"), text=None):
    words = role.replace("_", " ")
    return [
        {
            "role": role,
            "context": c,
            "prompt": text if text is not None else f"a photo of a {words}",
        }
        for c in conditions
    ]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"roles": ["nurse", "nures"]}, "'nures' (did you mean nurse?)"),
        ({"roles": ["nurse"], "bank": _bank("nurse", ("CF", "CA-R"))}, "no prompt for nurse CA-U"),
        ({"roles": ["nurse"], "bank": _bank("nurse", text="  ")}, "has an empty prompt"),
        ({"roles": ["Flight Attendant"], "bank": _bank("Flight Attendant")}, "'flight_attendant'"),
        ({"roles": ["café_owner"], "bank": _bank("café_owner")}, "'cafe_owner'"),
        ({"roles": ["a/b"], "bank": _bank("a/b")}, "cannot name a folder"),
        ({"roles": ["x" * 300], "bank": _bank("x" * 300)}, "at most 64"),
    ],
)
def test_check_config_refuses_bad_banks(tmp_path, kwargs, needle):
    bank = kwargs.pop("bank", None)
    path = _config(tmp_path, bank, **kwargs)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert needle in str(err.value), str(err.value)


def test_role_slugs_fit_the_pattern():
    import re

    for name in ("Flight Attendant", "café owner", "a/b", "x" * 300, "ÄÖÜ"):
        assert re.fullmatch(ROLE_PATTERN, role_slug(name)), name


def test_malformed_bank_and_registry_name_the_file_line_and_column(tmp_path):
    bank = tmp_path / "bank.json"
    bank.write_text('[{"role": "nurse", "context": "CF",]')
    path = _config(tmp_path, roles=["nurse"])
    cfg = yaml.safe_load(path.read_text())
    cfg["contextbias"]["prompt_bank"] = str(bank)
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(
        ConfigError, match=r"prompt bank .*bank.json cannot be read as JSON.*line 1"
    ):
        load_config(path)
    registry = tmp_path / "models.yaml"
    registry.write_text(open("config/models.yaml").read() + "\n  bad: [unclosed\n")
    cfg["contextbias"]["prompt_bank"] = None
    cfg["registry"] = str(registry)
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=r"models.yaml, line \d+, column \d+: YAML error"):
        load_config(path)
    broken = tmp_path / "broken.yaml"
    broken.write_text("registry: config/models.yaml\ncontextbias:\n  roles: [nurse\n  x: 1\n")
    out = subprocess.run(
        ["stereolens", "check-config", "--configfile", str(broken)],
        env=workflow_env(),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "broken.yaml, line 4, column 4" in out.stderr


@pytest.mark.slow
def test_snakemake_dry_run_refuses_at_parse_time(repo_root, tmp_path):
    wd = copy_workflow(tmp_path)
    cases = {
        "unknown": ({"roles": ["nurse", "nures"]}, None, "did you mean nurse"),
        "missing": ({"roles": ["nurse"]}, _bank("nurse", ("CF", "CA-R")), "no prompt for nurse"),
        "name": ({"roles": ["Flight Attendant"]}, _bank("Flight Attendant"), "cannot name"),
    }
    for name, (kwargs, bank, needle) in cases.items():
        sub = tmp_path / name
        sub.mkdir()
        path = _config(sub, bank, **kwargs)
        out = subprocess.run(
            [SNAKEMAKE, "-n", "--configfile", str(path)],
            cwd=wd,
            env=workflow_env(),
            capture_output=True,
            text=True,
        )
        text = out.stdout + out.stderr
        assert out.returncode != 0 and needle in text, (name, text[-2000:])
        assert "Missing input files" not in text and "PeriodicWildcardError" not in text


def test_check_prompt_bank_returns_the_roles():
    config = yaml.safe_load(open("config/demo.yaml"))
    from stereolens.config import validate_config

    validate_config(config)
    assert check_prompt_bank(config) == ["nurse", "carpenter"]
    config["contextbias"]["roles"] = None
    assert len(check_prompt_bank(config)) == 92
