"""Odd flip cycles: the rank-2 obstruction that decides r*(5) = 3."""

import itertools
from collections import deque
from fractions import Fraction

import numpy as np
import pytest

from minip_learn.theory import flip_cycle, full_task_family, verify_flip_cycle


def _dot(a, b):
    return sum(int(u) * int(v) for u, v in zip(a, b))


def test_lemma_a_is_an_identity_of_the_three_solved_inequalities():
    """For <x, z> = <x, y> + 2 the three solved inequalities at x (lower, upper, upper
    ends of the error band) add up to D1 - D2 = 2 (a_y - a_z): written out here over
    symbolic weights a_t and numerators H_t, every coefficient exact."""
    for t1, z_is_x in itertools.product(range(4), (False, True)):
        x, y, z = "x", "y", ("x" if z_is_x else "z")
        S1, S2, S3 = (x, y, y), (x, z, z), (x, y, z)

        def form(seq, c_h, c_a):
            out = {}
            for t in seq:
                out[("H", t)] = out.get(("H", t), 0) + c_h
                out[("a", t)] = out.get(("a", t), 0) + c_a
            return out

        total = {}
        for coef, f in ((1, form(S1, 1, -(Fraction(t1) - Fraction(1, 2)))),
                        (1, form(S2, 1, -(Fraction(t1) + Fraction(3, 2)))),
                        (2, form(S3, -1, Fraction(t1) + Fraction(1, 2)))):
            for k, v in f.items():
                total[k] = total.get(k, 0) + coef * v
        total = {k: v for k, v in total.items() if v != 0}
        assert total == {("a", y): 2, ("a", z): -2}


def _flip_graph_is_bipartite(m):
    """The flip graph of the full task over m bits, built from its definition."""
    toks = list(itertools.product((0, 1), repeat=m))
    V = [(x, lo, hi) for x in toks for lo in toks for hi in toks
         if _dot(x, hi) - _dot(x, lo) >= 2]

    def flips(xq, v):
        return _dot(xq, v[1]) - _dot(xq, v[2]) >= 2

    adj = {i: [] for i in range(len(V))}
    for i, j in itertools.combinations(range(len(V)), 2):
        if flips(V[j][0], V[i]) and flips(V[i][0], V[j]):
            adj[i].append(j)
            adj[j].append(i)
    colour = {}
    for s in adj:
        if s in colour:
            continue
        colour[s] = 0
        todo = deque([s])
        while todo:
            u = todo.popleft()
            for w in adj[u]:
                if w not in colour:
                    colour[w] = 1 - colour[u]
                    todo.append(w)
                elif colour[w] == colour[u]:
                    return False
    return True


def test_no_odd_cycle_at_four_bits():
    """r*(4) = 2: the argument must not prove 3 there, and indeed the whole flip graph
    of the 4-bit task is bipartite."""
    assert _flip_graph_is_bipartite(4)
    with pytest.raises(ValueError, match="n_bits must be >= 5"):
        flip_cycle(4)


@pytest.mark.parametrize("m", [5, 6, 9, 32])
def test_the_cycle_is_odd_and_every_flip_holds(m):
    cycle = flip_cycle(m)
    assert verify_flip_cycle(cycle) and cycle.rank == 3 and len(cycle.queries) % 2 == 1
    q, lo, hi = cycle.queries, cycle.lo, cycle.hi
    n = len(q)
    for i in range(n):
        assert _dot(q[i], hi[i]) - _dot(q[i], lo[i]) >= 2
        for j in ((i - 1) % n, (i + 1) % n):
            assert _dot(q[j], lo[i]) - _dot(q[j], hi[i]) >= 2
    assert cycle.sequences.shape == (45, 3, m)


def test_the_cycle_verifies_against_the_listed_task_and_needs_its_sequences():
    cycle = flip_cycle(5)
    family = full_task_family(5)
    assert verify_flip_cycle(cycle, family)
    assert verify_flip_cycle(cycle, cycle.sequences)
    # one multiset fewer: rejected, naming it
    assert not verify_flip_cycle(cycle, cycle.sequences[1:], raise_on_failure=False)
    with pytest.raises(ValueError, match="lacks the multiset"):
        verify_flip_cycle(cycle, cycle.sequences[:-1])


@pytest.mark.parametrize("bad", ["even", "swapped", "not-flipped"])
def test_a_broken_cycle_is_rejected(bad):
    c = flip_cycle(6)
    q, lo, hi = c.queries.copy(), c.lo.copy(), c.hi.copy()
    if bad == "even":
        q, lo, hi = q[:4], lo[:4], hi[:4]
    elif bad == "swapped":
        lo[2], hi[2] = hi[2].copy(), lo[2].copy()
    else:                          # vertex 3's query shares a bit with vertex 2's keys
        q[3] = np.zeros(6, dtype=np.uint8)
        q[3][[0, 5]] = 1
    cycle = dict(queries=q, lo=lo, hi=hi)
    assert not verify_flip_cycle(cycle, raise_on_failure=False)
    with pytest.raises(ValueError, match="flip cycle rejected"):
        verify_flip_cycle(cycle)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="'queries', 'lo' and 'hi'"):
        verify_flip_cycle({"queries": np.zeros((5, 5))})
    with pytest.raises(ValueError, match="0/1 arrays"):
        verify_flip_cycle(dict(queries=np.full((5, 5), 2), lo=np.zeros((5, 5)),
                               hi=np.zeros((5, 5))))
    with pytest.raises(ValueError, match="length 3 over 5 bits"):
        verify_flip_cycle(flip_cycle(5), np.zeros((2, 4, 5), dtype=np.uint8))
