"""`stereolens plan --power` / `--target-effect` (issue 15): the planner's vectorised
estimators equal the real metric functions value for value, the engine's MDE and sample-size
arithmetic, the CLI's output and its refusals."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from design_worlds import cb_design, small_biasig

from stereolens.biasig import design as B
from stereolens.biasig import design_check as BC
from stereolens.biasig import design_worlds as BW
from stereolens.config import load_config
from stereolens.contextbias import design as C
from stereolens.contextbias import design_check as CC
from stereolens.contextbias import design_worlds as CW
from stereolens.design import power as P
from stereolens.design.priors import load_priors
from stereolens.lvlm import design as L
from stereolens.lvlm import design_check as LC
from stereolens.validation import ConfigError


@pytest.fixture(autouse=True)
def _in_repo(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)


# ----------------------------------------------------------------------------- estimators
@pytest.mark.parametrize("k_definition", ["model", "cell"])
@pytest.mark.parametrize("overall", ["cohort", "dimension"])
def test_contextbias_estimator_is_cluster_bootstrap_estimate(k_definition, overall):
    from stereolens.contextbias.bootstrap import cluster_bootstrap

    d = cb_design(k_definition=k_definition, overall=overall)
    pooled, by_role = C.draw_role_counts(
        d.world, 4, 3, np.random.default_rng(1), keep_roles=True, planted=0.2
    )
    mine = d._collect(*d.levels(pooled[:, :, 0], pooled[:, :, 1]))
    assert set(mine) == {s.name for s in d.specs()}
    for s in range(3):
        table = CW.attributes_table(d.world, by_role, s)
        boot = cluster_bootstrap(table, replicates=1, k_definition=k_definition, overall=overall)
        boot = boot.filter(pl.col("comparison") == "CA-U - CF", pl.col("dimension") == "*")
        for name, values in mine.items():
            model, cohort = CC._cb_row(name)
            row = boot.filter(pl.col("model") == model, pl.col("cohort") == cohort)
            assert row["estimate"][0] == pytest.approx(values[s], abs=1e-12), name


def test_role_resamples_and_their_moments_hand_computed():
    """2 roles: resamples (2, 0), (1, 1), (0, 2) with probabilities 1/4, 1/2, 1/4. 3 roles:
    the 10 resamples of a sum of per-role values a = (1, 2, 6) have mean 3 x 3 = 9 and
    variance sum (a - 3)^2 = 4 + 1 + 9 = 14 (the bootstrap of a sum: R x the variance of a
    with ddof 0). NaN replicates are left out; drawn resamples take the ddof-1 variance."""
    mult, weight, exact = C.role_resamples(2, 16, 5, np.random.default_rng(0))
    assert exact and mult.shape == (1, 3, 2)
    np.testing.assert_array_equal(mult[0], [[2, 0], [1, 1], [0, 2]])
    np.testing.assert_allclose(weight, [0.25, 0.5, 0.25])
    mult, weight, exact = C.role_resamples(3, 16, 5, np.random.default_rng(0))
    assert exact and mult.shape == (1, 10, 3) and weight.sum() == pytest.approx(1.0)
    mean, var = C.weighted_moments(mult[0] @ np.array([1.0, 2.0, 6.0]), weight, exact)
    assert (mean, var) == (pytest.approx(9.0), pytest.approx(14.0))
    x = np.array([1.0, np.nan, 3.0])
    assert C.weighted_moments(x, np.array([0.25, 0.5, 0.25]), True) == (2.0, 1.0)
    x = np.array([1.0, 2.0, np.nan, 3.0])
    assert C.weighted_moments(x, np.full(4, 0.25), False) == (2.0, 1.0)
    mult, weight, exact = C.role_resamples(4, 16, 7, np.random.default_rng(0))
    assert exact and mult.shape == (1, C.EXACT_RESAMPLES, 4)  # C(7, 4) = 35
    mult, weight, exact = C.role_resamples(5, 16, 7, np.random.default_rng(0))  # C(9, 5) = 126
    assert not exact and mult.shape == (7, 16, 5) and (mult.sum(-1) == 5).all()
    np.testing.assert_allclose(weight, 1 / 16)


def test_emulated_role_bootstrap_is_cluster_bootstraps():
    """On one dataset of 3 roles the emulation's exact replicate mean and variance are those
    of cluster_bootstrap's 20,000 replicates (boot_mean; the bc-t half-width / t_factor(3)
    = the replicates' sd): within 4 Monte Carlo errors of the mean and 6% of the variance
    (the error of a variance from 20,000 draws: about 1-2%)."""
    from stereolens.contextbias.bootstrap import cluster_bootstrap
    from stereolens.contextbias.intervals import t_factor

    d = cb_design(n_roles=3)
    _, by_role = C.draw_role_counts(
        d.world, 4, 1, np.random.default_rng(2), keep_roles=True, planted=0.2
    )
    mult, weight, exact = C.role_resamples(3, C.SCALE_REPLICATES, 1, np.random.default_rng(0))
    assert exact
    role = by_role.astype(float)
    mine = d.replicate_moments(role[:, :, :, 0], role[:, :, :, 1], mult, weight, exact)
    table = CW.attributes_table(d.world, by_role, 0)
    boot = cluster_bootstrap(table, replicates=20_000, seed=5, min_roles=1)
    boot = boot.filter(pl.col("comparison") == "CA-U - CF", pl.col("dimension") == "*")
    assert set(mine) == {s.name for s in d.specs()}
    for name, (mean, var) in mine.items():
        model, cohort = CC._cb_row(name)
        row = boot.filter(pl.col("model") == model, pl.col("cohort") == cohort)
        sd = (row["ci_high"][0] - row["ci_low"][0]) / 2 / t_factor(3)
        assert var[0] > 0
        assert sd**2 == pytest.approx(var[0], rel=0.06), name
        assert row["boot_mean"][0] == pytest.approx(mean[0], abs=4 * sd / np.sqrt(20_000)), name


def test_biasig_estimators_are_compute_metrics():
    from stereolens.biasig.metrics import compute_metrics

    d = small_biasig()
    wr = d.world
    assert wr.imp.size and wr.exp.size and len(wr.pairs)
    assert (wr.units["n_persons"].to_numpy()[wr.imp] == 2).any()  # a two-person unit
    rng = np.random.default_rng(0)
    counts = BC._unit_counts(d, 3, wr.dist_a, rng)
    usable = np.where(wr.exp_used, rng.binomial(d.n_phr_exp * 3, wr.ok_rate)[:, None], 0)
    hits = rng.binomial(usable, wr.acc_a)
    answers = BC.answers_table(d, "A", counts, hits, usable, rng)
    res = compute_metrics(answers, wr.prompts, replicates=0, ceiling_draws=0)
    imp = res["implicit"].filter(pl.col("level") == "model", pl.col("protected_attribute") == "*")
    exp = res["explicit"].filter(pl.col("level") == "model", pl.col("protected_attribute") == "*")
    eta = res["eta"].filter(pl.col("pair") == "*")
    assert imp["score"][0] == pytest.approx(
        B.s_imp_model(counts, wr.gt, wr.used, wr.k_i, d.k_imp), abs=1e-12
    )
    assert exp["score"][0] == pytest.approx(
        B.s_exp_model(hits, usable, wr.exp_used, d.k_exp), abs=1e-12
    )
    assert eta["eta_total"][0] == pytest.approx(
        B.eta_model(B.side_counts(wr, counts), wr), abs=1e-12
    )


@pytest.mark.parametrize("formulas", [None, "variants"])
def test_lvlm_estimators_are_overall_scores(formulas):
    from stereolens.lvlm.scores import overall_scores

    config, _ = load_config("config/demo.yaml")
    config["lvlm"]["axes"] = ["gender", "race"]  # the demo audits gender only; race: 2 groups
    if formulas:
        config["lvlm"]["metrics"]["formulas"] = {
            "story": "story_tvd_unweighted",
            "term": "term_tvd_uniform",
            "exam": "exam_tvd_pooled",
        }
    designs = {d.task: d for d in L.build(config, load_priors(), None)}
    rng = np.random.default_rng(0)
    n = 20
    for task, d in designs.items():
        groups = d.groups["race"]
        kw = {"formulas": {task: d.formula}, "n_boot": 0, "permutations": 0}
        if task == "story":
            table, resp = LC.story_tables(d, groups, n, 0.1, rng)
            got = overall_scores("story", table, responses=resp, min_count=d.min_count, **kw)
            mat = np.zeros((len(groups), d.world.rates.size))
            for g, v, c in table.group_by("group", "value").len().iter_rows():
                mat[groups.index(g), int(v[1:])] = c
            mine = L.story_score(
                mat, np.full(len(groups), n, float), d.min_count, d.formula == "story_tvd"
            )
        elif task == "term":
            table = LC.term_table(d, groups, n, 0.1, rng)
            got = overall_scores("term", table, **kw)
            wins = np.zeros((d.n_terms, len(groups)))
            apps = np.zeros_like(wins)
            for r in table.filter(pl.col("winner").is_not_null()).iter_rows(named=True):
                k = int(r["prompt_id"][1:])
                wins[k, groups.index(r["winner"])] += 1
                apps[k, groups.index(r["group_a"])] += 1
                apps[k, groups.index(r["group_b"])] += 1
            mine = L.term_score(wins, apps, d.formula == "term_tvd_uniform")
        else:
            table = LC.exam_table(d, groups, n, 0.1, rng)
            got = overall_scores("exam", table, **kw)
            right = np.zeros((int(d.subject.max()) + 1, len(groups)))
            total = np.zeros_like(right)
            for r in table.iter_rows(named=True):
                s, g = int(r["subject"][1:]), groups.index(r["group"])
                right[s, g] += r["correct"]
                total[s, g] += 1
            if d.formula == "exam_tvd_pooled":
                right, total = right.sum(0, keepdims=True), total.sum(0, keepdims=True)
            mine = L.exam_score(right, total)
        assert got["score"][0] == pytest.approx(float(np.ravel(mine)[0]), abs=1e-9), task


# ----------------------------------------------------------------------------- engine
def test_interpolated_mde_and_unreached():
    eff = np.array([0.0, 1.0, 2.0, 3.0])
    assert P.interpolate_mde(eff, np.array([0.05, 0.4, 0.9, 1.0]), 0.8) == pytest.approx(1.8)
    assert P.interpolate_mde(eff, np.array([0.05, 0.1, 0.2, 0.3]), 0.8) is None


def test_interval_rule_rejects_at_the_level_without_effect():
    rng = np.random.default_rng(0)
    spec = P.EffectSpec("x", "b", "x", "u", "interval")
    est = rng.normal(0.0, 1.0, size=(1, 20_000))
    assert P.power_curve(spec, est, 0.05)[0] == pytest.approx(0.05, abs=0.01)
    strong = rng.normal(2.8, 1.0, size=(1, 20_000))
    assert P.power_curve(spec, strong, 0.05)[0] == pytest.approx(0.80, abs=0.02)
    # a standard error estimated from 6 clusters, used with the normal quantile: the test
    # rejects as |t_5| > 1.96 would, 10.7% of the time with no effect
    few = P.EffectSpec("x", "b", "x", "u", "interval", df=5)
    assert P.power_curve(few, est, 0.05)[0] == pytest.approx(0.107, abs=0.01)


@pytest.mark.parametrize("level", [0.01, 0.10])
def test_t_quantile_gives_the_t_tests_size(level):
    """A bc-t row's test is |estimate| > t_(1 - level/2, R - 1) x SE with SE from R clusters:
    with no effect it rejects at the level. The old rule (z_(1 - level/2) x t_0.975 / z_0.975
    x sd) rejected 0.0156 of the time at level 0.01 and 0.0901 at 0.10 with 10 roles."""
    rng = np.random.default_rng(1)
    n = 40_000
    spec = P.EffectSpec("x", "b", "x", "u", "interval", df=9)
    sim = P.Simulation({"x": rng.normal(0.0, 1.0, size=(1, n))}, t_df={"x": 9})
    assert sim.curve_args("x") == {"shift": None, "scale": None, "t_df": 9}
    rate = P.power_curve(spec, sim.estimates["x"], level, **sim.curve_args("x"))[0]
    assert rate == pytest.approx(level, abs=3 * np.sqrt(level * (1 - level) / n))


def test_per_dataset_scale_applies_each_datasets_test():
    """A (W, sims) scale and shift are each dataset's own se and centre: |1 - 0.2| / 0.4 =
    2.0, |2 + 0.5| / 1.5 = 1.67 and |3 - 0.1| / 2 = 1.45 against z_0.975 = 1.96 and
    t_(0.975, 2) = 4.30: 1 of 3 datasets rejects under z, none under t(2); the chi2 term of
    spec.df is not applied (the se's spread is in the values). The first dataset's shift and
    se for all, (W,): mean of P(chi2(2) < 2 t^2) = 1 - exp(-t^2), t = |e - 0.2| / (1.96 x
    0.4) for e = 1, 2, 3: (0.6470 + 0.9949 + 1.0000) / 3 = 0.8806."""
    spec = P.EffectSpec("x", "b", "x", "u", "interval", df=2)
    est = np.array([[1.0, 2.0, 3.0]])
    args = {"shift": np.array([[-0.2, 0.5, -0.1]]), "scale": np.array([[0.4, 1.5, 2.0]])}
    assert P.power_curve(spec, est, 0.05, **args)[0] == pytest.approx(1 / 3)
    assert P.power_curve(spec, est, 0.05, **args, t_df=2)[0] == 0.0
    one = {"shift": args["shift"][:, 0], "scale": args["scale"][:, 0]}
    assert P.power_curve(spec, est, 0.05, **one)[0] == pytest.approx(0.88062, abs=1e-5)


def test_contextbias_bc_t_rows_take_the_t_quantile_at_the_level():
    """ContextBias's bc-t rows carry t_df = roles - 1 and, below FEW_ROLES roles, the emulated
    role bootstrap's se as their scale: on 200 datasets of 10 roles (the se from the first
    100) its square is 1.14x the estimate's variance with no effect and 1.18x at w = 0.2
    (1.25 on 3,000 datasets: the role bootstrap overstates the spread with few roles), and
    the method names both; up to 4 roles the se is each dataset's (W, sims); from FEW_ROLES
    on the sd is the spread (no scale); the basic interval's rows take neither."""
    d = cb_design(n_roles=10)
    assert d.interval == "bc-t" and d.notes == []
    sim = d.simulate(4, np.array([0.0, 0.2]), 200, np.random.default_rng(2))
    assert sim.t_df == dict.fromkeys(sim.estimates, 9) and set(sim.scale) == set(sim.estimates)
    name = "contextbias.bi_shift"
    ratio = sim.scale[name] ** 2 / np.nanvar(sim.estimates[name], axis=1, ddof=1)
    np.testing.assert_allclose(ratio, [1.142, 1.181], atol=0.001)
    row = P.mde_rows(d, sims=40, seed=3, level=0.01)[0]
    assert (
        "two-sided 0.01: |estimate + the bootstrap's shift - 0| > t(9) x the emulated pipeline "
        "bootstrap's standard error, with its error from 10 clusters" in row.method
    )
    three = cb_design(n_roles=3).simulate(4, np.array([0.0, 0.2]), 20, np.random.default_rng(0))
    assert three.scale[name].shape == three.shift[name].shape == (2, 20)
    many = cb_design(n_roles=C.FEW_ROLES)
    assert not many.simulate(4, np.array([0.0]), 20, np.random.default_rng(0)).scale
    d.interval = "basic"
    sim = d.simulate(4, np.array([0.0]), 20, np.random.default_rng(0))
    assert sim.t_df == {} and not sim.scale


