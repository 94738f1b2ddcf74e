"""Shorten long curves for drawing without hiding spikes: per bucket keep first, min, max, last."""

from __future__ import annotations

import numpy as np


def minmax_downsample(x, y, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most about `max_points` points of the curve (x, y), preserving every local extreme.

    The points are cut into `max_points // 4` buckets of consecutive indices; each bucket keeps
    its first, last, smallest and largest point (in x order), so the drawn envelope and every
    spike survive, unlike taking every n-th point (M4 aggregation, Jugel et al. 2014, "M4: A
    Visualization-Oriented Time Series Data Aggregation").

    Args:
        x, y: 1-D sequences of equal length N (x ascending, e.g. steps).
        max_points: target size (>= 4); curves with N <= max_points are returned unchanged.

    Returns:
        (x, y) as float64 arrays of length <= max_points (about; a bucket's four points may
        coincide and are then kept once).

    Raises:
        ValueError: x and y differ in length, or max_points < 4.
    """
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise ValueError(f"x and y must be 1-D of equal length, got shapes {xa.shape} and {ya.shape}")
    if max_points < 4:
        raise ValueError(f"max_points must be >= 4, got {max_points}")
    n = xa.size
    if n <= max_points:
        return xa, ya
    buckets = max_points // 4
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    starts, ends = edges[:-1], edges[1:]
    # Index of min / max inside each bucket via reduceat on the values.
    mins = np.minimum.reduceat(ya, starts)
    maxs = np.maximum.reduceat(ya, starts)
    bucket_of = np.repeat(np.arange(buckets), ends - starts)
    idx_min = np.flatnonzero(ya == mins[bucket_of])
    idx_max = np.flatnonzero(ya == maxs[bucket_of])
    # First occurrence per bucket of the min and the max.
    first_min = idx_min[np.unique(bucket_of[idx_min], return_index=True)[1]]
    first_max = idx_max[np.unique(bucket_of[idx_max], return_index=True)[1]]
    keep = np.unique(np.concatenate([starts, ends - 1, first_min, first_max]))
    return xa[keep], ya[keep]
