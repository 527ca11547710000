"""Planning cost at paper scale (issue "Cluster scale", item 5).

Plans config/config.yaml (all three benchmarks as configured) with `snakemake -n` in a
temporary copy of the workflow, then the same with 2x and 4x the jobs (ContextBias
seeds.per_shard 10 -> 5 -> 2 with seeds.per_prompt 10, i.e. 1, 2 and 5 seed shards, so
2.5x there; BiasIG prompts_per_shard 80 -> 40 -> 20; LVLM images_per_shard / 1, 2, 4).
Each plan runs in a fresh process; reports jobs, planning wall time, the child's CPU time
and peak memory (ru_maxrss). No model is loaded. Target (issue "Cluster scale", item 5):
the paper-scale plan (1x, 14,240 jobs) in under 60 s and 2 GB on 2 cores.
Usage: .venv/bin/python bench/plan_scale.py [--only-1x]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
VARIANTS = [("1x (as configured)", 10, 80, 1), ("2x", 5, 40, 2), ("4x", 2, 20, 4)]
"""(label, ContextBias seeds per shard, BiasIG prompts per shard, LVLM shard multiplier)."""


def _plan(wd: Path, config: Path) -> tuple[int, float, float, float]:
    """Jobs, wall seconds, CPU seconds and peak RSS (MiB) of one `snakemake -n` in a
    fresh process."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env["HF_HUB_OFFLINE"] = "1"
    with tempfile.TemporaryFile("w+") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [str(BIN / "snakemake"), "-n", "--quiet", "rules", "--configfile", str(config)],
            cwd=wd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        # wait4 reaps this child alone and gives its own rusage (ru_maxrss in KiB on Linux)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        out = log.read()
    if proc.returncode != 0:
        raise SystemExit(f"snakemake -n failed:\n{out[-3000:]}")
    m = re.search(r"^total\s+(\d+)$", out, re.M)
    cpu = usage.ru_utime + usage.ru_stime
    return int(m.group(1)) if m else -1, wall, cpu, usage.ru_maxrss / 1024


def main() -> int:
    base = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    rows = []
    with tempfile.TemporaryDirectory(prefix="plan_scale_") as tmp:
        wd = Path(tmp)
        for item in ("Snakefile", "workflow", "config", "profiles", "envs"):
            src = ROOT / item
            if src.is_dir():
                shutil.copytree(src, wd / item, symlinks=True)
            else:
                shutil.copy2(src, wd / item)
        variants = VARIANTS[:1] if "--only-1x" in sys.argv[1:] else VARIANTS
        for label, per_shard, prompts_per_shard, lvlm_factor in variants:
            cfg = yaml.safe_load(yaml.safe_dump(base))
            cfg["contextbias"]["seeds"]["per_shard"] = per_shard
            cfg["biasig"]["prompts_per_shard"] = prompts_per_shard
            for task in (cfg.get("lvlm") or {}).get("tasks", {}).values():
                task["images_per_shard"] = max(1, task["images_per_shard"] // lvlm_factor)
            path = wd / "config" / f"scale_{per_shard}_{prompts_per_shard}.yaml"
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            jobs, wall, cpu, peak_mib = _plan(wd, path)
            rows.append((label, per_shard, prompts_per_shard, jobs, wall, cpu, peak_mib))
            print(
                f"  {label}: {jobs} jobs, {wall:.1f} s ({cpu:.1f} s CPU), {peak_mib:.0f} MiB",
                file=sys.stderr,
            )
    head = (
        "variant",
        "cb per_shard",
        "bg prompts/shard",
        "jobs",
        "plan wall s",
        "plan CPU s",
        "peak MiB",
    )
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for label, ps, pps, jobs, wall, cpu, peak in rows:
        print(f"{label} | {ps} | {pps} | {jobs:,} | {wall:.1f} | {cpu:.1f} | {peak:.0f}")
    print(f"\n{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at the end.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