def test_effects_increase_and_mde_is_reached_on_paper_scale():
    config, _ = load_config("config/config.yaml")
    priors = load_priors()
    for d in [CW.build(config, priors, None), BW.build(config, priors, None)]:
        eff = d.effects(d.grid)
        for name, v in eff.items():
            assert v[0] == pytest.approx(0.0, abs=1e-12), name
            assert np.all(np.diff(v) >= -1e-12), name


def test_mde_rows_demo_prior():
    config, _ = load_config("config/demo.yaml")
    # the demo has one ContextBias generator; with two, each has its own row too
    config["contextbias"]["generators"] = ["tiny-sd", "tiny-sd-b"]
    d = CW.build(config, load_priors(), None)
    rows = P.mde_rows(d, sims=60, seed=3)
    names = [r.name for r in rows]
    assert names[0] == "contextbias.bi_shift"
    assert "contextbias.bi_shift:tiny-sd" in names
    seeds = config["contextbias"]["seeds"]["per_prompt"]
    for r in rows:
        assert r.size == seeds and r.knob == "seeds per prompt" and r.basis == "prior"
        assert r.mde is None or 0 <= r.mde <= r.max_effect
        assert 0 <= r.size_rate <= 1
        assert "through the project's estimator" in r.method


def test_method_says_which_test_each_effect_is_held_to():
    """biasig.eta_interval's method names the double-bootstrap centre and standard error the
    report's eta interval takes (not the generic |estimate - 0|); the S_imp difference is
    centred where the report's bias-corrected difference is (the bootstrap's shift)."""
    methods = {r.name: r.method for r in P.mde_rows(small_biasig(), sims=40, seed=3)}
    eta = methods["biasig.eta_interval"]
    assert "two-sided 0.05: |eta_total_bc - 0.5| > z x the sd of the once-corrected" in eta
    assert "eta_total_bc the double-bootstrap estimate 3 x eta - 3 x mean eta* + mean eta**" in eta
    assert "|estimate - 0|" not in eta
    s_imp = methods["biasig.s_imp_diff"]
    assert (
        "two-sided 0.05: |estimate + the bootstrap's shift - 0| > z x the emulated pipeline "
        "bootstrap's" in s_imp
    )
    assert "calibrated on the world's null" in methods["biasig.eta"]


