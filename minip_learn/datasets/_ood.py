"""Out-of-distribution Min-IP: train and test sequences over disjoint token pools."""

import numbers

import numpy as np
from sklearn.utils import Bunch, check_random_state

from .._validation import check_float, check_int, check_sequences
from ._minip import check_min_gap, pairwise_gaps, seed_param, token_overlaps

__all__ = ["check_token_leakage", "make_ood_minip"]


def _token_keys(X):
    X = np.asarray(X)
    flat = np.ascontiguousarray(X.reshape(-1, X.shape[-1]).astype(np.uint8))
    return {row.tobytes() for row in flat}


def check_token_leakage(X_train, X_test):
    """Raise if a token occurs in both the training and the test sequences.

    An out-of-distribution split is only honest when no test token was ever seen in
    training; this is the check :func:`make_ood_minip` runs on what it returns.

    Parameters
    ----------
    X_train : array-like of shape (n_train, seq_len, n_bits)
        Training sequences of 0/1 tokens.
    X_test : array-like of shape (n_test, seq_len_test, n_bits)
        Test sequences of 0/1 tokens (the same ``n_bits``).

    Returns
    -------
    n_shared : int
        Always 0 (the number of shared tokens) when the function returns.

    Raises
    ------
    ValueError
        If the arrays are not binary token sequences with the same ``n_bits``, or if
        any token appears in both (the message gives how many and one of them).

    Examples
    --------
    >>> import numpy as np
    >>> from minip_learn.datasets import check_token_leakage
    >>> a = np.array([[[1, 0], [1, 1]]])
    >>> check_token_leakage(a, np.array([[[0, 1], [0, 0]]]))
    0
    >>> check_token_leakage(a, np.array([[[0, 1], [1, 1]]]))
    Traceback (most recent call last):
        ...
    ValueError: token leakage: 1 token(s) occur in both X_train and X_test, e.g. [1, 1].
    """
    X_train, _ = check_sequences(X_train, name="X_train", binary=True)
    X_test, _ = check_sequences(X_test, name="X_test", binary=True)
    if X_train.shape[2] != X_test.shape[2]:
        raise ValueError(
            f"X_train has n_bits={X_train.shape[2]} but X_test has n_bits={X_test.shape[2]}."
        )
    shared = sorted(_token_keys(X_train) & _token_keys(X_test))
    if shared:
        example = np.frombuffer(shared[0], dtype=np.uint8).tolist()
        raise ValueError(
            f"token leakage: {len(shared)} token(s) occur in both X_train and X_test, "
            f"e.g. {example}."
        )
    return 0


def _draw_distinct(n, max_draws, draw, *, min_batch, factor):
    """Up to ``n`` candidates with distinct keys, in the order drawn.

    ``draw(size)`` returns ``(candidates, keys)`` for ``size`` draws (it may drop some
    candidates, e.g. those violating a gap); a batch is ``factor`` times the number
    still missing, at least ``min_batch``; drawing stops after ``max_draws`` draws.
    """
    kept, seen, drawn = [], set(), 0
    while len(kept) < n and drawn < max_draws:
        size = min(max(min_batch, factor * (n - len(kept))), max_draws - drawn)
        drawn += size
        for cand, key in zip(*draw(size)):
            if key not in seen:
                seen.add(key)
                kept.append(cand)
                if len(kept) == n:
                    break
    return kept


def _distinct_tokens(n_tokens, n_bits, density, rng, max_draws):
    """``n_tokens`` distinct random 0/1 tokens (rejection of repeats)."""

    def draw(size):
        cand = (rng.random_sample((size, n_bits)) < density).astype(np.uint8)
        return cand, [t.tobytes() for t in cand]

    tokens = _draw_distinct(n_tokens, max_draws, draw, min_batch=64, factor=2)
    if len(tokens) < n_tokens:
        raise ValueError(
            f"could not draw n_tokens={n_tokens} distinct {n_bits}-bit tokens "
            f"(density={density}) in {max_draws} draws; lower n_tokens or raise n_bits."
        )
    return np.stack(tokens)


