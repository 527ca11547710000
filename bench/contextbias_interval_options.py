"""The ContextBias interval options measured for issue 20 (bench/COVERAGE.md, ContextBias):
the pipeline's role bootstrap re-implemented in numpy on the coverage rows' worlds
(bench/cover/contextbias.py: the planner's prior world, g2 = g1 pulled 15%, CA-U pulled 10%),
so that 1,000 datasets take a minute. Per dataset: paired role draws, pooled BI per
dimension, cohort = mean of its dimensions, overall = mean of the cohorts, with K
"own" (labels the model shows, the CLI's --k model), "vocab_union" (the closed vocabulary's
size, else the labels either generator shows: support "common") or "world" (the world's
label count, an oracle), "cs_*" the same with the Chao-Shen entropy. Rows: the g2 - g1
difference under CF (Wald z on the plug-in,
"bc" on the bias-corrected difference, "bct" bias-corrected with t(R - 1) sqrt(R / (R -
1)), "jk" bias-corrected with t(R - 1) and the role jackknife's se: comparisons.parquet's,
"basic"), the shift difference (also "bct" and "jk"), and g1's CA-U - CF shift (basic,
percentile, BCa with a role jackknife, Wald, Wald t, bc-t = "bcwaldt"). Truth as the coverage
rows (the differences under the vocab_union options: K = a closed dimension's vocabulary
size).

Usage: PYTHONPATH=src python bench/contextbias_interval_options.py paper DATASETS [B]
       [ROLES] [OPTIONS]   (ROLES: the paper world with that many roles; OPTIONS e.g.
       own,vocab_union)
"""

import sys
import time
import warnings

import numpy as np
from scipy import stats
from scipy.special import xlogy

sys.path.insert(0, "bench")
from cover import contextbias as C

from stereolens.contextbias.bootstrap import role_multiplicity
from stereolens.contextbias.design import draw_role_counts

scale = sys.argv[1]
n = int(sys.argv[2])
B = int(sys.argv[3]) if len(sys.argv) > 3 else 200
roles_override = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] else None
w = C._planted_world(C._world(scale))
if roles_override:
    from dataclasses import replace

    # configured roles: first `roles_override` rows of prompts (cycled)
    pr = np.resize(w.prompts, (roles_override, 2))
    w = replace(w, prompts=pr, role_names=[f"r{i}" for i in range(roles_override)])
size = C.SCALES[scale]
seeds = size["seeds"]
truth = C._truth(w)  # (G, 2, 1+cohorts)
truth_vocab = C._truth(w, vocabulary=True)  # the comparisons' estimand under support "common"
starts, member = w.starts, w.member
G = len(w.generators)
L = w.n_columns
D = len(w.dims)
seg = w.segment
vocab = w.vocab_k
cohort_levels = list(range(1, 1 + len(w.cohorts)))


def levels(bi):  # (..., D) -> (..., 1+cohorts) overall=mean of cohorts
    ok = np.isfinite(bi)
    num = np.where(ok, bi, 0) @ member.T
    den = ok.astype(float) @ member.T
    with np.errstate(invalid="ignore", divide="ignore"):
        coh = num / den
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        top = np.nanmean(coh, -1)
    return np.concatenate([top[..., None], coh], -1)


