"""Random Min-IP sequences and their exact targets (numpy only)."""

import numbers

import numpy as np
from sklearn.utils import Bunch, check_random_state

from .._validation import check_float, check_int, check_sequences
from ..compact import is_compact

__all__ = ["minip_targets", "minip_gaps", "make_minip"]


def token_overlaps(X, chunk=1 << 16):
    """Pairwise inner products ``<x_i, x_j>`` of shape (n_samples, seq_len, seq_len).

    Computed in chunks of ``chunk`` sequences, so that the temporaries stay small.
    """
    n, N = X.shape[0], X.shape[1]
    out = np.empty((n, N, N), dtype=np.int64)
    # short 0/1 integer sequences: one vectorised product per pair of positions (exact, and
    # faster than a batch of tiny matrix products)
    pairwise = N <= 8 and X.dtype.kind in "biu"
    for start in range(0, n, chunk):
        if pairwise:
            Xc, rows = X[start:start + chunk], slice(start, start + chunk)
            for i in range(N):
                for j in range(i, N):
                    out[rows, i, j] = (Xc[:, i] * Xc[:, j]).sum(axis=1, dtype=np.int64)
                    out[rows, j, i] = out[rows, i, j]
            continue
        Xf = X[start:start + chunk].astype(np.float64, copy=False)
        out[start:start + chunk] = np.rint(np.matmul(Xf, Xf.transpose(0, 2, 1)))
    return out


QUERY_MODES = ("all", "last")


def check_query(query):
    """``query`` validated: ``"all"`` (a target at every position) or ``"last"`` (one
    target per sequence, at its final position)."""
    if not isinstance(query, str) or query not in QUERY_MODES:
        raise ValueError(f"query must be one of {list(QUERY_MODES)}; got {query!r}.")
    return query


def last_slots(token_ids):
    """Column of the last real slot of every row of compact ``token_ids`` (the slot
    whose token is the final position of the materialised sequence)."""
    real = np.asarray(token_ids) >= 0
    return real.shape[1] - 1 - np.argmax(real[:, ::-1], axis=1)


def minip_targets(X, *, query="all"):
    """Exact Min-IP targets ``t_i = min_j <x_i, x_j>``.

    Parameters
    ----------
    X : array-like of shape (n_samples, seq_len, n_bits) or CompactFamily
        Binary (0/1) token sequences, or a family in multiset form.
    query : {"all", "last"}, default="all"
        ``"all"``: the target of every position. ``"last"``: final-query Min-IP, one
        target per sequence, that of its final token ``min_j <x_N, x_j>`` (``j``
        over every position, ``N`` included).

    Returns
    -------
    y : ndarray of shape (n_samples, seq_len) or (n_samples,)
        ``y[s, i] = min_j <X[s, i], X[s, j]>`` with ``j = i`` included, so that a
        length-1 sequence gets ``|x_1|``; with ``query="last"`` only ``y[s, -1]``,
        shape (n_samples,); dtype int64. For a
        :class:`~minip_learn.compact.CompactFamily` and ``query="all"``, shape
        (n_samples, n_slots): the target of every slot (0 at padding), computed without
        materialising ``X``; with ``query="last"`` the target of the last real slot (the
        final token of the materialised sequence); dtype the smallest signed integer
        that holds ``n_bits`` (:meth:`CompactFamily.targets
        <minip_learn.compact.CompactFamily.targets>`), as families of millions of
        sequences keep their targets small.

    Raises
    ------
    ValueError
        If ``X`` is not 3-D, is empty, or contains values other than 0 and 1; if
        ``query`` is not ``"all"`` or ``"last"``.

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.datasets import minip_targets
    >>> X = np.array([[[1, 1, 0], [0, 1, 1], [1, 0, 1]]])
    >>> minip_targets(X)
    array([[1, 1, 1]])
    >>> minip_targets(np.array([[[1, 0, 1]]]))
    array([[2]])
    >>> minip_targets(np.array([[[1, 1, 0], [0, 1, 1], [1, 1, 1]]]), query="last")
    array([2])
    """
    query = check_query(query)
    if is_compact(X):
        t = X.targets()
        return t if query == "all" else t[np.arange(len(t)), last_slots(X.token_ids)]
    X, _ = check_sequences(X, binary=True)
    if query == "last":
        return last_targets(X)
    return token_overlaps(X).min(axis=2)


