"""The adaptive audit's statistics (stereolens.design.adaptive) and the planner's adaptive
mode (stereolens.design.adaptive_plan, `stereolens plan --adaptive`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import integrate, optimize, stats

from stereolens.design import adaptive as A
from stereolens.design import adaptive_plan as AP

Z975 = stats.norm.isf(0.025)


# ----------------------------------------------------------------------------- boundaries
@pytest.mark.parametrize(
    ("rounds", "pocock", "obf"),
    [(2, 2.178, 1.977), (3, 2.289, 2.004), (4, 2.361, 2.024), (5, 2.413, 2.040)],
)
def test_classic_constants_are_jennison_turnbull_table_2_3(rounds, pocock, obf):
    """Pocock's C_P(K, 0.05) and O'Brien-Fleming's C_B(K, 0.05), equally spaced, two-sided
    (Jennison & Turnbull 2000, Table 2.3): the joint-normal machinery the spending
    boundaries use reproduces them to the table's three decimals."""
    assert A.classic_constant(rounds, 0.05, "pocock") == pytest.approx(pocock, abs=1.5e-3)
    assert A.classic_constant(rounds, 0.05, "obrien_fleming") == pytest.approx(obf, abs=1.5e-3)


def test_spending_functions_by_their_definitions():
    for s in A.SPENDINGS:
        assert A.spent(0.0, 0.05, s) == pytest.approx(0.0, abs=1e-15)
        assert A.spent(1.0, 0.05, s) == pytest.approx(0.05)
    # Lan-DeMets O'Brien-Fleming at t = 0.5: 2 - 2 Phi(1.959964 / sqrt(0.5) = 2.771808)
    assert A.spent(0.5, 0.05, "obrien_fleming") == pytest.approx(2 * stats.norm.sf(2.7718076))
    assert A.spent(0.5, 0.05, "pocock") == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2))
    assert A.spent(0.5, 0.05, "hsd", -4) == pytest.approx(
        0.05 * (1 - math.exp(2)) / (1 - math.exp(4))
    )


def _second_boundary(c1: float, rho: float, inside: float) -> float:
    """c2 with P(|Z1| < c1, |Z2| < c2) = inside, corr rho: by 1-D quadrature of Z1 (an
    independent route to the value the MVN CDF gives)."""
    s = math.sqrt(1 - rho**2)

    def p(c2):
        def f(z):
            return stats.norm.pdf(z) * (
                stats.norm.cdf((c2 - rho * z) / s) - stats.norm.cdf((-c2 - rho * z) / s)
            )

        return integrate.quad(f, -c1, c1, epsabs=1e-12)[0] - inside

    return optimize.brentq(p, 1.0, 4.0, xtol=1e-9)


@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
def test_two_round_boundaries_by_hand(spending):
    """K = 2 at t = 0.5, 1: c1 in closed form (O'Brien-Fleming type: z / sqrt(t) =
    2.7718; Pocock type: Phi^-1(1 - alpha(0.5) / 2) = 2.1570), c2 by quadrature: 1.9793 and
    2.2010 (the published Lan-DeMets Pocock-type pair is 2.157, 2.201)."""
    c = A.boundaries([0.5, 1.0], 0.05, spending)
    a1 = A.spent(0.5, 0.05, spending)
    c1 = stats.norm.isf(a1 / 2)
    assert c[0] == pytest.approx(c1, abs=1e-9)
    c2 = _second_boundary(c1, math.sqrt(0.5), 0.95)
    assert c[1] == pytest.approx(c2, abs=1e-4)
    expected = {"obrien_fleming": (2.7718, 1.9793), "pocock": (2.1570, 2.2010)}[spending]
    assert c == pytest.approx(expected, abs=1e-4)