def bi_k(c, k):
    total = np.add.reduceat(c, starts, -1)
    xl = np.add.reduceat(xlogy(c, c), starts, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.maximum(np.log(total) - xl / total, 0)
        bi = 1 - h / np.log(k)
    bi = np.where(k == 1, 0.0, bi)
    return np.where(total > 0, bi, np.nan)


def bi_cs(c, k):
    total = np.add.reduceat(c, starts, -1)
    tot_l = total[..., seg]
    f1 = np.add.reduceat((c == 1).astype(float), starts, -1)
    f1 = np.where(f1 >= total, total - 1, f1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cov = (1 - f1 / total)[..., seg]
        pa = cov * c / tot_l
        term = np.where(c > 0, -pa * np.log(np.where(pa > 0, pa, 1)) / (1 - (1 - pa) ** tot_l), 0)
        h = np.add.reduceat(term, starts, -1)
        bi = 1 - h / np.log(k)
    bi = np.where(k == 1, 0.0, bi)
    return np.where(total > 0, bi, np.nan)


def present(x):  # (..., L) -> (..., D) count of labels > 0
    return np.add.reduceat((x > 0).astype(float), starts, -1)


OPTS = ["own", "vocab_union"] if len(sys.argv) < 6 else sys.argv[5].split(",")


def all_bi(pooled, kfix=None):
    """pooled (G, B, 2, L) -> opt -> (G, B, 2, 1+cohorts)"""
    out = {}
    own = present(pooled.sum(2))  # (G,B,D)
    uni = present(pooled.sum((0, 2)))  # (B,D)
    for o in OPTS:
        if o == "own":
            k = own[:, :, None]
        elif o == "union":
            k = np.broadcast_to(uni[None, :, None], own[:, :, None].shape)
        elif o == "unionfix":
            k = np.broadcast_to(kfix, own[:, :, None].shape)
        elif o == "cs_vocab_union":
            out[o] = levels(bi_cs(pooled, np.where(np.isnan(vocab), uni[None, :, None], vocab)))
            continue
        elif o == "cs_world":
            out[o] = levels(
                bi_cs(pooled, np.broadcast_to(w.sizes.astype(float), own[:, :, None].shape))
            )
            continue
        elif o == "vocab_union":
            k = np.where(np.isnan(vocab), uni[None, :, None], vocab)
        else:
            k = np.broadcast_to(w.sizes.astype(float), own[:, :, None].shape)
        out[o] = levels(bi_k(pooled, k))
    return out


rng = np.random.default_rng([20, n, len(scale)])
t0 = time.time()
_, by_role = draw_role_counts(w, seeds, n, rng, keep_roles=True, planted=C.PLANTED)
R = by_role.shape[2]
print("draw", time.time() - t0, by_role.shape, flush=True)
z = 1.959963984540054
res = {}


def add(k, est, lo, hi, t):
    res.setdefault(k, []).append((est, lo, hi, t))


brng = np.random.default_rng(5)
for d in range(n):
    x = by_role[:, d].astype(float)  # (G, R, 2, L)
    draws = brng.integers(0, R, size=(B, R))
    mult = role_multiplicity(draws, R)
    est_p = x.sum(1)[:, None]  # (G,1,2,L)
    rep_p = np.einsum("br,grcl->gbcl", mult, x)
    kfix = present(est_p.sum((0, 2)))[None, :, None]  # (1,1,1,D)
    e = all_bi(est_p, kfix)
    r = all_bi(rep_p, kfix)
    # jackknife (leave one role out) for BCa of shift
    jk = x.sum(1)[:, None] - x  # (G,R,2,L)
    ej = all_bi(jk, kfix)
    for o in OPTS:
        E, Rp = e[o][:, 0], r[o]  # (G,2,lev), (G,B,2,lev)
        # CF difference g2-g1
        de = E[1, 0] - E[0, 0]
        dr = Rp[1, :, 0] - Rp[0, :, 0]
        se = dr.std(0, ddof=1)
        tv = truth_vocab if o.endswith("vocab_union") else truth
        tt = tv[1, 0] - tv[0, 0]
        dm = dr.mean(0)
        dq = np.percentile(dr, [2.5, 97.5], 0)
        for li in range(de.shape[0]):
            add(f"{o} bi g2-g1 CF L{li}", de[li], de[li] - z * se[li], de[li] + z * se[li], tt[li])
            bc = 2 * de[li] - dm[li]
            add(f"{o} bi g2-g1 CFbc L{li}", bc, bc - z * se[li], bc + z * se[li], tt[li])
            tf = stats.t.ppf(0.975, R - 1) * np.sqrt(R / (R - 1))
            add(f"{o} bi g2-g1 CFbct L{li}", bc, bc - tf * se[li], bc + tf * se[li], tt[li])
            djk = ej[o][1, :, 0, li] - ej[o][0, :, 0, li]  # (R,) leave-one-role-out
            sjk = np.sqrt((R - 1) / R * ((djk - djk.mean()) ** 2).sum())
            tq = stats.t.ppf(0.975, R - 1)
            add(f"{o} bi g2-g1 CFjk L{li}", bc, bc - tq * sjk, bc + tq * sjk, tt[li])
            add(
                f"{o} bi g2-g1 CFbasic L{li}",
                bc,
                2 * de[li] - dq[1, li],
                2 * de[li] - dq[0, li],
                tt[li],
            )
        # shift difference g2-g1
        sde = (E[1, 1] - E[1, 0]) - (E[0, 1] - E[0, 0])
        sdr = (Rp[1, :, 1] - Rp[1, :, 0]) - (Rp[0, :, 1] - Rp[0, :, 0])
        sse = sdr.std(0, ddof=1)
        tsd = (tv[1, 1] - tv[1, 0]) - (tv[0, 1] - tv[0, 0])
        sdm = sdr.mean(0)
        for li in range(de.shape[0]):
            add(
                f"{o} bishift g2-g1 L{li}",
                sde[li],
                sde[li] - z * sse[li],
                sde[li] + z * sse[li],
                tsd[li],
            )
            bc = 2 * sde[li] - sdm[li]
            tf = stats.t.ppf(0.975, R - 1) * np.sqrt(R / (R - 1))
            add(f"{o} bishiftbct g2-g1 L{li}", bc, bc - tf * sse[li], bc + tf * sse[li], tsd[li])
            e1, e0 = ej[o][1, :, :, li], ej[o][0, :, :, li]
            sj = (e1[:, 1] - e1[:, 0]) - (e0[:, 1] - e0[:, 0])
            sjk = np.sqrt((R - 1) / R * ((sj - sj.mean()) ** 2).sum())
            tq = stats.t.ppf(0.975, R - 1)
            add(f"{o} bishiftjk g2-g1 L{li}", bc, bc - tq * sjk, bc + tq * sjk, tsd[li])
        # shift g1, basic / percentile / bca / wald
        se_ = E[0, 1] - E[0, 0]
        sr = Rp[0, :, 1] - Rp[0, :, 0]
        ts = truth[0, 1] - truth[0, 0]
        q = np.percentile(sr, [2.5, 97.5], 0)
        sj = ej[o][0, :, 1] - ej[o][0, :, 0]  # (R, lev)
        for li in range(se_.shape[0]):
            add(
                f"{o} shift g1 basic L{li}",
                se_[li],
                2 * se_[li] - q[1, li],
                2 * se_[li] - q[0, li],
                ts[li],
            )
            add(f"{o} shift g1 pct L{li}", se_[li], q[0, li], q[1, li], ts[li])
            s = sr[:, li].std(ddof=1)
            add(f"{o} shift g1 wald L{li}", se_[li], se_[li] - z * s, se_[li] + z * s, ts[li])
            # BCa
            z0 = stats.norm.ppf(
                np.clip(
                    (sr[:, li] < se_[li]).mean() + 0.5 * (sr[:, li] == se_[li]).mean(),
                    1e-6,
                    1 - 1e-6,
                )
            )
            jm = sj[:, li].mean()
            u = jm - sj[:, li]
            a = (u**3).sum() / (6 * ((u**2).sum()) ** 1.5) if (u**2).sum() > 0 else 0
            al = []
            for zz in (-z, z):
                al.append(stats.norm.cdf(z0 + (z0 + zz) / (1 - a * (z0 + zz))))
            qb = np.percentile(sr[:, li], [100 * al[0], 100 * al[1]])
            add(f"{o} shift g1 bca L{li}", se_[li], qb[0], qb[1], ts[li])
            # t with df R-1
            tq = stats.t.ppf(0.975, R - 1)
            add(f"{o} shift g1 waldt L{li}", se_[li], se_[li] - tq * s, se_[li] + tq * s, ts[li])
            bc = 2 * se_[li] - sr[:, li].mean()
            s2 = s * np.sqrt(R / (R - 1))
            add(f"{o} shift g1 bcwaldt L{li}", bc, bc - tq * s2, bc + tq * s2, ts[li])
            add(
                f"{o} shift g1 basict L{li}",
                bc,
                2 * se_[li] - q[1, li] - (tq / z * s2 - s) * 0,
                2 * se_[li] - q[0, li],
                ts[li],
            )
            # basic widened by t/z * sqrt(R/(R-1)) around the basic centre
            c0 = 2 * se_[li] - np.median(sr[:, li])
            f = tq / z * np.sqrt(R / (R - 1))
            add(
                f"{o} shift g1 basicw L{li}",
                bc,
                c0 - f * (c0 - (2 * se_[li] - q[1, li])),
                c0 + f * ((2 * se_[li] - q[0, li]) - c0),
                ts[li],
            )
    if d % 50 == 0:
        print(d, time.time() - t0, flush=True)
names = ["overall"] + list(w.cohorts)
print(f"scale {scale}, {n} datasets, B {B}, R {R}")
for k, v in sorted(res.items()):
    a = np.array(v)
    cov = ((a[:, 1] <= a[:, 3]) & (a[:, 3] <= a[:, 2])).mean()
    li = int(k.split("L")[-1])
    err = np.sqrt(cov * (1 - cov) / len(a))
    bias, sd, width = np.mean(a[:, 0] - a[:, 3]), a[:, 0].std(), np.mean(a[:, 2] - a[:, 1])
    print(
        f"{k.rsplit(' ', 1)[0]:28s} {names[li]:8s} cov {cov:6.1%} +- {err:.1%} "
        f"bias {bias:+.5f} sd {sd:.5f} width {width:.5f} truth {a[0, 3]:+.4f}"
    )