def _sequences_from_pool(pool, n_samples, seq_len, min_gap, rng, max_draws, name):
    """``n_samples`` sequences of distinct pool tokens, every gap >= min_gap, no two of
    them equal up to the order of their tokens (the same multiset is one example)."""
    n_pool = len(pool)
    G = token_overlaps(pool[None])[0]  # pool overlap matrix

    def draw(size):
        # seq_len distinct pool indices per candidate, every gap >= min_gap
        idx = rng.randint(n_pool, size=(size, seq_len))
        srt = np.sort(idx, axis=1)
        idx = idx[(srt[:, 1:] != srt[:, :-1]).all(axis=1)]
        if min_gap > 0:
            sub = G[idx[:, :, None], idx[:, None, :]]
            idx = idx[(pairwise_gaps(sub) >= min_gap).all(axis=1)]
        return idx, [row.tobytes() for row in np.sort(idx, axis=1)]

    rows = _draw_distinct(n_samples, max_draws, draw, min_batch=256, factor=4)
    if len(rows) < n_samples:
        raise ValueError(
            f"only {len(rows)} of {n_samples} {name} sequences with min_gap={min_gap} "
            f"could be drawn from a pool of {n_pool} tokens in {max_draws} draws; enlarge "
            f"the pool (n_tokens), lower min_gap or the number of {name} sequences."
        )
    idx = np.stack(rows)
    return pool[idx]


_DESCR = """\
Out-of-distribution Min-IP
--------------------------
{n_tokens} distinct random {n_bits}-bit tokens (bit density {density}) are split into a
training pool of {n_train_tokens} and a disjoint test pool of {n_test_tokens} tokens.
{n_train} training and {n_test} test sequences of length {seq_len} are drawn, each from
its own pool only (distinct tokens within a sequence, no two sequences equal up to the
order of their tokens, every position's
gap between its two best candidates >= {min_gap}). No test token occurs in training
(checked by check_token_leakage). Targets: t_i = min_j <x_i, x_j>.
"""