def test_boundaries_with_unequal_information_and_errors():
    # information that does not grow with the size (ContextBias's shared roles): the second
    # round is almost the first, so its boundary is close to the first's
    c = A.boundaries([0.5, 1.0], info=[1.0, 1.05])
    c_even = A.boundaries([0.5, 1.0])
    assert c[0] == c_even[0] and c[1] < c_even[1]
    assert A.boundaries([1.0]) == pytest.approx([Z975])
    with pytest.raises(ValueError, match="fractions must not decrease"):
        A.boundaries([0.5, 0.4])
    # information time: the first round at 60% of the predicted information spends what
    # O'Brien-Fleming spends at t = 0.6 (c1 = 1.96 / sqrt(0.6)); size time at 0.25 less
    info = A.Rule(2, 0.25, timing="information").critical([1, 4], info=[6.0, 10.0])
    assert info[0] == pytest.approx(Z975 / math.sqrt(0.6), abs=1e-6)
    size = A.Rule(2, 0.25, timing="size").critical([1, 4], info=[6.0, 10.0])
    assert size[0] == pytest.approx(Z975 / math.sqrt(0.25), abs=1e-6) and size[1] < info[1]
    # the workflow computes c_k at round k from the rounds done: the same values
    rule = A.Rule(3, 0.25, timing="information")
    full = rule.critical([2, 5, 10], info=[2.0, 5.0, 10.0], predicted=10.0)
    assert rule.critical([2, 5, 10], info=[2.0], predicted=10.0) == pytest.approx(full[:1])
    assert rule.critical([2, 5, 10], info=[2.0, 5.0], predicted=10.0) == pytest.approx(full[:2])
    # without a prediction, information in proportion to the size: size time exactly
    assert rule.critical([2, 5, 10], info=[2.0, 5.0]) == pytest.approx(
        A.Rule(3, 0.25, timing="size").critical([2, 5, 10])[:2]
    )
    with pytest.raises(ValueError, match="timing 'nope'"):
        A.Rule(timing="nope")
    with pytest.raises(ValueError, match="spending 'nope'"):
        A.boundaries([0.5, 1], spending="nope")
    with pytest.raises(ValueError, match="goal 'nope'"):
        A.Goal("nope")


# ----------------------------------------------------------------------------- RCIs
def _nested_normal(rng, sims, sizes, mu):
    """(sims, K) means and their standard errors of nested samples of N(mu, 1): each
    round's new observations added to the previous ones (real increments, sd estimated)."""
    total, sq, n = np.zeros(sims), np.zeros(sims), 0
    est, se = [], []
    for m in sizes:
        x = rng.normal(mu, 1.0, (sims, m - n))
        total += x.sum(1)
        sq += (x**2).sum(1)
        n = m
        mean = total / n
        est.append(mean)
        se.append(np.sqrt((sq / n - mean**2) * n / (n - 1) / n))
    return np.stack(est, 1), np.stack(se, 1)


def test_rci_keeps_coverage_under_stopping_and_naive_peeking_does_not():
    """Three nested rounds (40, 80, 160 observations), 20,000 datasets: stopping when the
    repeated interval excludes 0 keeps the type-I error at 0.05 and the interval at the stop
    covers the truth (with an effect too); the naive rule (1.96 at every look) rejects in
    about 10%."""
    rng = np.random.default_rng(1)
    sizes = [40, 80, 160]
    rule = A.Rule(rounds=3, first_fraction=0.25)
    assert rule.sizes(160) == sizes
    crit = rule.critical(sizes)
    goal = A.Goal("difference")
    sims = 20_000
    err = 3 * math.sqrt(0.05 * 0.95 / sims)
    est, se = _nested_normal(rng, sims, sizes, 0.0)
    res = A.run_rule(est, se, crit, goal)
    assert res.rejects().mean() < 0.05 + err
    assert res.covers(0.0).mean() > 0.95 - err
    naive = A.run_rule(est, se, np.full(3, Z975), goal)
    assert naive.rejects().mean() > 0.09
    mu = 0.44  # twice the fixed design's MDE, 2.8 / sqrt(160)
    est, se = _nested_normal(rng, sims, sizes, mu)
    res = A.run_rule(est, se, crit, goal)
    assert res.covers(mu).mean() > 0.95 - err
    assert (res.stop_round < 2).mean() > 0.5  # most runs stop before the cap


def test_nested_estimates_have_the_canonical_covariance():
    rng = np.random.default_rng(0)
    v = np.array([4.0, 2.0, 1.0])
    est = A.nested_estimates(np.array([1.0, 1.0, 1.0]), v, 200_000, rng)
    cov = np.cov(est.T)
    expected = np.minimum.outer(v, v)  # cov(j, k) = V_max(j, k)
    assert cov == pytest.approx(expected, abs=0.03)
    assert est.mean(0) == pytest.approx([1, 1, 1], abs=0.02)