def test_required_size_is_monotone_and_hits_target():
    d = cb_design(n_roles=40)
    weak = P.required_size(d, "contextbias.bi_shift", 0.06, sims=80, seed=1)
    strong = P.required_size(d, "contextbias.bi_shift", 0.12, sims=80, seed=1)
    assert weak.needed is not None and strong.needed is not None
    assert strong.needed <= weak.needed
    assert weak.power_at_needed >= 0.8
    beyond = P.required_size(d, "contextbias.bi_shift", 5.0, sims=40)
    assert beyond.needed is None and "beyond" in beyond.note


# ----------------------------------------------------------------------------- CLI
DESIGN_KEYS = ("level", "target_power", "simulations", "seed", "priors")
"""The config's design section: keywords of _args that go into the config, not the argv."""


def _args(**kw):
    import tempfile

    import yaml

    from stereolens.plan import register

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    register(sub)
    configfile = kw.pop("configfile", "config/demo.yaml")
    design = {k: kw.pop(k) for k in DESIGN_KEYS if k in kw}
    sd = kw.pop("interaction_sd", None)
    if design or sd is not None:
        config = yaml.safe_load(Path(configfile).read_text())
        config["design"] = design
        if sd is not None:
            config["biasig"]["interaction_sd"] = sd
        configfile = Path(tempfile.mkdtemp()) / "config.yaml"
        configfile.write_text(yaml.safe_dump(config))
    argv = ["plan", "--configfile", str(configfile)]
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            argv.append(flag)
        elif isinstance(v, list):
            for x in v:
                argv += [flag, str(x)]
        else:
            argv += [flag, str(v)]
    return parser.parse_args(argv)


