"""BiasIG bootstrap resampling (:class:`Resampler`): the counts (units, replicates, 2 persons,
9 values) of the point estimate and of the replicates, images resampled within each unit."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy import sparse

from stereolens.biasig.answers import Prepared
from stereolens.biasig.truth import VALUES
from stereolens.ids import stable_id

if TYPE_CHECKING:
    from stereolens.biasig.groups import Explicit

DRAW_BUDGET = 250_000
"""Images drawn per bootstrap block (replicates x images of the block). The blocks decide how
each run's random stream is consumed: changing this changes the intervals."""
CHUNK_UNITS = 256
"""Units scored together (whole blocks; memory only, no result depends on it)."""


def _counts_from_draws(
    codes: np.ndarray, local_unit: np.ndarray, n_units: int, replicates: int
) -> np.ndarray:
    """codes (R, images, 2, 3), local_unit (images,) -> counts (n_units, R, 2, 9)."""
    r = np.arange(replicates, dtype=np.int64)[:, None, None, None]
    u = local_unit.astype(np.int64)[None, :, None, None]
    s = np.arange(2, dtype=np.int64)[None, None, :, None]
    key = ((u * replicates + r) * 2 + s) * len(VALUES) + codes
    flat = np.bincount(key[codes >= 0], minlength=n_units * replicates * 2 * len(VALUES))
    return flat.reshape(n_units, replicates, 2, len(VALUES)).astype(float)


def point_counts(prep: Prepared) -> np.ndarray:
    n_units = prep.units.height
    local = np.repeat(np.arange(n_units), np.diff(prep.offsets))
    return _counts_from_draws(prep.codes[None], local, n_units, 1)


