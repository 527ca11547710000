"""BiasIG eta pairs: the implicit prompts and persons each pair of truth/eta.json names
(:func:`resolve_pairs`) and :class:`Eta`, the counts pooled per side and the etas."""

from __future__ import annotations

import numpy as np
import polars as pl
from scipy import sparse

from stereolens.biasig.answers import Prepared
from stereolens.biasig.formulas import ETA_VARIANTS, eta_contributions, eta_from_contributions
from stereolens.biasig.groups import attribute_shares, replicate_moments, safe_div, sum_groups
from stereolens.biasig.truth import ATTRIBUTES, SLICES, VALUES, BiasIGTruth, norm_name, positions
from stereolens.ids import stable_id

INNER_REPLICATES = 20
"""Second-level replicates per bootstrap replicate of eta's iterated bias correction."""
INNER_DRAWS = 2_000_000
"""Side counts drawn at once by :meth:`Eta.inner` (memory only, not results)."""

_RELEASED_EXPLICIT_WORDS = (
    "man",
    "woman",
    "male",
    "female",
    "young",
    "middle-aged",
    "elderly",
    "White",
    "East Asian",
    "South Asian",
    "Black",
)


def resolve_pairs(
    prompts: pl.DataFrame, truth: BiasIGTruth, variant: str = "paper"
) -> pl.DataFrame:
    """Which implicit acquired attribute (attribute_key) and person (position) each side of
    each eta.json pair refers to; null where a name does not resolve.

    paper: whole names, case-insensitive, through the name aliases ("ugly" ->
    "unattractive", "High school teacher" -> "High School Teacher"); relation pairs ("X at
    left", "Y at right") are the left and right person of the relation prompt "One X at
    left with one Y at right".
    released: the authors' rule: a name matches a subject that contains it as a substring
    (``name + " person"``, ``"of one " + name``, ``"One " + name`` on the left part of a
    relation subject, ``"one " + name`` on the right part), case-sensitive, the last match
    in prompt-table order wins ("respectful" ends on "disrespectful", "successful" on
    "unsuccessful"), and subjects containing a protected word ("man" in "Human Resources
    Manager") are skipped. "ugly", "High school teacher" and "STEM student" do not resolve.
    """
    if variant not in ETA_VARIANTS:
        raise ValueError(f"eta variant {variant!r}; allowed: {', '.join(ETA_VARIANTS)}")
    implicit = (
        prompts.filter(pl.col("visibility") == "implicit")
        .unique("attribute_key", keep="first", maintain_order=True)
        .select("attribute_key", "acquired_type", "acquired_attribute", "role_left", "role_right")
        .rows(named=True)
    )
    rows = []
    for pair in truth.pairs:
        sides = {}
        if variant == "paper":
            adv, dis = pair.advantaged, pair.disadvantaged
            if adv.endswith(" at left") and dis.endswith(" at right"):
                left, right = (
                    norm_name(adv[: -len(" at left")]),
                    norm_name(dis[: -len(" at right")]),
                )
                hit = [
                    e
                    for e in implicit
                    if e["acquired_type"] == "social_relation"
                    and norm_name(e["role_left"]) == left
                    and norm_name(e["role_right"]) == right
                ]
                key = hit[0]["attribute_key"] if len(hit) == 1 else None
                sides = {"advantaged": (key, "left"), "disadvantaged": (key, "right")}
            else:
                for side, name in (("advantaged", adv), ("disadvantaged", dis)):
                    hit = [
                        e
                        for e in implicit
                        if e["acquired_type"] != "social_relation"
                        and norm_name(name)
                        in {
                            norm_name(e["acquired_attribute"]),
                            norm_name(truth.truth_name(e["acquired_attribute"])),
                        }
                    ]
                    sides[side] = (hit[0]["attribute_key"] if len(hit) == 1 else None, "single")
        else:
            subjects = []
            for e in implicit:
                key = e["attribute_key"]
                if e["acquired_type"] == "social_relation":
                    left_part, right_part = key.split(" with ", 1)
                    subjects += [(left_part, key, "left"), (right_part, key, "right")]
                else:
                    subjects.append((key, key, "single"))
            subjects = [s for s in subjects if not any(w in s[0] for w in _RELEASED_EXPLICIT_WORDS)]
            for side, name in (
                ("advantaged", pair.advantaged),
                ("disadvantaged", pair.disadvantaged),
            ):
                found = (None, None)
                for text, key, pos in subjects:
                    if (
                        (name + " person") in text
                        or ("of one " + name) in text
                        or ("One " + name) in text
                        or (("one " + name) in text and name.endswith(("left", "right")))
                    ):
                        found = (key, pos)
                sides[side] = found
        types = {e["attribute_key"]: e["acquired_type"] for e in implicit}
        (ak, ap), (dk, dp) = sides["advantaged"], sides["disadvantaged"]
        rows.append(
            {
                "pair": pair.name,
                "advantaged": pair.advantaged,
                "disadvantaged": pair.disadvantaged,
                "pair_weight": pair.weight,
                "acquired_type": types.get(ak) or types.get(dk),
                "advantaged_key": ak,
                "advantaged_position": ap if ak else None,
                "disadvantaged_key": dk,
                "disadvantaged_position": dp if dk else None,
            }
        )
    return pl.DataFrame(
        rows,
        schema={
            "pair": pl.String,
            "advantaged": pl.String,
            "disadvantaged": pl.String,
            "pair_weight": pl.Float64,
            "acquired_type": pl.String,
            "advantaged_key": pl.String,
            "advantaged_position": pl.String,
            "disadvantaged_key": pl.String,
            "disadvantaged_position": pl.String,
        },
    )