def make_ood_minip(
    n_train=512,
    n_test=256,
    n_bits=12,
    *,
    n_tokens=128,
    test_tokens=0.5,
    seq_len=3,
    density=0.5,
    min_gap=2,
    max_draws=None,
    random_state=None,
):
    """Min-IP sequences whose train and test tokens come from disjoint pools.

    A pool of ``n_tokens`` distinct random tokens is split at random into a training
    pool and a test pool; every training sequence uses training tokens only and every
    test sequence test tokens only, so a model is scored on tokens it never saw. The
    split is checked with :func:`check_token_leakage` before it is returned. Sequences
    are hard in the sense of :func:`make_minip` with ``min_gap``: at every position the
    two best candidates differ by at least ``min_gap`` (:ref:`theory-r4`), and a sequence has
    no repeated token.

    Feature maps that look tokens up (``feature_map="table"``) cannot score such a test
    set (they reject unseen tokens); parametric maps (``"favor+"``, ``"exp"``,
    ``"elu+1"`` ...) and softmax heads can.

    Parameters
    ----------
    n_train : int, default=512
        Number of training sequences.
    n_test : int, default=256
        Number of test sequences.
    n_bits : int, default=12
        Bits per token (``m``).
    n_tokens : int, default=128
        Size of the whole token pool (training plus test tokens); at most ``2**n_bits``.
    test_tokens : float or int, default=0.5
        Test pool: a fraction of ``n_tokens`` (float in (0, 1)) or a number of tokens
        (int). Each pool needs at least ``seq_len`` tokens.
    seq_len : int, default=3
        Tokens per sequence (``N``); at least 3 when ``min_gap > 0``.
    density : float, default=0.5
        Probability that a bit is 1.
    min_gap : int, default=2
        Minimum gap between the smallest and second-smallest overlap at every position
        (see :func:`minip_gaps`); 0 disables the filter.
    max_draws : int, default=None
        Maximum number of candidate sequences drawn per pool by rejection sampling
        (default ``2000 * n + 100000`` for ``n`` requested sequences).
    random_state : int, RandomState instance or None, default=None
        Determines the tokens, the split and the sequences.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        ``X_train`` (n_train, seq_len, n_bits) uint8, ``y_train`` (n_train, seq_len)
        int64, ``X_test``, ``y_test``, ``train_tokens`` and ``test_tokens`` (the two
        disjoint pools, (n, n_bits) uint8), ``params`` and ``DESCR``.

    Raises
    ------
    ValueError
        For a bad size or option (the message names it), or when the pools cannot
        supply the requested number of hard sequences.

    Examples
    --------
    >>> from minip_learn.datasets import make_ood_minip, check_token_leakage
    >>> data = make_ood_minip(50, 20, n_bits=10, n_tokens=64, random_state=0)
    >>> data.X_train.shape, data.X_test.shape, data.train_tokens.shape
    ((50, 3, 10), (20, 3, 10), (32, 10))
    >>> check_token_leakage(data.X_train, data.X_test)
    0
    """
    n_train = check_int(n_train, "n_train", min_value=1)
    n_test = check_int(n_test, "n_test", min_value=1)
    n_bits = check_int(n_bits, "n_bits", min_value=1)
    n_tokens = check_int(n_tokens, "n_tokens", min_value=2)
    seq_len = check_int(seq_len, "seq_len", min_value=1)
    density = check_float(density, "density", min_value=0.0, max_value=1.0)
    min_gap = check_int(min_gap, "min_gap", min_value=0)
    if n_bits < 63 and n_tokens > 2**n_bits:
        raise ValueError(f"n_tokens={n_tokens} exceeds the 2**n_bits={2**n_bits} possible tokens.")
    check_min_gap(min_gap, seq_len, n_bits)
    if isinstance(test_tokens, numbers.Integral) and not isinstance(test_tokens, bool):
        n_test_tokens = int(test_tokens)
    elif isinstance(test_tokens, numbers.Real) and not isinstance(test_tokens, bool):
        if not 0.0 < float(test_tokens) < 1.0:
            raise ValueError(f"test_tokens as a fraction must be in (0, 1); got {test_tokens!r}.")
        n_test_tokens = int(round(float(test_tokens) * n_tokens))
    else:
        raise ValueError(f"test_tokens must be a fraction in (0, 1) or an int; got {test_tokens!r}.")
    n_train_tokens = n_tokens - n_test_tokens
    if min(n_train_tokens, n_test_tokens) < seq_len:
        raise ValueError(
            f"test_tokens={test_tokens!r} splits n_tokens={n_tokens} into {n_train_tokens} "
            f"training and {n_test_tokens} test tokens; each pool needs >= seq_len={seq_len}."
        )
    rng = check_random_state(random_state)
    token_draws = 1000 * n_tokens + 100_000
    tokens = _distinct_tokens(n_tokens, n_bits, density, rng, token_draws)
    perm = rng.permutation(n_tokens)
    train_tokens = tokens[np.sort(perm[n_test_tokens:])]
    test_pool = tokens[np.sort(perm[:n_test_tokens])]

    def draws(n):
        return check_int(2000 * n + 100_000 if max_draws is None else max_draws,
                         "max_draws", min_value=1)

    X_train = _sequences_from_pool(train_tokens, n_train, seq_len, min_gap, rng,
                                   draws(n_train), "training")
    X_test = _sequences_from_pool(test_pool, n_test, seq_len, min_gap, rng,
                                  draws(n_test), "test")
    check_token_leakage(X_train, X_test)
    params = dict(
        n_train=n_train, n_test=n_test, n_bits=n_bits, n_tokens=n_tokens,
        n_train_tokens=n_train_tokens, n_test_tokens=n_test_tokens, seq_len=seq_len,
        density=density, min_gap=min_gap,
        random_state=seed_param(random_state),
    )
    return Bunch(
        X_train=X_train, y_train=token_overlaps(X_train).min(axis=2),
        X_test=X_test, y_test=token_overlaps(X_test).min(axis=2),
        train_tokens=train_tokens, test_tokens=test_pool, params=params,
        DESCR=_DESCR.format(**params),
    )
