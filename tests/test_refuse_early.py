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


# ---- a run larger than its ceilings (issue 24, item 4): refused before any job list is
# built, with the figures and the key to change, within 2 GB whatever size is asked for


def _with(path, tmp_path, name, **edits):
    config = yaml.safe_load(open(path))
    for key, value in edits.items():
        node = config
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    out = tmp_path / name
    out.write_text(yaml.safe_dump(config))
    return out


@pytest.mark.parametrize(
    "path",
    [
        "config/demo.yaml",
        pytest.param("config/config.yaml", marks=pytest.mark.slow),
        ".test/config/contextbias.yaml",
        ".test/config/biasig.yaml",
        ".test/config/lvlm.yaml",
    ],
)
def test_size_by_arithmetic_is_the_job_lists_count(path):
    """Each plug-in's size(config) equals its job list summed per stage and model."""
    from collections import Counter

    from stereolens.benchmark import benchmarks

    config, _ = load_config(path)
    for plugin in benchmarks(config):
        listed, listed_items = Counter(), Counter()
        for job in plugin.jobs(config, counts=True):
            listed[job.stage, job.model] += 1
            listed_items[job.stage, job.model] += job.items
        sized, sized_items = Counter(), Counter()
        for s in plugin.size(config):
            sized[s.stage, s.model] += s.jobs
            sized_items[s.stage, s.model] += s.items
        assert (sized, sized_items) == (listed, listed_items), plugin.name


def test_the_ceilings_admit_the_paper_run():
    from stereolens.plan import check_ceiling, default_throughput

    config, registry = load_config("config/config.yaml")
    got = check_ceiling(config, registry, default_throughput())
    assert 14_000 < got["jobs"] < config["limits"]["max_jobs"]
    assert 3_800_000 < got["images"] < config["limits"]["max_images"]
    assert 2_000 < got["gpu_hours"] < config["limits"]["max_gpu_hours"]


def _capped(cmd, cwd=None):
    """``cmd`` run with its address space capped at 2 GB."""
    code = (
        "import resource, subprocess, sys\n"
        "cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "sys.exit(subprocess.run(sys.argv[1:], preexec_fn=cap).returncode)\n"
    )
    import sys

    return subprocess.run(
        [sys.executable, "-c", code, *cmd],
        cwd=cwd,
        env=workflow_env(),
        capture_output=True,
        text=True,
    )


def test_check_config_and_plan_refuse_a_run_over_its_ceilings_in_2_gb(tmp_path):
    import sys
    from pathlib import Path

    from stereolens.plan import check_ceiling

    bin_dir = Path(sys.executable).parent
    huge = _with(
        "config/demo.yaml", tmp_path, "huge.yaml", **{"contextbias.seeds.per_prompt": 10**9}
    )
    for cmd in ("check-config", "plan"):
        out = _capped([str(bin_dir / "stereolens"), cmd, "--configfile", str(huge)])
        assert out.returncode == 2, out.stderr[-2000:]
        assert "limits.max_jobs = 50,000" in out.stderr and "MemoryError" not in out.stderr
        assert "limits.max_images = 10,000,000" in out.stderr
    # the largest ceiling the schema admits still refuses it (the count is arithmetic)
    raised = _with(huge, tmp_path, "raised.yaml", **{"limits.max_jobs": 200_000})
    with pytest.raises(ConfigError, match="limits.max_jobs = 200,000"):
        check_ceiling(*load_config(raised))
    with pytest.raises(ConfigError, match="limits.max_jobs"):
        load_config(_with(huge, tmp_path, "over.yaml", **{"limits.max_jobs": 200_001}))
    # a small ceiling names the figure: the demo's 36 model jobs over max_jobs 10
    small = _with("config/demo.yaml", tmp_path, "small.yaml", **{"limits.max_jobs": 10})
    with pytest.raises(ConfigError, match=r"36 jobs > limits.max_jobs = 10 \(") as err:
        check_ceiling(*load_config(small))
    assert "contextbias extract 8" in str(err.value), str(err.value)


@pytest.mark.slow
def test_snakemake_dry_run_refuses_a_run_over_its_ceilings_in_2_gb(repo_root, tmp_path):
    wd = copy_workflow(tmp_path / "wd")
    huge = _with(
        "config/demo.yaml", tmp_path, "huge.yaml", **{"contextbias.seeds.per_prompt": 10**9}
    )
    out = _capped([SNAKEMAKE, "-n", "--configfile", str(huge)], cwd=wd)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "limits.max_jobs = 50,000" in text, text[-2000:]
    assert "MemoryError" not in text


# ---- models that cannot load (issue 24, item 7): a local model path that is missing or
# holds no model, an API key variable unset; refused at parse time, naming model and key


