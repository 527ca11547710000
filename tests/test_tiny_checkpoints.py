"""The session's tiny checkpoints (tests/conftest.py TinyModels) are the files the workflow's
build_tiny_model rule writes: `stereolens build-tiny --builder B --out DIR`, run the way the
rule runs it, gives the same files, byte for byte. This is what lets a workflow test seed
its copy with the session's checkpoints instead of building them again."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import folder_digest, workflow_env

from stereolens.models.registry import load_registry

BIN = Path(sys.executable).parent


def _registry_builders(repo_root: Path) -> list[str]:
    registry = load_registry(repo_root / "config" / "models.yaml")
    return sorted({spec.get("build") for spec in registry.values() if spec.get("build")})


def test_registry_builders_are_known(repo_root):
    from conftest import TINY_BUILDERS

    builders = _registry_builders(repo_root)
    assert builders == ["tiny-diffusion", "tiny-vlm"]
    assert set(builders) <= set(TINY_BUILDERS)


@pytest.mark.parametrize("builder", ["tiny-diffusion", "tiny-vlm"])
def test_build_tiny_cli_writes_the_session_checkpoint(builder, tiny_models, repo_root, tmp_path):
    out = tmp_path / "resources" / "models" / builder
    run = subprocess.run(
        [str(BIN / "stereolens"), "build-tiny", "--builder", builder, "--out", str(out)],
        env=workflow_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert f"built {builder} checkpoint in {out}" in run.stdout
    built = folder_digest(out)
    assert any(name.endswith(".safetensors") for name in built)
    assert built == folder_digest(tiny_models.path(builder))
    # a workflow copy seeded from the session holds the same files where the rule writes them
    wd = tmp_path / "wd"
    (wd / "config").mkdir(parents=True)
    shutil.copy2(repo_root / "config" / "models.yaml", wd / "config" / "models.yaml")
    seeded = tiny_models.seed_workflow(wd)
    assert seeded == ["resources/models/tiny-sd", "resources/models/tiny-vlm"]
    rel = {"tiny-diffusion": "resources/models/tiny-sd", "tiny-vlm": "resources/models/tiny-vlm"}
    assert folder_digest(wd / rel[builder]) == built