def test_cli_power_and_target_on_demo(capsys):
    args = _args(power=True, simulations=40, target_effect=["lvlm.tvd.term.gender=30"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "Minimum detectable effects (80% power, level 0.05)" in out
    for name in ("contextbias.bi_shift", "biasig.s_exp_diff", "lvlm.tvd.story.gender"):
        assert name in out
    assert "How each effect was computed:" in out
    assert "MDE (Holm)" in out and "estimand: these" in out
    assert "lvlm.tvd.term.gender=30:" in out and "images per group (configured 2)" in out
    assert "That run (lvlm.tasks.term.images_per_group" in out and "GPU-hours" in out


def test_cli_json_and_pilot(capsys, tmp_path):
    pilot = tmp_path / "results"
    (pilot / "biasig").mkdir(parents=True)
    (pilot / "contextbias").mkdir()
    # a pilot without ContextBias tables is refused, naming the file
    args = _args(power=True, simulations=20, pilot=pilot, json=True)
    with pytest.raises(ConfigError, match="attributes.parquet is missing"):
        args.func(args)
    args = _args(power=True, simulations=20, json=True)
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["design"]["simulations"] == 20 and out["design"]["rows"]
    assert {"name", "mde", "size_rate", "method", "curve"} <= set(out["design"]["rows"][0])


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"target_effect": ["nope=1"]}, "unknown effect 'nope'"),
        ({"target_effect": ["contextbias.bi_shift"]}, "write NAME=VALUE"),
        ({"target_effect": ["contextbias.bi_shift=-1"]}, "positive"),
        ({"power": True, "level": 0.7}, "design.level"),
        ({"power": True, "simulations": 5}, "design.simulations"),
        ({"pilot": Path("/nonexistent/results")}, "not a folder"),
        ({"power": True, "interaction_sd": -0.1}, "biasig.interaction_sd"),
    ],
)
def test_cli_refusals(kw, message):
    args = _args(**kw)
    with pytest.raises(ValueError, match=message):
        args.func(args)