# ----------------------------------------------------------------------------- decisions
def test_decision_table_columns_and_reasons():
    goal = A.Goal("difference", margin=0.5)
    t = A.decision_table(
        1, ["a", "b", "c"], [1.0, 0.1, 0.1], [0.2, 0.2, 0.05], 2.0, goal, last=False
    )
    assert tuple(t.columns) == A.DECISION_COLUMNS
    assert t["ci_low"].to_list() == pytest.approx([0.6, -0.3, 0.0])
    assert t["ci_high"].to_list() == pytest.approx([1.4, 0.5, 0.2])
    assert t["decision"].to_list() == ["stop", "continue", "stop"]
    # c: [0.0, 0.2] does not exclude 0 but lies within +- 0.5
    assert t["reason"].to_list() == ["excludes 0", "open", "within the margin"]
    last = A.decision_table(3, ["b"], [0.1], [0.2], 2.0, goal, last=True)
    assert last["decision"].to_list() == ["stop"] and last["reason"].to_list() == ["cap reached"]
    goal = A.Goal("width", 0.5)
    width = A.decision_table(2, ["a", "b"], [0.0, 0.0], [0.1, 0.3], 2.0, goal, False)
    assert width["reason"].to_list() == ["width reached", "open"]
    eq = A.decision_table(2, ["a"], [0.0], [0.1], 2.0, A.Goal("equivalence", margin=0.25), False)
    assert eq["reason"].to_list() == ["within the margin"]
    with pytest.raises(ValueError, match="positive target width"):
        A.Goal("width")


def test_rule_sizes():
    assert A.Rule(rounds=3, first_fraction=0.25).sizes(10) == [2, 5, 10]
    assert A.Rule(rounds=4, first_fraction=0.125).sizes(16) == [2, 4, 8, 16]
    assert A.Rule(rounds=3, first_fraction=0.25).sizes(1) == [1]  # merged rounds
    assert A.Rule(rounds=1).sizes(7) == [7]


# ----------------------------------------------------------------------------- planner
def test_plan_adaptive_on_a_small_world():
    """The rule on ContextBias's small test world (12 roles, cap 8 seeds): under no effect
    the RCIs exclude 0 at about the level, at 2 x the MDE most runs stop early and cost
    less than the fixed design, whose cost is the cap's."""
    from design_worlds import cb_design

    d = cb_design(12)
    d.knob_value = 8
    rows = AP.plan_adaptive(
        d, A.Rule(3, 0.25), {"goal": "difference"}, lambda n: 10.0 * n, sims=100, draws=4000
    )
    row = next(r for r in rows if r.name == "contextbias.bi_shift")
    assert row.sizes == [2, 4, 8] and row.fixed_gpu_hours == 80.0
    null, _, two = row.worlds
    assert null.world == "no effect" and two.world == "effect = 2 x MDE"
    assert null.rejects < 0.08 and null.coverage > 0.92
    assert two.rejects > 0.9 and two.coverage > 0.92
    assert two.gpu_hours_median < row.fixed_gpu_hours
    assert len(row.critical) == 3 and row.critical[0] > row.critical[-1]


def test_plan_adaptive_counts_the_t_quantile_once(monkeypatch):
    """A bc-t world's rounds are drawn with the pipeline's se^2 (10 roles, below FEW_ROLES:
    the emulated role bootstrap's, Simulation.scale) and the critical values moved to t(R -
    1) by to_t, as the interim decision does on the pipeline's se; the variance was (t_0.975
    / z_0.975 x sd)^2, which counted t twice."""
    from design_worlds import cb_design

    d = cb_design(10)
    d.knob_value = 4
    sims, variances = [], []
    simulate, nested = d.simulate, A.nested_estimates

    def record_sim(*args):
        sims.append(simulate(*args))
        return sims[-1]

    def record_var(mean, var, *args):
        variances.append(np.asarray(var))
        return nested(mean, var, *args)

    monkeypatch.setattr(d, "simulate", record_sim)
    monkeypatch.setattr(A, "nested_estimates", record_var)
    AP.plan_adaptive(d, A.Rule(2, 0.5), {"goal": "difference"}, None, sims=60, draws=200)
    name = "contextbias.bi_shift"
    assert all(s.t_df[name] == 9 and s.scale[name].shape == (len(s.estimates[name]),) for s in sims)
    rounds = sims[1:]  # the first: mde_rows's at the cap
    se2 = [s.scale[name][0] ** 2 for s in rounds]  # no effect: w = 0
    np.testing.assert_allclose(variances[0], np.minimum.accumulate(se2), rtol=1e-12)
    assert all(s.scale[name][0] ** 2 > np.nanvar(s.estimates[name][0], ddof=1) for s in rounds)