def _registry_with(tmp_path, **entries):
    """config/models.yaml with vlms entries replaced or added, and the demo config using
    them as its ContextBias extractors (every other model: the demo's)."""
    registry = yaml.safe_load(open("config/models.yaml"))
    registry["vlms"].update(entries)
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(registry))
    config = yaml.safe_load(open("config/demo.yaml"))
    config["registry"] = str(path)
    config["contextbias"]["extractors"] = sorted(entries)
    out = tmp_path / "config.yaml"
    out.write_text(yaml.safe_dump(config))
    return out


def _local_vlm(model):
    return {"backend": "transformers", "model": str(model), "device": "cpu"}


def _api_vlm(key):
    return {
        "backend": "openai",
        "model": "m",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key_env": key,
    }


def test_model_sources_missing_path_empty_folder_and_unset_key(tmp_path, monkeypatch):
    from stereolens.config import check_model_sources, model_source_problems

    empty = tmp_path / "empty"
    empty.mkdir()
    good = tmp_path / "good"
    good.mkdir()
    (good / "config.json").write_text("{}")
    monkeypatch.delenv("STEREOLENS_TEST_UNSET", raising=False)
    monkeypatch.setenv("STEREOLENS_TEST_SET", "sk-x")
    path = _registry_with(
        tmp_path,
        gone=_local_vlm(tmp_path / "no/such/model"),
        hollow=_local_vlm(empty),
        fine=_local_vlm(good),
        keyless=_api_vlm("STEREOLENS_TEST_UNSET"),
        keyed=_api_vlm("STEREOLENS_TEST_SET"),
    )
    config, registry = load_config(path)
    paths, keys = model_source_problems(config, registry)
    assert len(paths) == 2 and len(keys) == 1, (paths, keys)
    gone, hollow = sorted(paths)
    assert "'gone' (contextbias extractor)" in gone and "does not exist" in gone
    assert str(tmp_path / "no/such/model") in gone
    assert "'hollow'" in hollow and "holds no model" in hollow
    assert "'keyless'" in keys[0] and "$STEREOLENS_TEST_UNSET" in keys[0]
    assert "api_key_env" in keys[0]
    with pytest.raises(ConfigError, match="STEREOLENS_TEST_UNSET"):
        check_model_sources(config, registry)
    # a dry run asks no model: an unset key only warns; a missing path is still refused
    with pytest.raises(ConfigError) as err:
        check_model_sources(config, registry, warn_keys=True)
    assert "STEREOLENS_TEST_UNSET" not in str(err.value) and "'gone'" in str(err.value)
    # the demo's tiny models are built by a rule (resources/models/...): not missing
    assert model_source_problems(*load_config("config/demo.yaml")) == ([], [])


def test_runs_no_job_reads_the_snakemake_command_line():
    from stereolens.workflow_support import runs_no_job

    assert runs_no_job(["-n", "--configfile", "c.yaml"]) and runs_no_job(["-np"])
    assert runs_no_job(["--summary", "--quiet"]) and runs_no_job(["--unlock"])
    assert not runs_no_job(["--cores", "4", "--configfile", "c.yaml", "-p"])


def test_check_config_names_the_model_and_the_key(tmp_path):
    import sys
    from pathlib import Path

    path = _registry_with(tmp_path, keyless=_api_vlm("STEREOLENS_TEST_UNSET"))
    cmd = [
        str(Path(sys.executable).parent / "stereolens"),
        "check-config",
        "--configfile",
        str(path),
    ]
    env = workflow_env()
    env.pop("STEREOLENS_TEST_UNSET", None)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert out.returncode == 2 and "'keyless'" in out.stderr, out.stderr
    assert "$STEREOLENS_TEST_UNSET" in out.stderr
    out = subprocess.run(
        cmd, env={**env, "STEREOLENS_TEST_UNSET": "sk-x"}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_snakemake_refuses_models_that_cannot_load_before_any_job(tmp_path):
    wd = copy_workflow(tmp_path / "wd")
    gone = _registry_with(tmp_path, gone=_local_vlm(tmp_path / "no/such/model"))
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", str(gone)], cwd=wd, env=workflow_env(),
        capture_output=True, text=True,
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "'gone'" in text and "does not exist" in text, text[-2000:]
    sub = tmp_path / "key"
    sub.mkdir()
    keyless = _registry_with(sub, keyless=_api_vlm("STEREOLENS_TEST_UNSET"))
    env = workflow_env()
    env.pop("STEREOLENS_TEST_UNSET", None)
    dry = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", str(keyless)], cwd=wd, env=env,
        capture_output=True, text=True,
    )  # fmt: skip
    assert dry.returncode == 0 and "$STEREOLENS_TEST_UNSET" in dry.stderr, dry.stderr[-2000:]
    real = subprocess.run(
        [SNAKEMAKE, "--cores", "1", "--configfile", str(keyless)], cwd=wd, env=env,
        capture_output=True, text=True,
    )  # fmt: skip
    text = real.stdout + real.stderr
    assert real.returncode != 0 and "$STEREOLENS_TEST_UNSET" in text, text[-2000:]
    assert not (wd / "results").exists()