def test_design_section_defaults_are_the_planners():
    config, _ = load_config("config/demo.yaml")  # no design section: the schema's defaults
    assert config["design"] == {
        "level": P.DEFAULT_LEVEL,
        "target_power": P.DEFAULT_POWER,
        "simulations": P.DEFAULT_SIMULATIONS,
        "seed": P.DEFAULT_SEED,
        "priors": None,
        "mode": "fixed",  # the papers' fixed runs unless a config asks for adaptive
        "adaptive": {
            "rounds": 3,
            "first_fraction": 0.25,
            "spending": "obrien_fleming",
            "timing": "information",
            "gamma": -4,
            "goal": "difference",
            "width": {},
            "margin": {},
            "gpu_hours_cap": None,
        },
    }


def test_priors_file_checked(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("version: other\n")
    with pytest.raises(ConfigError, match="expected version"):
        load_priors(bad)


def _pilot_folder(tmp_path):
    """A results folder with the tables --pilot reads, written from simulated datasets."""
    import numpy as np

    from stereolens.atomic import write_parquet

    res = tmp_path / "results"
    w = cb_design(n_roles=12).world
    _, by_role = C.draw_role_counts(w, 3, 1, np.random.default_rng(0), keep_roles=True)
    att = CW.attributes_table(w, by_role, 0).with_columns(pl.lit("tiny-vlm").alias("extractor"))
    imgs = att.select("extractor", "model", "role", "condition", "image_id").unique()
    write_parquet(res / "contextbias" / "attributes.parquet", att)
    write_parquet(res / "contextbias" / "images.parquet", imgs.with_columns(status=pl.lit("ok")))
    d = small_biasig()
    rng = np.random.default_rng(1)
    counts = BC._unit_counts(d, 2, d.world.dist_a, rng)
    write_parquet(
        res / "biasig" / "answers.parquet", BC.answers_table(d, "tiny-sd", counts, None, None, rng)
    )
    config, _ = load_config("config/demo.yaml")
    story = next(x for x in L.build(config, load_priors(), None) if x.task == "story")
    table, resp = LC.story_tables(story, ["female", "male"], 5, 0.0, rng, "gender")
    write_parquet(
        res / "lvlm" / "story_attributes.parquet", table.with_columns(setting=pl.lit("image"))
    )
    write_parquet(res / "lvlm" / "stories.parquet", resp.with_columns(setting=pl.lit("image")))
    return res


def test_pilot_replaces_the_prior_and_is_reproducible(tmp_path, capsys):
    pilot = _pilot_folder(tmp_path)
    args = _args(power=True, simulations=40, pilot=pilot, json=True)
    assert args.func(args) == 0
    first = capsys.readouterr().out
    assert args.func(args) == 0
    assert capsys.readouterr().out == first  # seeded: the same figures twice
    rows = {r["name"]: r for r in json.loads(first)["design"]["rows"]}
    assert rows["contextbias.bi_shift"]["basis"] == f"pilot {pilot}"
    assert rows["biasig.s_imp_diff"]["basis"] == f"pilot {pilot}"
    assert rows["lvlm.tvd.story.gender"]["basis"] == f"pilot {pilot}"
    assert rows["lvlm.tvd.term.gender"]["basis"] == "prior"  # no judgements in the pilot
    notes = json.loads(first)["design"]["notes"]
    assert any("are not the config's" in n for n in notes)  # pilot generators g1, g2


# ----------------------------------------------------------------------------- issue 20
def test_null_rule_rejects_at_the_level_without_effect():
    rng = np.random.default_rng(0)
    spec = P.EffectSpec("x", "b", "x", "u", "null")
    est = np.vstack([rng.normal(0.0, 1.0, 20_000), rng.normal(0.0, 1.0, 20_000) + 2.8])
    curve = P.power_curve(spec, est, 0.05)
    assert curve[0] == pytest.approx(0.05, abs=0.002)  # the null's own quantile
    assert curve[1] == pytest.approx(0.80, abs=0.02)  # |N(2.8, 1)| > 1.96


def test_paper_tables_imply_the_generators_correlation():
    # paper 002 Tables 8 (mean of 4 generators) and 9 (each), CA-U - CF half-widths
    implied = {c: CW.implied_correlation(m, g) for c, (m, g) in CW.PAPER_HALF_WIDTHS.items()}
    assert implied == pytest.approx(
        {"people": 0.297, "camera": 0.352, "objects": 0.713, "scene": 0.349}, abs=1e-3
    )
    # people by hand: s = 0.0175, 0.014, 0.012, 0.0145; sum 0.058, sum of squares 8.565e-4
    assert (16 * 0.010**2 - 8.565e-4) / (0.058**2 - 8.565e-4) == pytest.approx(0.297, abs=1e-3)
    # identical generators: the mean is as wide as each
    assert CW.implied_correlation(0.02, [0.02] * 4) == pytest.approx(1.0)


def test_split_concentration_keeps_the_total_scatter():
    ks, kg = CW.split_concentration(np.array([6.0, 6.0]), np.array([0.5, 1.0]))
    assert ks == pytest.approx([13.0, 6.0])  # 1 / (0.5 / 7) - 1; share 1: one level
    assert kg[0] == pytest.approx(12.0) and np.isinf(kg[1])
    assert 1 / (ks[0] + 1) + ks[0] / (ks[0] + 1) / (kg[0] + 1) == pytest.approx(1 / 7)


@pytest.mark.slow
def test_contextbias_prior_matches_paper_tables_8_and_9():
    config, _ = load_config("config/config.yaml")
    d = CW.build(config, load_priors(), None)
    assert d.world.roles.shape[0] == 4  # four generators, each its own roles now
    cal = CW.calibration(d, sims=400)
    for cohort, (mean_hw, gen_hw) in CW.PAPER_HALF_WIDTHS.items():
        hw, hw_mean, rho = cal[cohort]
        assert hw == pytest.approx(np.mean(gen_hw), rel=0.15), cohort  # Table 9
        assert hw_mean == pytest.approx(mean_hw, rel=0.15), cohort  # Table 8
        assert rho == pytest.approx(CW.implied_correlation(mean_hw, gen_hw), abs=0.12), cohort
    # the Scene half-width was 0.018 (identical generators, one kappa): now the paper's 0.025
    assert cal["scene"][0] > 0.022


def test_interaction_weight_at_paper_scale():
    config, _ = load_config("config/config.yaml")
    config["biasig"]["interaction_sd"] = 0.02
    d = BW.build(config, load_priors(), None)
    extra, sd = d._interaction(d.k_imp * d.world.k_i.sum(), 4000, np.random.default_rng(0))
    assert sd == pytest.approx(0.02 * 0.08141, rel=1e-3)  # ||c|| = 0.0814: 151 subjects
    assert extra.std() == pytest.approx(sd, rel=0.05)
    specs = {s.name: s for s in d.specs()}
    assert specs["biasig.s_imp_diff"].family == 28  # 8 generators
    assert "a new draw of 214 implicit subjects" in specs["biasig.s_imp_diff"].estimand


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sd", "mde"), [(0.0, 0.0018), (0.01, 0.0029), (0.02, 0.0049), (0.05, 0.0116)]
)
def test_biasig_mde_by_estimand(sd, mde):
    # issue 20: 0.0018 for the 214 fixed subjects; 0.0029 / 0.0049 / 0.0115 for a new draw
    # of subjects with a subject x model interaction sd of 0.01 / 0.02 / 0.05
    config, _ = load_config("config/config.yaml")
    config["biasig"]["interaction_sd"] = sd
    rows = {r.name: r for r in P.mde_rows(BW.build(config, load_priors(), None))}
    r = rows["biasig.s_imp_diff"]
    assert r.mde == pytest.approx(mde, rel=0.05)
    assert r.family == 28 and r.mde_holm > 1.3 * r.mde
    assert ("fixed subjects" in r.estimand) == (sd == 0)