def test_cli_adaptive_mode_on_demo(capsys, tmp_path):
    """design.mode: adaptive makes `stereolens plan` print the adaptive section; a bad
    spending name is refused by the schema."""
    import argparse

    from stereolens.plan import register
    from stereolens.validation import ConfigError

    config = yaml.safe_load(Path("config/demo.yaml").read_text())
    config["design"] = {"mode": "adaptive", "simulations": 40, "adaptive": {"rounds": 2}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["plan", "--configfile", str(path)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "Adaptive design (2 rounds from 0.25 of the cap, obrien_fleming spending" in out
    assert "- lvlm.tvd.story.gender: runs fixed" in out
    assert "fixed design at the cap:" in out and "GPU-hours median" in out
    config["design"]["adaptive"]["spending"] = "nope"
    path.write_text(yaml.safe_dump(config))
    args = parser.parse_args(["plan", "--configfile", str(path)])
    with pytest.raises(ConfigError, match="spending"):
        args.func(args)


def test_plan_applies_the_gpu_hours_cap_as_the_workflow_does(capsys, tmp_path):
    """`stereolens plan` on the adaptive demo on GPU models with a cap: the cap's shards are
    stereolens.design.rounds.budget's (the workflow's), its rounds at them (one seed per
    shard: 1 and 2 of the 4 seeds), beside the fixed design's cost at the cap."""
    import argparse

    from test_adaptive_rounds import THROUGHPUT, _gpu_config

    from stereolens.design import rounds as R
    from stereolens.models.registry import load_registry
    from stereolens.plan import register

    config = _gpu_config(gpu_hours_cap=5.0)
    config["design"]["simulations"] = 40
    path, tp = tmp_path / "c.yaml", tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(config))
    tp.write_text(yaml.safe_dump(THROUGHPUT))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["plan", "--configfile", str(path), "--throughput", str(tp)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    at = R.budget(config, load_registry("config/models.yaml"), THROUGHPUT)
    assert at.shards == {"contextbias": 2}
    assert f"- In the workflow: {R.describe_budget(at, {'contextbias': 'ContextBias'})}." in out
    assert "ContextBias 2 of 4 shard(s) per cell; the run at the cap 4.06 GPU-hours" in out
    line = next(x for x in out.splitlines() if x.startswith("- contextbias.bi_shift ("))
    # the fixed design at the cap: 2 seeds of the rounds, the validation prompts in full
    assert "rounds at 1, 2 seeds per prompt" in line
    assert "fixed design at the cap: 4.1 GPU-hours" in line
    # check-config prices the run as the workflow does (config/throughput.yaml): the same
    # words as the plan with that table, here 3 of the 4 shards at a cap of 0.25
    from stereolens.cli import main
    from stereolens.plan import default_throughput

    config["design"]["adaptive"]["gpu_hours_cap"] = 0.25
    path.write_text(yaml.safe_dump(config))
    at = R.budget(config, load_registry("config/models.yaml"), default_throughput())
    assert at.shards == {"contextbias": 3}
    text = R.describe_budget(at, {"contextbias": "ContextBias"})
    assert main(["check-config", "--configfile", str(path)]) == 0
    assert text in capsys.readouterr().out
    args = parser.parse_args(["plan", "--configfile", str(path)])
    assert args.func(args) == 0
    assert f"- In the workflow: {text}." in capsys.readouterr().out
    # the planner's rounds are the workflow's whole shards: 5 seeds in shards of 2 are 3
    # shards, rounds at 2 and 3 of them (4 and 5 seeds; Rule.sizes(5) would be 2 and 5)
    config["design"]["adaptive"]["gpu_hours_cap"] = None
    config["contextbias"]["seeds"].update(per_prompt=5, per_shard=2)
    path.write_text(yaml.safe_dump(config))
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "rounds at 4, 5 seeds per prompt" in out
    # one shard of all 5 seeds: the workflow refuses these rounds, the plan says so and
    # simulates the rule's sizes (2 and 5 seeds)
    config["contextbias"]["seeds"]["per_shard"] = 5
    path.write_text(yaml.safe_dump(config))
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "rounds at 2, 5 seeds per prompt" in out
    assert "ContextBias's shards allow one round, which the workflow refuses (make " in out


def test_workflow_sizes_are_the_rounds_whole_shards_in_the_planners_knob():
    """config/config.yaml in rounds (the recipe: contextbias.seeds.per_shard 2, 5 shards of 2
    seeds): the rule's 3 rounds from 0.25 at 1, 2 and 5 shards are 2, 4 and 10 seeds per
    prompt, what `stereolens plan` and bench/adaptive_saving.py simulate; shards of 1 seed
    give the rule's 2, 5, 10; one shard of 10 allows one round (None: the rule's sizes), and
    BiasIG, which runs fixed in the workflow, has none."""
    import argparse

    from stereolens.config import load_config
    from stereolens.design import rounds as R
    from stereolens.design.cli import designs, workflow_sizes
    from stereolens.plan import default_throughput

    config, registry = load_config("config/config.yaml")
    config["design"]["mode"] = "adaptive"
    rule = AP.rule_from(config["design"]["adaptive"], config["design"]["level"])
    found = {d.benchmark: d for d in designs(config, argparse.Namespace(pilot=None))}
    got = {}
    for per_shard in (1, 2, 10):
        config["contextbias"]["seeds"]["per_shard"] = per_shard
        at = R.budget(config, registry, default_throughput())
        got[per_shard] = workflow_sizes(config, found["contextbias"], at, rule)
        assert workflow_sizes(config, found["biasig"], at, rule) is None
    assert got == {1: [2, 5, 10], 2: [2, 4, 10], 10: None}


def test_goals_from_the_config_and_the_width_goal_on_a_small_world():
    """design.adaptive's goal per effect: width only where a width is given, equivalence
    with the MDE as the default margin; a width goal stops at the first round whose RCI is
    narrow enough (the world's se shrinks with the seeds), the same in every world."""
    from design_worlds import cb_design

    from stereolens.design.power import EffectSpec

    spec = EffectSpec("x", "b", "c", "u", "interval")
    assert AP.goal_for(spec, {"goal": "width", "width": {}}, 0.1) is None
    assert AP.goal_for(spec, {"goal": "width", "width": {"x": 0.2}}, 0.1).width == 0.2
    assert AP.goal_for(spec, {"goal": "equivalence"}, 0.1).margin == 0.1
    assert AP.goal_for(spec, {"goal": "difference", "margin": {"x": 0.3}}, None).margin == 0.3
    d = cb_design(12)
    d.knob_value = 8
    base = AP.plan_adaptive(d, A.Rule(3, 0.25), {"goal": "difference"}, None, sims=60, draws=500)
    row0 = next(r for r in base if r.name == "contextbias.bi_shift")
    assert row0.fixed_gpu_hours is None and row0.worlds[0].gpu_hours_median is None  # no cost
    # a width every round reaches: all runs stop after the first; one none reaches: at the cap
    for width, first, settled in ((1.0, 1.0, 1.0), (1e-6, 0.0, 0.0)):
        options = {"goal": "width", "width": {"contextbias.bi_shift": width}}
        rows = AP.plan_adaptive(d, A.Rule(3, 0.25), options, float, sims=60, draws=500)
        row = next(r for r in rows if r.name == "contextbias.bi_shift")
        assert row.goal == f"RCI width <= {width:g} BI"
        assert all(w.stop_share[0] == first and w.settled == settled for w in row.worlds)
        assert all(w.size_median == (2 if first else 8) for w in row.worlds)
    others = [r for r in rows if r.name != "contextbias.bi_shift"]
    assert others and all("no width target" in r.note for r in others)