class Eta:
    """Counts pooled per side of each pair: (variant, model, acquired attribute, person)."""

    def __init__(self, prep: Prepared, truth: BiasIGTruth, pairs: pl.DataFrame):
        units = prep.units
        self.pairs = pairs
        sides: dict[tuple[str, str], int] = {}
        for row in pairs.iter_rows(named=True):
            for side in ("advantaged", "disadvantaged"):
                key, pos = row[f"{side}_key"], row[f"{side}_position"]
                if key is not None and (key, pos) not in sides:
                    sides[(key, pos)] = len(sides)
        self.sides = sides
        self.n_sides = max(len(sides), 1)
        self.gt = np.zeros((self.n_sides, len(VALUES)))
        for (key, pos), i in sides.items():
            self.gt[i] = truth.distribution(key, pos)
        self.runs = [(v, m) for v, m, _, _ in prep.runs]
        self.n_slots = len(self.runs) * self.n_sides
        impl = (units["visibility"] == "implicit").to_list()
        keys = units["attribute_key"].to_list()
        persons = units["n_persons"].to_list()
        self.slot_of = np.full((units.height, 2), -1, dtype=np.int64)
        for ri, (_, _, a, b) in enumerate(prep.runs):
            for u in range(a, b):
                if not impl[u]:
                    continue
                for s, pos in enumerate(positions(persons[u])):
                    i = sides.get((keys[u], pos))
                    if i is not None:
                        self.slot_of[u, s] = ri * self.n_sides + i
        self.mask = (self.slot_of >= 0).any(1)
        self.images = np.zeros(self.n_slots)
        n_images = units["n_images"].to_numpy()
        for s in (0, 1):
            ok = self.slot_of[:, s] >= 0
            np.add.at(self.images, self.slot_of[ok, s], n_images[ok])

    def sums(self, counts: np.ndarray, us: np.ndarray, local: bool = False):
        """counts (B, R, 2, 9) of units ``us`` -> (slots, R, 9); ``local``: (touched, pooled)."""
        touched = np.unique(self.slot_of[us][self.slot_of[us] >= 0])
        rows = touched if local else np.arange(self.n_slots)
        where = np.full(self.n_slots, -1, dtype=np.int64)
        where[rows] = np.arange(rows.size)
        out = np.zeros((rows.size,) + counts.shape[1:2] + (len(VALUES),))
        for s in (0, 1):
            slot = self.slot_of[us, s]
            ok = slot >= 0
            if ok.any():
                m = sparse.csr_matrix(
                    (np.ones(int(ok.sum())), (where[slot[ok]], np.flatnonzero(ok))),
                    shape=(rows.size, us.size),
                )
                out += sum_groups(m, np.ascontiguousarray(counts[:, :, s, :]))
        return (touched, out) if local else out

    def inner(
        self,
        pooled: np.ndarray,
        truth: BiasIGTruth,
        variant: str,
        seed: int,
        inner_n: int = INNER_REPLICATES,
    ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """The second level of eta's double bootstrap: ``inner_n`` resamples of each
        replicate's side counts ``pooled`` (slots, R, 9) (per attribute a multinomial at its
        shares), each run its own stream seeded by (seed, variant, model). Returns ((mean,
        variance) of the pair etas (runs, pairs, R, 4)), ((mean, variance) of the model
        etas (runs, R, 4)), variance ddof 1."""
        n_runs, reps = len(self.runs), pooled.shape[1]
        pooled = pooled.reshape(n_runs, self.n_sides, reps, len(VALUES))
        rngs = [
            np.random.default_rng([seed, int(stable_id("biasig-eta-inner", v, m, length=15), 16)])
            for v, m in self.runs
        ]
        n_pairs = self.pairs.height
        pair_m, pair_v = np.full((2, n_runs, n_pairs, reps, 4), np.nan)
        model_m, model_v = np.full((2, n_runs, reps, 4), np.nan)
        step = max(1, INNER_DRAWS // max(1, n_runs * self.n_sides * inner_n))
        for r0 in range(0, reps, step):
            r1 = min(reps, r0 + step)
            drawn = np.stack(
                [_resample_shares(pooled[ri, :, r0:r1], inner_n, rngs[ri]) for ri in range(n_runs)]
            )  # (runs, sides, r, inner, 9)
            flat = drawn.reshape(n_runs * self.n_sides, (r1 - r0) * inner_n, len(VALUES))
            flat = flat.astype(float)
            eta, model = self.etas(flat, truth, variant)[:2]
            eta = eta.reshape(n_runs, n_pairs, r1 - r0, inner_n, 4)
            model = model.reshape(n_runs, r1 - r0, inner_n, 4)
            pair_m[:, :, r0:r1], sd = replicate_moments(eta, 3)
            pair_v[:, :, r0:r1] = sd**2
            model_m[:, r0:r1], sd = replicate_moments(model, 2)
            model_v[:, r0:r1] = sd**2
        return (pair_m, pair_v), (model_m, model_v)

    def etas(self, pooled: np.ndarray, truth: BiasIGTruth, variant: str):
        """pooled (slots, R, 9) -> pair etas (runs, pairs, R, 4), model etas (runs, R, 4),
        status and note (runs, pairs), and which pair etas count (runs, pairs, R, 4)."""
        reps = pooled.shape[1]
        pooled = pooled.reshape(len(self.runs), self.n_sides, reps, len(VALUES))
        shares = attribute_shares(pooled)
        if variant == "released":  # the released shares are 0 when nothing was usable
            shares = np.nan_to_num(shares)
        images = self.images.reshape(len(self.runs), self.n_sides)
        k = truth.settings.k_eta_vector()
        n_pairs = self.pairs.height
        eta = np.full((len(self.runs), n_pairs, reps, 4), np.nan)
        status = np.full((len(self.runs), n_pairs), "unresolved", dtype=object)
        note = np.full((len(self.runs), n_pairs), "", dtype=object)
        for pi, row in enumerate(self.pairs.iter_rows(named=True)):
            if row["advantaged_key"] is None or row["disadvantaged_key"] is None:
                names = [row[s] for s in ("advantaged", "disadvantaged") if row[f"{s}_key"] is None]
                note[:, pi] = f"no implicit prompt matches {names}"
                continue
            ai = self.sides[(row["advantaged_key"], row["advantaged_position"])]
            di = self.sides[(row["disadvantaged_key"], row["disadvantaged_position"])]
            contrib = eta_contributions(
                shares[:, ai], self.gt[ai], shares[:, di], self.gt[di], k, variant
            )
            eta[:, pi] = eta_from_contributions(contrib)
            has = (images[:, ai] > 0) & (images[:, di] > 0)
            eta[~has, pi] = np.nan
            for ri in range(len(self.runs)):
                point = eta[ri, pi, 0]
                if not has[ri]:
                    note[ri, pi] = "no answers for a side of the pair"
                elif np.isnan(point).all():
                    note[ri, pi] = "no usable answers"
                elif np.isnan(point).any():
                    status[ri, pi] = "partial"
                    note[ri, pi] = "an attribute has no usable answers on a side"
                else:
                    status[ri, pi] = "ok"
        if variant == "released":
            unresolved = status == "unresolved"
            eta[unresolved] = 0.5
            note[unresolved] = [f"{n}; counted as 0.5 (released)" for n in note[unresolved]]
        weights = self.pairs["pair_weight"].to_numpy()[None, :, None, None]
        valid = ~np.isnan(eta)
        model = safe_div((np.nan_to_num(eta) * weights).sum(1), (valid * weights).sum(1))
        return eta, model, status, note, valid


def _resample_shares(counts: np.ndarray, inner_n: int, rng: np.random.Generator) -> np.ndarray:
    """counts (..., 9) -> (..., inner_n, 9): per attribute a multinomial of the row's total
    at its shares (conditional binomials, value by value)."""
    counts = counts.astype(np.int64)
    out = np.zeros(counts.shape[:-1] + (inner_n, len(VALUES)), dtype=np.int64)
    for attribute in ATTRIBUTES:
        sl = SLICES[attribute]
        c = counts[..., sl]
        left = np.repeat(c.sum(-1)[..., None], inner_n, axis=-1)
        mass = c.sum(-1, keepdims=True).astype(float)
        for j in range(sl.stop - sl.start - 1):
            with np.errstate(invalid="ignore", divide="ignore"):
                p = np.where(mass > 0, c[..., j : j + 1] / mass, 0.0)
            x = rng.binomial(left, np.clip(p, 0.0, 1.0))
            out[..., sl.start + j] = x
            left -= x
            mass = mass - c[..., j : j + 1]
        out[..., sl.stop - 1] = left
    return out
