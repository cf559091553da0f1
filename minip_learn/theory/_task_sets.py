"""The full task as a family held implicitly, for the certificate verifier (stdlib only).

Kept apart from :mod:`~minip_learn.theory.full_task` so that
:mod:`~minip_learn.theory.verify`, which that module uses, counts the task's R4 triples
with a closed form of its own.
"""

import math

__all__ = ["AllSequences", "full_task_triples"]


class AllSequences:
    """Every length-``seq_len`` sequence of ``n_bits``-bit tokens, held implicitly.

    What :func:`~minip_learn.theory.verify_certificate` checks a certificate of the *full task* against
    when the task is too large to list: every sequence of tokens of the right length
    is a member (so each chain step's sequences are present as soon as the
    certificate's tokens have ``n_bits`` 0/1 entries), and the family's number of R4
    triples is ``n_triples`` (for the full task, :func:`full_task_triples`). The certificate's
    token table then lists the tokens it uses, not every token of the task.
    """

    def __init__(self, n_bits, seq_len, n_triples):
        self.n_bits, self.seq_len, self.n_triples = int(n_bits), int(seq_len), int(n_triples)
        self.shape = (None, self.seq_len, self.n_bits)


def full_task_triples(m):
    """R4 triples ``(x, y, z)``, ``<x, z> - <x, y> >= 2``, of every ``m``-bit token.

    A query of weight ``w`` meets ``C(w, i) 2^(m - w)`` tokens at overlap ``i``; of the
    ``4^w`` pairs of overlaps ``(i, j)`` (weighted by ``C(w, i) C(w, j)``), Vandermonde's
    identity puts ``C(2w, w)`` on ``j = i`` and ``C(2w, w + 1)`` on each of ``j = i + 1``
    and ``j = i - 1``; half the rest has ``j >= i + 2``."""
    return sum(math.comb(m, w) * 4 ** (m - w)
               * (4 ** w - math.comb(2 * w, w) - 2 * math.comb(2 * w, w + 1)) // 2
               for w in range(m + 1))
