"""Vectorised draws shared by the benchmark designs: multinomials over arrays, and the nested
thinning that plants an effect of growing strength w on one set of draws (common random
numbers across the grid of w)."""

from __future__ import annotations

import numpy as np


def multinomial(n: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """rng.multinomial over arrays (``p`` (..., K) renormalised against rounding; rows of
    zeros allowed where n is 0)."""
    p = np.asarray(p, dtype=float)
    s = p.sum(-1, keepdims=True)
    p = np.where(s > 0, p / np.where(s > 0, s, 1.0), 0.0)
    n = np.asarray(n, dtype=np.int64)
    shape = np.broadcast_shapes(n.shape, p.shape[:-1])
    return rng.multinomial(np.broadcast_to(n, shape), np.broadcast_to(p, shape + p.shape[-1:]))


def segment_sum(x: np.ndarray, segment: np.ndarray, n: int) -> np.ndarray:
    """x (..., columns) summed per segment (columns of one segment are adjacent)."""
    starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]])
    out = np.zeros(x.shape[:-1] + (n,), dtype=x.dtype)
    out[..., segment[starts]] = np.add.reduceat(x, starts, axis=-1)
    return out


def _steps(w: np.ndarray):
    """(index, conditional probability) of each step of an increasing grid: moving a share
    q_i of what is left at step i moves w_i of the whole in total."""
    prev = 0.0
    for i, wi in enumerate(np.asarray(w, dtype=float)):
        if wi < prev:
            raise ValueError("the grid of effect strengths must increase")
        q = 0.0 if prev >= 1.0 or wi == prev else min(max((wi - prev) / (1.0 - prev), 0.0), 1.0)
        yield i, q
        prev = wi


def thin_towards(
    counts: np.ndarray,
    target: np.ndarray,
    segment: np.ndarray,
    w: np.ndarray,
    rng: np.random.Generator,
):
    """Counts (..., columns) with every item moved, with probability w, to a draw from its
    segment's ``target`` distribution: Multinomial(n, p) becomes exactly Multinomial(n,
    (1 - w) p + w target). Nested over the increasing grid ``w`` (common random numbers);
    yields (grid index, counts), the array reused by the next step."""
    segment = np.asarray(segment)
    n_seg = int(segment.max()) + 1 if segment.size else 0
    target = np.broadcast_to(target, counts.shape)
    starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]])
    sizes = np.diff(np.r_[starts, segment.size])
    kept = counts.astype(np.int64).copy()
    added = np.zeros_like(kept)
    for i, q in _steps(w):
        if q > 0:
            moved = rng.binomial(kept, q)
            kept -= moved
            total = segment_sum(moved, segment, n_seg)  # (..., segments)
            for size in np.unique(sizes):
                segs = np.flatnonzero(sizes == size)
                cols = starts[segs][:, None] + np.arange(size)[None, :]
                # total is indexed by segment id, segs by run: a run's id is its first
                # column's segment (ids need not be 0..runs-1 in order)
                ids = segment[starts[segs]]
                added[..., cols] += multinomial(total[..., ids], target[..., cols], rng)
        yield i, kept + added


def thin_binary(hits: np.ndarray, trials: np.ndarray, towards, w: np.ndarray, rng):
    """Hits ~ Binomial(trials, a) with each trial moved, with probability w, to a success
    where ``towards`` is 1 and to a failure where it is 0 (an array broadcast against hits):
    Binomial(trials, (1 - w) a + w towards). Nested over the grid ``w``; yields (grid
    index, hits)."""
    hits = np.asarray(hits, dtype=np.int64).copy()
    trials = np.broadcast_to(np.asarray(trials, dtype=np.int64), hits.shape)
    up = np.broadcast_to(np.asarray(towards) >= 1, hits.shape)
    all_up, none_up = bool(up.all()), not up.any()
    for i, q in _steps(w):
        if q > 0:
            if all_up:
                hits += rng.binomial(trials - hits, q)
            elif none_up:
                hits -= rng.binomial(hits, q)
            else:
                hits += np.where(up, rng.binomial(trials - hits, q), -rng.binomial(hits, q))
        yield i, hits