def test_thin_towards_reads_each_segments_own_total():
    """Segment ids 0, 3, 5 (not 0..2): every item moved at w = 1 lands in its own segment's
    target column, so each segment keeps its total (the moved totals are read by id)."""
    from stereolens.design.sampling import thin_towards

    counts = np.array([[4, 0, 7, 1, 0, 2]])
    segment = np.array([0, 0, 3, 3, 5, 5])
    target = np.array([[0.0, 1.0, 1.0, 0.0, 0.0, 1.0]])
    ((_, out),) = list(
        thin_towards(counts, target, segment, np.array([1.0]), np.random.default_rng(0))
    )
    assert out.tolist() == [[0, 4, 8, 0, 0, 2]]


def test_contextbias_resize_grows_the_shard_with_the_seeds():
    """A target effect's ContextBias size keeps one job per role x condition: the shard
    grows with the seeds per prompt when it held them all, and never shrinks."""
    from types import SimpleNamespace

    config, _ = load_config("config/demo.yaml")
    design = SimpleNamespace(knob=C.ContextBiasDesign.knob)
    seeds = config["contextbias"]["seeds"]
    assert seeds["per_shard"] >= seeds["per_prompt"]
    new = C.ContextBiasDesign.resized(design, config, 7)["contextbias"]["seeds"]
    assert (new["per_prompt"], new["per_shard"]) == (7, max(seeds["per_shard"], 7))
    config = P.set_key(config, ("contextbias", "seeds", "per_shard"), 0)
    new = C.ContextBiasDesign.resized(design, config, 7)["contextbias"]["seeds"]
    assert (new["per_prompt"], new["per_shard"]) == (7, 0)  # a shard of fewer seeds stays


def test_a_plugins_priors_file_fills_its_section(tmp_path, monkeypatch):
    """A benchmark with a planner world and no section in the prior file: refused by name,
    unless its plug-in ships a priors file, whose content becomes its section."""
    import dataclasses

    from stereolens import benchmark as benchmark_module
    from stereolens.lvlm import plugin as lvlm_plugin

    shipped = load_priors()
    without = {k: v for k, v in shipped.items() if k != "lvlm"}
    prior_file = tmp_path / "p.yaml"
    prior_file.write_text(yaml.safe_dump(without))
    with pytest.raises(ConfigError, match="no section for lvlm"):
        load_priors(prior_file)
    section = tmp_path / "lvlm-priors.yaml"
    section.write_text(yaml.safe_dump(shipped["lvlm"]))
    own = dataclasses.replace(lvlm_plugin.BENCHMARK, priors=str(section))
    monkeypatch.setattr(lvlm_plugin, "OWN_PRIORS", own, raising=False)
    monkeypatch.setitem(benchmark_module.plugins(), "lvlm", f"{lvlm_plugin.__name__}:OWN_PRIORS")
    assert load_priors(prior_file)["lvlm"] == shipped["lvlm"]
