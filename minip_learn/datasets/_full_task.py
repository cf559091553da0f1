"""The full length-3 task as a data set: every sequence of three ``m``-bit tokens.

numpy only: the family comes from :func:`minip_learn.theory.full_task_family`.
"""

import numpy as np
from sklearn.utils import Bunch

from .. import compact
from ..theory import full_task_family
from ._minip import check_query, last_slots

__all__ = ["make_full_task"]

_DESCR = """\
The full length-3 Min-IP task (m = {n_bits})
-------------------------------------------
Every sequence of three {n_bits}-bit tokens: {n_ordered:,} ordered sequences over all
{n_tokens} tokens, the zero token 0...0 and repeated tokens included (Min-IP's target
min_j <x_i, x_j> counts j = i, so a sequence such as (x, x, x) is one like any other).
A normalised kernel or softmax head without positional maps sees a sequence only
through its multiset of tokens, so it solves all of them exactly when it solves the
{n_sequences:,} sequences listed here: {form}
"""

_FORMS = {
    "all": "each multiset of three tokens once, a target at every position.",
    "last": ("each query token with each multiset of the other two, the query last and "
             "its target the only one."),
}


def make_full_task(n_bits, *, query="all", tokens=None):
    """Load the full length-3 task: every sequence of three ``n_bits``-bit tokens.

    *Every sequence* means every element of ``({0,1}^m)^3``: the ``2^(3m)`` ordered
    sequences over all ``2^m`` tokens, the zero token ``0...0`` included (its overlap
    with every token is 0, a target like any other) and tokens repeated (Min-IP's
    ``min_j <x_i, x_j>`` includes ``j = i``; :ref:`theory-r1`). A normalised kernel
    head without positional maps sees a sequence only through its multiset of tokens
    (its output at a token is a weighted mean over the tokens present, weighted by
    multiplicity), so it solves every ordered sequence exactly when it solves the
    multisets listed here, in multiset form
    (:class:`~minip_learn.compact.CompactFamily`):

    * ``query="all"``: each multiset of three tokens once, every position a query:
      ``C(2^m + 2, 3)`` sequences (816 at ``m = 4``, 2,829,056 at ``m = 8``);
    * ``query="last"``: each query token with each multiset of the other two, the
      query last: ``2^m C(2^m + 1, 2)`` sequences (2,176 at ``m = 4``, 8,421,376 at
      ``m = 8``), one target each.

    ``r*(m)``, the smallest rank of a nonnegative kernel head that solves this task, is
    bounded by :func:`~minip_learn.theory.certify_full_task` (below) and by the heads
    of the ``full_task`` recipe (above); see :ref:`theory-full-task`.

    Parameters
    ----------
    n_bits : int
        Bits per token ``m`` (the family holds at most
        :data:`~minip_learn.theory.full_task.FULL_TASK_MAX_SEQUENCES` sequences:
        ``m <= 8``).
    query : {"all", "last"}, default="all"
        The form above.
    tokens : array-like of shape (n_tokens, n_bits), default=None
        A token set instead of all ``2^n_bits`` tokens: the full task over it.

    Returns
    -------
    data : :class:`~sklearn.utils.Bunch`
        ``family`` (the sequences in multiset form; ``family.to_sequences()`` in
        slices with ``family.iter_sequences()``), with its arrays ``tokens``,
        ``token_ids`` and ``counts``; ``slot_targets`` (n_sequences, k) the exact
        target of every slot; ``X`` (n_sequences, 3, n_bits) uint8 and ``y``, only
        when ``X`` takes at most :data:`~minip_learn.compact.MATERIALIZE_MAX_BYTES`
        (256 MiB), else None (``y`` is always given with ``query="last"``: the
        target of every sequence's final token); ``n_sequences``; ``n_tokens``;
        ``n_ordered_sequences`` (``T^3``: the ordered sequences the family stands
        for); ``query``; ``params``; ``DESCR``.

    Examples
    --------
    >>> from minip_learn.datasets import make_full_task
    >>> task = make_full_task(3)
    >>> task.n_sequences, task.n_ordered_sequences, task.X.shape
    (120, 512, (120, 3, 3))
    >>> last = make_full_task(3, query="last")
    >>> last.n_sequences, last.y.shape
    (288, (288,))
    >>> make_full_task(8).n_sequences
    2829056
    """
    query = check_query(query)
    family = full_task_family(n_bits, tokens=tokens, query=query)
    n_tokens = len(family.tokens)
    X = family.to_sequences() if family.materialized_nbytes <= compact.MATERIALIZE_MAX_BYTES \
        else None
    slot_targets = family.targets()
    if query == "last":
        y = slot_targets[np.arange(len(family)), last_slots(family.token_ids)]
    else:
        y = None if X is None else family.expand(slot_targets)
    params = dict(n_bits=int(family.n_bits), query=query)
    return Bunch(
        family=family, tokens=family.tokens, token_ids=family.token_ids,
        counts=family.counts, slot_targets=slot_targets, X=X, y=y,
        n_sequences=len(family), n_tokens=n_tokens, n_ordered_sequences=n_tokens ** 3,
        query=query,
        params=params,
        DESCR=_DESCR.format(n_bits=family.n_bits, n_ordered=n_tokens ** 3, n_tokens=n_tokens,
                            n_sequences=len(family), form=_FORMS[query]),
    )
