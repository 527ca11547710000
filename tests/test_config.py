"""Config and registry validation: wrong keys and values stop the run with a
message naming the key and what is allowed."""

import copy
import subprocess
import sys

import pytest
import yaml

from stereolens.config import check_models, load_config, validate_config, validate_report_config
from stereolens.models.registry import load_registry
from stereolens.validation import ConfigError


@pytest.fixture
def demo(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    return yaml.safe_load((repo_root / "config/demo.yaml").read_text())


def test_shipped_configs_are_valid(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    for name in ("demo.yaml", "config.yaml"):
        config, registry = load_config(repo_root / "config" / name)
        assert config["contextbias"]["seeds"]["per_prompt"] >= 1
        assert all(g in registry for g in config["contextbias"]["generators"])
    paper, _ = load_config(repo_root / "config/config.yaml")
    assert paper["contextbias"]["generators"] == ["flux.1-dev", "sdxl", "sd3.5-large", "qwen-image"]
    assert paper["contextbias"]["seeds"]["per_prompt"] == 10


def test_unknown_key_is_named(demo):
    bad = copy.deepcopy(demo)
    bad["contextbias"]["sedes"] = {}
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    assert "contextbias" in str(err.value) and "sedes" in str(err.value)
    assert "allowed keys here" in str(err.value) and "seeds" in str(err.value)


def test_wrong_value_names_allowed_values(demo):
    bad = copy.deepcopy(demo)
    bad["contextbias"]["metrics"]["k_definition"] = "everything"
    with pytest.raises(ConfigError, match=r"contextbias\.metrics\.k_definition.*model, cell"):
        validate_config(bad)
    bad = copy.deepcopy(demo)
    bad["contextbias"]["seeds"]["per_prompt"] = 0
    with pytest.raises(ConfigError, match=r"contextbias\.seeds\.per_prompt"):
        validate_config(bad)


def test_defaults_are_filled(demo):
    config = validate_config(copy.deepcopy(demo))
    assert config["contextbias"]["extraction"]["cache"] is True
    assert config["contextbias"]["fix_articles"] is False


def test_a_report_config_is_validated_less_the_requirements():
    """A report's config made from a results folder: no key required, a list may be empty
    and a value null (the tables do not name it), defaults filled as for a run's; a wrong
    key or type is still refused."""
    with pytest.raises(ConfigError, match="registry"):
        validate_config({})
    config = validate_report_config(
        {"contextbias": {"generators": [], "canonicalisation": {"encoder": None}}}
    )
    assert "registry" not in config and config["contextbias"]["generators"] == []
    run = validate_config(
        {"registry": "r.yaml", "contextbias": {"generators": ["g"], "extractors": ["e"]}}
    )
    assert config["contextbias"]["canonicalisation"] == {
        **run["contextbias"]["canonicalisation"],
        "encoder": None,
    }
    assert config["contextbias"]["metrics"] == run["contextbias"]["metrics"]
    assert config["report"] == run["report"] and config["lvlm"]["enabled"] is False
    for bad in ({"contextbias": {"generators": "m"}}, {"lvlm": {"nonsense": 1}}):
        with pytest.raises(ConfigError):
            validate_report_config(bad)


def test_unknown_model_names_the_registry(demo):
    config = validate_config(copy.deepcopy(demo))
    config["contextbias"]["generators"].append("dall-e-9")
    with pytest.raises(ConfigError, match="dall-e-9.*not in the registry.*tiny-sd"):
        check_models(config, load_registry(config["registry"]))
    config = validate_config(copy.deepcopy(demo))
    config["contextbias"]["extractors"] = ["tiny-sd"]
    with pytest.raises(ConfigError, match="is a generator"):
        check_models(config, load_registry(config["registry"]))


def test_registry_errors(tmp_path):
    reg = tmp_path / "models.yaml"
    reg.write_text("generators:\n  x:\n    backend: vllm\n    model: a/b\n")
    with pytest.raises(ConfigError, match=r"generators\.x\.backend.*diffusers"):
        load_registry(reg)
    reg.write_text("generators:\n  x:\n    backend: diffusers\n    model: a/b\n    stepz: 3\n")
    with pytest.raises(ConfigError, match="stepz"):
        load_registry(reg)
    with pytest.raises(ConfigError, match="does not exist"):
        load_registry(tmp_path / "nope.yaml")


def test_fingerprint_ignores_runtime_settings(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    reg = load_registry("config/models.yaml")
    fp = reg["sdxl"].fingerprint()
    assert "batch_size" not in fp and "notes" not in fp
    assert fp["steps"] == 50 and fp["guidance"] == 7.5


def test_import_is_light():
    code = (
        "import sys, stereolens, stereolens.cli, stereolens.config, stereolens.report, "
        "stereolens.contextbias.metrics, stereolens.contextbias.merge, "
        "stereolens.contextbias.jobs, stereolens.models.registry, stereolens.workflow_support; "
        "print(sorted(m for m in ('torch', 'diffusers', 'transformers', 'vllm', "
        "'xgrammar', 'openai') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