def _block_bounds(prep: Prepared, replicates: int, u_start: int, u_end: int):
    """(u0, u1): the units of each bootstrap block of a run, about DRAW_BUDGET draws each
    (at least one unit). The blocks fix how the run's random stream is consumed."""
    per_block = max(1, DRAW_BUDGET // replicates)
    u0 = u_start
    while u0 < u_end:
        i0 = prep.offsets[u0]
        u1 = int(np.searchsorted(prep.offsets, i0 + per_block, side="right")) - 1
        u1 = min(max(u1, u0 + 1), u_end)
        yield u0, u1
        u0 = u1


def _run_stream(seed: int, variant: str, model: str) -> np.random.Generator:
    entropy = int(stable_id("biasig-bootstrap", variant, model, length=15), 16)
    return np.random.default_rng([seed, entropy])


class Resampler:
    """Bootstrap counts of a run's units, chunk by chunk, from the draws of
    tests/reference_aggregates.py's reference (a stream per (seed, variant, model)); for
    ``explicit``'s units only the two counts S_exp reads per person."""

    FULL = 2 * len(VALUES)
    """Counts per unit and replicate: (2 persons, 9 values)."""
    ASKED = 4
    """Counts per explicit unit and replicate: (2 persons, (asked, usable))."""

    def __init__(self, prep: Prepared, replicates: int, explicit: Explicit | None = None):
        self.prep, self.replicates = prep, replicates
        n_units = prep.units.height
        sizes = np.diff(prep.offsets)
        digits = prep.codes.reshape(-1, 6).astype(np.int64) + 1  # 0 = no usable answer
        key = digits @ (10 ** np.arange(6, dtype=np.int64))
        unit_of = np.repeat(np.arange(n_units, dtype=np.int64), sizes)
        uniq, self.sig = np.unique(unit_of * 10**6 + key, return_inverse=True)
        self.sig = self.sig.astype(np.int64).ravel()
        self.sig_start = np.searchsorted(uniq // 10**6, np.arange(n_units + 1))
        codes = (uniq % 10**6)[:, None] // (10 ** np.arange(6, dtype=np.int64)) % 10 - 1
        sig_unit = uniq // 10**6
        self.asked = explicit.mask.copy() if explicit is not None else np.zeros(n_units, dtype=bool)
        # each unit's rank among the units of its kind (full counts or asked counts)
        self.kind_rank = np.zeros(n_units + 1, dtype=np.int64)
        for kind in (False, True):
            members = np.flatnonzero(self.asked == kind)
            self.kind_rank[members] = np.arange(members.size)
        self.kind_start = {
            kind: np.concatenate([[0], np.cumsum(self.asked == kind)]) for kind in (False, True)
        }
        # (signature, column) entries of each kind, by signature
        slot = np.arange(6) // 3 * len(VALUES)  # person s of slot s * 3 + a
        sig_of, which = np.nonzero(codes >= 0)
        full = ~self.asked[sig_unit[sig_of]]
        self.entries = {False: (sig_of[full], slot[which[full]] + codes[sig_of[full], which[full]])}
        if explicit is not None:
            rows, cols = [], []
            unit = sig_unit
            attr = np.maximum(explicit.attr[unit], 0)
            for s in (0, 1):
                code = codes[np.arange(uniq.size), s * 3 + attr]
                ask = explicit.ask[unit, s]
                on = self.asked[unit] & (ask >= 0)
                hit = np.flatnonzero(on & (code == ask))
                usable = np.flatnonzero(on & (code >= 0))
                rows += [hit, usable]
                cols += [np.full(hit.size, 2 * s), np.full(usable.size, 2 * s + 1)]
            sig_a, col_a = np.concatenate(rows), np.concatenate(cols)
            order = np.argsort(sig_a, kind="stable")
            self.entries[True] = (sig_a[order], col_a[order])
        self.entry_unit = {k: sig_unit[v[0]] for k, v in self.entries.items()}

    def block_counts(
        self, rng: np.random.Generator, u0: int, u1: int, counts: np.ndarray, asked: np.ndarray
    ) -> None:
        """Draw one block (units u0:u1) into ``counts`` (u1 - u0, R, 2, 9) and, for the
        explicit units, ``asked`` (u1 - u0, R, 2, 2); other rows are left as they are."""
        prep, reps = self.prep, self.replicates
        i0, i1 = prep.offsets[u0], prep.offsets[u1]
        sizes = np.diff(prep.offsets[u0 : u1 + 1])
        local = np.repeat(np.arange(u1 - u0), sizes)
        draw = rng.random((reps, i1 - i0))
        # the image drawn: floor(u x size) as in the reference, cast in the same pass
        idx = np.empty(draw.shape, dtype=np.int64)
        np.multiply(draw, sizes[local].astype(float), out=idx, casting="unsafe")
        idx += prep.offsets[u0:u1][local] - i0
        s0, s1 = self.sig_start[u0], self.sig_start[u1]
        # multiplicity of each signature in each replicate: (signatures, R)
        key = ((self.sig[i0:i1] - s0) * reps).take(idx)
        key += np.arange(reps, dtype=np.int64)[:, None]
        mult = np.bincount(key.ravel(), minlength=(s1 - s0) * reps).reshape(s1 - s0, reps)
        kinds = self.asked[u0:u1]
        for kind, out, width in ((False, counts, self.FULL), (True, asked, self.ASKED)):
            members = np.flatnonzero(kinds == kind)
            if kind not in self.entries or not members.size:
                continue
            sig, col = self.entries[kind]
            e0, e1 = np.searchsorted(sig, (s0, s1))
            first = self.kind_start[kind][u0]
            spread = sparse.csr_matrix(
                (
                    np.ones(e1 - e0, dtype=np.int64),
                    (
                        (self.kind_rank[self.entry_unit[kind][e0:e1]] - first) * width + col[e0:e1],
                        sig[e0:e1] - s0,
                    ),
                ),
                shape=(members.size * width, s1 - s0),
            )
            made = (spread @ mult).reshape(members.size, 2, width // 2, reps)
            out[members] = made.transpose(0, 3, 1, 2)

    def chunks(self, seed: int, units_per_chunk: int = CHUNK_UNITS, run: int | None = None):
        """Yield (first unit, end unit, counts (units, R, 2, 9), asked (units, R, 2, 2))
        over whole blocks of about ``units_per_chunk`` units, of every run or of run number
        ``run``. ``asked`` holds the explicit units' counts, ``counts`` the others'."""
        prep, reps = self.prep, self.replicates
        runs = prep.runs if run is None else prep.runs[run : run + 1]
        for variant, model, u_start, u_end in runs:
            rng = _run_stream(seed, variant, model)
            blocks = list(_block_bounds(prep, reps, u_start, u_end))
            k = 0
            while k < len(blocks):
                c0 = blocks[k][0]
                j = k
                while j < len(blocks) and blocks[j][1] - c0 <= units_per_chunk:
                    j += 1
                j = max(j, k + 1)
                c1 = blocks[j - 1][1]
                counts = np.empty((c1 - c0, reps, 2, len(VALUES)))
                asked = np.empty((c1 - c0, reps, 2, 2))
                for u0, u1 in blocks[k:j]:
                    self.block_counts(
                        rng, u0, u1, counts[u0 - c0 : u1 - c0], asked[u0 - c0 : u1 - c0]
                    )
                yield c0, c1, counts, asked
                k = j
