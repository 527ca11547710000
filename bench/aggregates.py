"""The aggregate stages of a paper-scale run, timed (issue "Performance at both ends").

Writes synthetic shard files at the chosen fractions of paper scale (bench/synthetic.py:
the project's own record builders and writers, the workflow's file layout; cached in
--data-root, rebuilt when the generator's format changes) and runs every aggregate rule's
body on them, each job in a fresh process, measuring wall time, CPU time (user + system)
and peak resident memory (ru_maxrss of the child, from os.wait4):

  merge_biasig_model_answers          one job per BiasIG generator (its 589 VQA shards)
  merge_biasig_answers                the generators' parts -> results/biasig/answers.parquet
  compute_biasig_metrics              `stereolens biasig metrics` (1,000 replicates, 200 ceilings)
  merge_contextbias_model_attributes  one job per extractor x generator
  merge_contextbias_attributes        the parts -> attributes_raw.parquet, images.parquet
  canonicalise_contextbias_labels     the sentence encoder only (no LLM step)
  compute_contextbias_metrics         `stereolens contextbias metrics` (defaults)
  merge_lvlm_model_responses          one job per audited model
  merge_lvlm_responses                the parts -> responses.parquet and the other tables
  compute_lvlm_metrics                `stereolens lvlm metrics` (defaults)
  render_report                       the HTML report of all three benchmarks

A rule with one job per model shows the jobs' summed wall and CPU time and the largest
peak. The growth exponent between two scales is log(t2 / t1) / log(n2 / n1) over the rows
the stage reads (n) and its wall (and CPU) time t. A job is killed when its resident
memory passes --max-rss-gb (default 12), so a regression cannot take the machine down.

Targets (issue 16): every stage under 60 s wall and 4 GB peak at full paper scale on 2
cores. On a machine shared with other work wall time is longer than CPU time; compare CPU.

Usage:
  PYTHONPATH=src .venv/bin/python bench/aggregates.py --scales 1/16 1/4 [1]
  PYTHONPATH=src .venv/bin/python bench/aggregates.py --scales 1/16 --stages compute_biasig_metrics
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic  # noqa: E402  (bench/synthetic.py, beside this file)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEFAULT_ROOT = Path(tempfile.gettempdir()) / "stereolens-aggregates"


# ---------------------------------------------------------------- paths of a data folder
def _r(data: Path, pattern: str) -> list[str]:
    return sorted(glob.glob(str(data / "results" / pattern)))


def _biasig_models(data: Path) -> list[str]:
    return sorted(Path(p).name for p in _r(data, "biasig/vqa/*/*"))


def _cb_parts(data: Path) -> list[tuple[str, str]]:
    return [tuple(p.split("/")[-2:]) for p in _r(data, "contextbias/extractions/*/*")]


def _lvlm_models(data: Path) -> list[str]:
    return sorted(Path(p).name for p in _r(data, "lvlm/responses/*"))


def _lvlm_inputs(data: Path, model: str) -> dict[str, list[str]]:
    """A model's merge inputs in the workflow's order (tasks, settings, axes, groups,
    shards as configured)."""
    from stereolens.lvlm.names import group_slug, groups

    config, _ = synthetic.paper_config()
    lv = config["lvlm"]
    responses = [
        p
        for task in lv["tasks"]
        for setting in synthetic.lvlm_settings(lv, task)
        for axis in lv["axes"]
        for group in groups(lv, axis)
        for p in sorted(
            _r(data, f"lvlm/responses/{model}/{setting}/{task}/{axis}/{group_slug(group)}/*.jsonl"),
            key=lambda p: int(Path(p).stem),
        )
    ]
    return {
        "response_paths": responses,
        "refusal_paths": _r(data, f"lvlm/refusals/{model}/*.parquet"),
        "story_paths": _r(data, f"lvlm/story_attributes/{model}/*/*.jsonl"),
        "judgement_paths": _r(data, f"lvlm/term_judgements/{model}/*/*.parquet"),
    }


def _out(data: Path, rel: str) -> Path:
    path = data / "results" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- job bodies (in the child)
def job(stage: str, data: Path, part: str | None) -> None:
    """One job of ``stage``, as its workflow script runs it."""
    from stereolens.models.registry import load_registry

    if stage == "merge_biasig_model_answers":
        from stereolens.biasig.merge import merge_model_answers, part_path

        merge_model_answers(
            _r(data, f"biasig/vqa/*/{part}/*/*/*.jsonl"),
            _out(data, part_path(part).removeprefix("results/")),
            load_registry(ROOT / "config/models.yaml"),
        )
    elif stage == "merge_biasig_answers":
        from stereolens.biasig.merge import merge_answer_parts, part_path

        parts = [data / part_path(m) for m in _biasig_models(data)]
        merge_answer_parts(parts, _out(data, "biasig/answers.parquet"))
    elif stage == "merge_contextbias_model_attributes":
        from stereolens.contextbias.merge import merge_extraction_part, part_paths
        from stereolens.contextbias.schema import AttributeSchema

        extractor, model = part.split("/")
        out = part_paths(extractor, model)
        merge_extraction_part(
            _r(data, f"contextbias/extractions/{extractor}/{model}/*/*/*.jsonl"),
            AttributeSchema.load(),
            _out(data, out["attributes"].removeprefix("results/")),
            _out(data, out["images"].removeprefix("results/")),
        )
    elif stage == "merge_contextbias_attributes":
        from stereolens.contextbias.merge import merge_extraction_parts, part_paths

        parts = [part_paths(e, m) for e, m in _cb_parts(data)]
        merge_extraction_parts(
            [data / p["attributes"] for p in parts],
            [data / p["images"] for p in parts],
            _out(data, "contextbias/attributes_raw.parquet"),
            _out(data, "contextbias/images.parquet"),
        )
    elif stage == "canonicalise_contextbias_labels":
        from stereolens.contextbias.canonical import run_canonicalisation
        from stereolens.models.job import limit_threads

        limit_threads(1)  # the rule's threads
        run_canonicalisation(
            _out(data, "contextbias/attributes_raw.parquet"),
            _out(data, "contextbias/canonical_mapping.parquet"),
            _out(data, "contextbias/attributes.parquet"),
            encoder="all-MiniLM-L6-v2",
            threshold=0.8,
            llm_spec=None,
            return_attributes=False,
        )
    elif stage == "merge_lvlm_model_responses":
        from stereolens.lvlm.merge import merge_model_tables, part_paths

        out = {k: _out(data, v.removeprefix("results/")) for k, v in part_paths(part).items()}
        merge_model_tables(**_lvlm_inputs(data, part), out=out)
    elif stage == "merge_lvlm_responses":
        from stereolens.lvlm.merge import TABLES, merge_model_parts, part_paths

        parts = {m: {k: data / v for k, v in part_paths(m).items()} for m in _lvlm_models(data)}
        merge_model_parts(parts, {n: _out(data, f"lvlm/{n}.parquet") for n in TABLES})
    elif stage == "render_report":
        from stereolens.report.render import render_report

        render_report(
            config=_report_config(),
            inputs=_report_inputs(data),
            out_path=_out(data, "report/index.html"),
        )
    else:
        raise SystemExit(f"no job body for stage {stage!r}")


def _report_config() -> dict:
    config, _ = synthetic.paper_config()
    config["contextbias"]["validation"]["enabled"] = False  # no validation shards here
    config["contextbias"]["annotation"]["enabled"] = False
    return config


def _report_inputs(data: Path) -> dict[str, str]:
    res = data / "results"
    inputs = {
        "prompts": res / "contextbias/prompts.parquet",
        "images": res / "contextbias/images.parquet",
        "mapping": res / "contextbias/canonical_mapping.parquet",
        **{n: res / f"contextbias/metrics/{n}.parquet" for n in (
            "bi", "ccs", "ccs_mean", "robustness", "bootstrap"
        )},
        **{f"biasig_{n}": res / f"biasig/metrics/{n}.parquet" for n in (
            "implicit", "explicit", "eta"
        )},
        **{f"lvlm_{n}": res / f"lvlm/metrics/{n}.parquet" for n in (
            "scores", "prompt_scores", "refusals", "story_skew", "exam_accuracy"
        )},
        "lvlm_sets": res / "lvlm/sets.parquet",
    }  # fmt: skip
    return {k: str(v) for k, v in inputs.items()}


# ---------------------------------------------------------------- stages (in the parent)
@dataclass
class Stage:
    name: str
    reads: str
    """What n counts in the growth exponent."""

    def commands(self, data: Path) -> list[list[str]]:
        me = [sys.executable, str(Path(__file__).resolve()), "--job", self.name, "--data"]
        res = data / "results"
        cli = str(BIN / "stereolens")
        if self.name == "merge_biasig_model_answers":
            return [[*me, str(data), "--part", m] for m in _biasig_models(data)]
        if self.name == "merge_contextbias_model_attributes":
            return [[*me, str(data), "--part", f"{e}/{m}"] for e, m in _cb_parts(data)]
        if self.name == "merge_lvlm_model_responses":
            return [[*me, str(data), "--part", m] for m in _lvlm_models(data)]
        if self.name == "compute_biasig_metrics":
            return [[cli, "biasig", "metrics", "--answers", str(res / "biasig/answers.parquet"),
                     "--prompts", str(res / "biasig/prompts.parquet"),
                     "--out", str(res / "biasig/metrics")]]  # fmt: skip
        if self.name == "compute_contextbias_metrics":
            return [[cli, "contextbias", "metrics",
                     "--attributes", str(res / "contextbias/attributes.parquet"),
                     "--images", str(res / "contextbias/images.parquet"),
                     "--out", str(res / "contextbias/metrics")]]  # fmt: skip
        if self.name == "compute_lvlm_metrics":
            return [[cli, "lvlm", "metrics", "--responses", str(res / "lvlm/responses.parquet"),
                     "--out", str(res / "lvlm/metrics")]]  # fmt: skip
        return [[*me, str(data)]]


STAGES = [
    Stage("merge_biasig_model_answers", "biasig_rows"),
    Stage("merge_biasig_answers", "biasig_rows"),
    Stage("compute_biasig_metrics", "biasig_rows"),
    Stage("merge_contextbias_model_attributes", "contextbias_records"),
    Stage("merge_contextbias_attributes", "contextbias_records"),
    Stage("canonicalise_contextbias_labels", "contextbias_records"),
    Stage("compute_contextbias_metrics", "contextbias_records"),
    Stage("merge_lvlm_model_responses", "lvlm_responses"),
    Stage("merge_lvlm_responses", "lvlm_responses"),
    Stage("compute_lvlm_metrics", "lvlm_responses"),
    Stage("render_report", "lvlm_responses"),
]


@dataclass
class Measured:
    stage: str
    scale: str
    rows: int
    jobs: int
    wall_s: float
    cpu_s: float
    peak_mib: float
    status: str = "ok"


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_one(
    cmd: list[str], max_rss_mib: float, log_path: Path, src: Path = ROOT / "src"
) -> tuple[float, float, float, str]:
    """Wall, CPU seconds and peak RSS (MiB) of ``cmd`` in a fresh process (importing the
    package from ``src``); killed (status "killed") when its RSS passes ``max_rss_mib``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(src))
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    with open(log_path, "ab") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        killed = threading.Event()

        def guard() -> None:
            while proc.poll() is None:
                if _rss_mib(proc.pid) > max_rss_mib:
                    killed.set()
                    proc.kill()
                    return
                time.sleep(0.2)

        watcher = threading.Thread(target=guard, daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        watcher.join()
    state = "killed" if killed.is_set() else ("ok" if proc.returncode == 0 else "failed")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, state


def measure(stage: Stage, data: Path, manifest: dict, max_rss_mib: float) -> Measured:
    wall = cpu = peak = 0.0
    status = "ok"
    cmds = stage.commands(data)
    for cmd in cmds:
        w, c, p, s = run_one(cmd, max_rss_mib, data / "bench.log")
        wall, cpu, peak = wall + w, cpu + c, max(peak, p)
        if s != "ok":
            status = s
            break
    return Measured(
        stage.name, manifest["scale"], manifest[stage.reads], len(cmds), wall, cpu, peak, status
    )


def exponent(a: Measured, b: Measured, attr: str) -> float | None:
    ta, tb = getattr(a, attr), getattr(b, attr)
    if a.rows == b.rows or ta <= 0 or tb <= 0 or "ok" not in (a.status, b.status):
        return None
    return math.log(tb / ta) / math.log(b.rows / a.rows)


def table(results: list[Measured]) -> str:
    head = (
        "| stage | scale | rows read | jobs | wall s | CPU s | peak RSS MiB | exponent wall, CPU |"
    )
    lines = [head, "|" + "---|" * 8]
    by_stage: dict[str, list[Measured]] = {}
    for r in results:
        by_stage.setdefault(r.stage, []).append(r)
    for stage in by_stage.values():
        stage.sort(key=lambda r: Fraction(r.scale))
        for i, r in enumerate(stage):
            exp = ""
            if i:
                ew, ec = exponent(stage[i - 1], r, "wall_s"), exponent(stage[i - 1], r, "cpu_s")
                exp = ", ".join("-" if e is None else f"{e:.2f}" for e in (ew, ec))
            status = "" if r.status == "ok" else f" ({r.status})"
            lines.append(
                f"| {r.stage}{status} | {r.scale} | {r.rows:,} | {r.jobs} | {r.wall_s:.1f} | "
                f"{r.cpu_s:.1f} | {r.peak_mib:,.0f} | {exp} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", nargs="+", default=["1/16", "1/4"], help="fractions of paper scale")
    ap.add_argument("--stages", nargs="+", help="only these stages (default: all, in order)")
    ap.add_argument("--data-root", default=str(DEFAULT_ROOT), help="where the data is cached")
    ap.add_argument("--max-rss-gb", type=float, default=12.0, help="kill a job above this RSS")
    ap.add_argument("--json", help="also write the measurements to this JSON file")
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--part", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.job:
        job(args.job, Path(args.data), args.part)
        return 0
    names = [s.name for s in STAGES]
    unknown = set(args.stages or ()) - set(names)
    if unknown:
        raise SystemExit(f"unknown stage(s) {sorted(unknown)}; choose from {names}")
    stages = [s for s in STAGES if not args.stages or s.name in args.stages]
    results = []
    for text in args.scales:
        scale = synthetic.scale_fraction(text)
        data = Path(args.data_root) / str(scale).replace("/", "_")
        print(f"scale {scale}: synthetic data in {data}", flush=True)
        manifest = synthetic.generate(data, scale, log=lambda m: print(f"  {m}", flush=True))
        for stage in stages:
            r = measure(stage, data, manifest, args.max_rss_gb * 1024)
            print(f"  {r.stage}: {r.wall_s:.1f} s wall, {r.cpu_s:.1f} s CPU, "
                  f"{r.peak_mib:,.0f} MiB ({r.status})", flush=True)  # fmt: skip
            results.append(r)
            if r.status != "ok":  # the later stages would read stale outputs
                print(f"  stage {r.status}; see {data / 'bench.log'}", flush=True)
                break
    print()
    print(table(results))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