def last_targets(X):
    """``min_j <x_N, x_j>`` of validated sequences (n_samples,), in chunks of about
    ``2^22`` entries."""
    out = np.empty(len(X), dtype=np.int64)
    chunk = max(1, (1 << 22) // max(1, X.shape[1] * X.shape[2]))
    for a in range(0, len(X), chunk):
        Xc = X[a:a + chunk].astype(np.int64)
        out[a:a + chunk] = (Xc * Xc[:, -1:, :]).sum(axis=2).min(axis=1)
    return out


def minip_gaps(X):
    """Gap between the two best competing candidates at every position.

    For position ``i`` the candidates are the other tokens ``j != i``; the gap is the
    difference between the second-smallest and the smallest overlap ``<x_i, x_j>``.
    A gap of at least 2 is the "two competing candidates" situation of the lower-bound
    argument (:ref:`theory-r4`).

    Parameters
    ----------
    X : array-like of shape (n_samples, seq_len, n_bits)
        Binary token sequences with ``seq_len >= 3``.

    Returns
    -------
    gaps : ndarray of shape (n_samples, seq_len), dtype int64

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.datasets import minip_gaps
    >>> X = np.array([[[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]])
    >>> minip_gaps(X)
    array([[2, 0, 2]])
    """
    X, _ = check_sequences(X, binary=True)
    if X.shape[1] < 3:
        raise ValueError(
            f"minip_gaps needs seq_len >= 3 (two competing candidates); got seq_len={X.shape[1]}."
        )
    return pairwise_gaps(token_overlaps(X))


def pairwise_gaps(G):
    n, N, _ = G.shape
    others = G[:, ~np.eye(N, dtype=bool)].reshape(n, N, N - 1)
    two = np.sort(others, axis=2)[:, :, :2]
    return two[:, :, 1] - two[:, :, 0]


def check_min_gap(min_gap, seq_len, n_bits):
    """The ``ValueError`` of a ``min_gap`` that no sequence of ``seq_len`` tokens of
    ``n_bits`` bits can have (a positive gap needs two competing candidates)."""
    if min_gap > 0 and seq_len < 3:
        raise ValueError(
            f"min_gap={min_gap} needs seq_len >= 3 (two competing candidates); got seq_len={seq_len}."
        )
    if min_gap > n_bits:
        raise ValueError(f"min_gap={min_gap} cannot exceed n_bits={n_bits}.")


def seed_param(random_state):
    """``random_state`` as recorded in a data set's ``params``: the int, else None."""
    return random_state if isinstance(random_state, numbers.Integral) else None


_DESCR = """\
Random Min-IP sequences
-----------------------
Each sample is a sequence of ``seq_len`` tokens in {{0,1}}^{n_bits}; each bit is 1 with
probability ``density``. The target at position i is ``min_j <x_i, x_j>`` (j = i
included); query={query}: {query_text}. Sampling: {n_samples} sequences, seq_len={seq_len}, n_bits={n_bits},
density={density}, min_gap={min_gap}, distinct_tokens={distinct_tokens},
unique={unique}; {n_drawn} candidate sequences were drawn to accept them.
"""


def _keep(X, min_gap, distinct_tokens, query):
    """Which drawn sequences meet ``min_gap`` (at the final position only with
    ``query="last"``) and ``distinct_tokens``."""
    n, seq_len = X.shape[0], X.shape[1]
    keep = np.ones(n, dtype=bool)
    if min_gap > 0 or distinct_tokens:
        G = token_overlaps(X)
        if min_gap > 0:
            gaps = pairwise_gaps(G)
            if query == "last":
                gaps = gaps[:, -1:]
            keep &= (gaps >= min_gap).all(axis=1)
        if distinct_tokens and seq_len > 1:
            # two tokens are equal iff <a,b> = |a| = |b|
            norms = np.diagonal(G, axis1=1, axis2=2)
            same = (G == norms[:, :, None]) & (G == norms[:, None, :])
            same[:, np.arange(seq_len), np.arange(seq_len)] = False
            keep &= ~same.any(axis=(1, 2))
    return keep


def make_minip(
    n_samples=100,
    seq_len=3,
    n_bits=24,
    *,
    density=0.5,
    min_gap=0,
    distinct_tokens=False,
    unique=False,
    max_draws=None,
    query="all",
    random_state=None,
    return_X_y=True,
):
    """Generate random Min-IP sequences with exact targets.

    Parameters
    ----------
    n_samples : int, default=100
        Number of sequences.
    seq_len : int, default=3
        Tokens per sequence (``N``).
    n_bits : int, default=24
        Bits per token (``m``).
    density : float, default=0.5
        Probability that a bit is 1.
    min_gap : int, default=0
        Keep only sequences in which, at every position, the smallest and
        second-smallest overlaps with the other tokens differ by at least ``min_gap``
        (see :func:`minip_gaps`). ``min_gap=2`` asks for the hard "two competing
        candidates" case of the lower bound. Needs ``seq_len >= 3`` when positive.
        With ``query="last"`` only the final position (the query) must have the gap.
    distinct_tokens : bool, default=False
        Reject sequences in which a token appears twice.
    unique : bool, default=False
        Return no sequence twice.
    max_draws : int, default=None
        Maximum number of candidate sequences drawn by rejection sampling
        (default ``2000 * n_samples + 100000``). A ``ValueError`` is raised if fewer
        than ``n_samples`` are accepted by then.
    query : {"all", "last"}, default="all"
        ``"all"``: a target at every position. ``"last"``: final-query Min-IP, the
        query token is the last of each sequence and its single target is
        ``min_j <x_N, x_j>``. With ``min_gap=0`` the sequences do not depend on
        ``query`` and ``y`` of ``"last"`` is the last column of ``y`` of ``"all"``.
    random_state : int, RandomState instance or None, default=None
        Determines the random tokens. Pass an int for reproducible output.
    return_X_y : bool, default=True
        If True return ``(X, y)``; otherwise a :class:`~sklearn.utils.Bunch`.

    Returns
    -------
    X : ndarray of shape (n_samples, seq_len, n_bits), dtype uint8
        The token sequences.
    y : ndarray of shape (n_samples, seq_len) or (n_samples,), dtype int64
        Exact Min-IP targets; with ``query="last"`` the target of the final
        position only, shape (n_samples,).
    data : :class:`~sklearn.utils.Bunch`
        Only when ``return_X_y=False``: ``X``, ``y``, ``gaps`` (per-position gaps,
        shape like ``y``, or None for ``seq_len < 3``), ``query``, ``params`` (the
        generation parameters), ``n_drawn`` (the candidate sequences drawn up to the
        last one accepted) and ``DESCR``.

    Examples
    --------
    >>> from minip_learn.datasets import make_minip, minip_gaps
    >>> X, y = make_minip(5, seq_len=3, n_bits=8, min_gap=2, random_state=0)
    >>> X.shape, y.shape, X.dtype
    ((5, 3, 8), (5, 3), dtype('uint8'))
    >>> bool((minip_gaps(X) >= 2).all())
    True
    >>> X, y = make_minip(5, seq_len=4, n_bits=8, query="last", random_state=0)
    >>> X.shape, y.shape
    ((5, 4, 8), (5,))
    """
    n_samples = check_int(n_samples, "n_samples", min_value=1)
    seq_len = check_int(seq_len, "seq_len", min_value=1)
    n_bits = check_int(n_bits, "n_bits", min_value=1)
    density = check_float(density, "density", min_value=0.0, max_value=1.0)
    min_gap = check_int(min_gap, "min_gap", min_value=0)
    check_min_gap(min_gap, seq_len, n_bits)
    if distinct_tokens and seq_len > 2**n_bits:
        raise ValueError(f"distinct_tokens needs seq_len <= 2**n_bits; got seq_len={seq_len}.")
    if max_draws is None:
        max_draws = 2000 * n_samples + 100_000
    max_draws = check_int(max_draws, "max_draws", min_value=1)
    query = check_query(query)
    rng = check_random_state(random_state)

    # candidates come in batches of one random stream (the batch sizes change nothing
    # but the speed); ``drawn_at``: the stream position of every accepted candidate
    accepted, drawn_at, n_accepted, n_drawn = [], [], 0, 0
    seen = set()
    batch = max(64, 2 * n_samples)
    while n_accepted < n_samples and n_drawn < max_draws:
        size = min(batch, max_draws - n_drawn)
        X = (rng.random_sample((size, seq_len, n_bits)) < density).astype(np.uint8)
        at = n_drawn + np.flatnonzero(_keep(X, min_gap, distinct_tokens, query))
        n_drawn += size
        X = X[at - (n_drawn - size)]
        if unique and len(X):
            new = []
            for i, x in enumerate(X):
                key = x.tobytes()
                if key not in seen:
                    seen.add(key)
                    new.append(i)
            X, at = X[new], at[new]
        accepted.append(X)
        drawn_at.append(at)
        n_accepted += len(X)
        if n_accepted and n_accepted < n_samples:
            rate = n_accepted / n_drawn
            batch = int(min(max(64, 1.2 * (n_samples - n_accepted) / rate), 1_000_000))
    if n_accepted < n_samples:
        raise ValueError(
            f"Only {n_accepted} of {n_samples} requested sequences met the constraints "
            f"(min_gap={min_gap}, distinct_tokens={distinct_tokens}, unique={unique}) after "
            f"{n_drawn} draws; relax them, change density, or raise max_draws."
        )
    X = np.concatenate(accepted)[:n_samples]
    n_drawn = int(np.concatenate(drawn_at)[n_samples - 1]) + 1  # up to the last accepted
    y = last_targets(X) if query == "last" else token_overlaps(X).min(axis=2)
    if return_X_y:
        return X, y
    params = dict(
        n_samples=n_samples, seq_len=seq_len, n_bits=n_bits, density=density,
        min_gap=min_gap, distinct_tokens=bool(distinct_tokens), unique=bool(unique),
        query=query, random_state=seed_param(random_state),
    )
    gaps = pairwise_gaps(token_overlaps(X)) if seq_len >= 3 else None
    if gaps is not None and query == "last":
        gaps = gaps[:, -1]
    query_text = ("one target per sequence, at its last token" if query == "last"
                  else "a target at every position")
    return Bunch(
        X=X,
        y=y,
        gaps=gaps,
        query=query,
        params=params,
        n_drawn=n_drawn,
        DESCR=_DESCR.format(n_drawn=n_drawn, query_text=query_text, **params),
    )
