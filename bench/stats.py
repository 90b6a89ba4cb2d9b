"""Figures the benches share: a percentile, and evidence recall@k."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile of `values` (q in 0..100)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def recall_at(evidence: tuple[str, ...], found: list[str], k: int) -> float:
    """The share of `evidence` (distinct ids) among the first k of `found`."""
    top = set(found[:k])
    return sum(1 for e in evidence if e in top) / len(evidence)
