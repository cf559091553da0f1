"""Min-IP quantities by their definitions (THEORY.md), in plain Python over exact
integers: the references of the dataset tests, sharing no code with minip_learn."""


def dot(a, b):
    return sum(int(u) * int(v) for u, v in zip(a, b))


def ref_overlaps(X):
    return [[[dot(s[i], s[j]) for j in range(len(s))] for i in range(len(s))] for s in X]


def ref_targets(X):
    """``t_i = min_j <x_i, x_j>``, ``j`` over every position (``i`` included)."""
    return [[min(dot(s[i], t) for t in s) for i in range(len(s))] for s in X]


def ref_gaps(X):
    """Second-smallest minus smallest of ``<x_i, x_j>`` over ``j != i``."""
    out = []
    for s in X:
        row = []
        for i in range(len(s)):
            ov = sorted(dot(s[i], s[j]) for j in range(len(s)) if j != i)
            row.append(ov[1] - ov[0])
        out.append(row)
    return out


def ref_keep(X, gaps, min_gap, distinct_tokens, query):
    """Per sequence: every gap (only the final one with ``query="last"``) at least
    ``min_gap`` when it is positive, and no token twice with ``distinct_tokens``."""
    keep = []
    for seq, g in zip(X, gaps):
        g = g[-1:] if query == "last" else g
        ok = min_gap == 0 or all(v >= min_gap for v in g)
        if distinct_tokens:
            ok = ok and len({tuple(int(v) for v in t) for t in seq}) == len(seq)
        keep.append(ok)
    return keep
