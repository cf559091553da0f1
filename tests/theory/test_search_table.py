"""The searches of ``certify`` (``minip_learn.theory._search.SEARCHES``), one by one.

Each search of the table is held to the exhaustive search on small candidate graphs:
what it returns is a set of mutually compatible candidates whose rank is the R5 rank
of its denominators and never above the best any set gives. A search added to the
table is one entry; these tests run it with the others.
"""

import numpy as np
import pytest

from minip_learn.theory import _constraints, _search, certify, hadamard_code, witness_family
from minip_learn.theory.certificate import STRATEGIES

#: the H12 witness family (N = 3); its random subfamilies have candidate graphs of a few
#: hundred candidates, where the greedy searches sometimes miss the optimum
H12 = witness_family(hadamard_code(12), 3)


def _graph(seed):
    rng = np.random.default_rng(seed)
    X = H12[rng.random(len(H12)) < rng.uniform(0.5, 1)]
    cons = _constraints.constraints(X)
    return _search._Graph(cons, _constraints.reach(cons))


def _optimum(view):
    """The largest rank any set of the view's candidates certifies (exhaustively)."""
    sub, Kinv = view.ratio_bounds(np.arange(len(view.keep)))
    rank, _, complete = _search._exact_clique_search(sub, Kinv, 1, 10**6)
    assert complete
    return rank


def _is_clique(view, members):
    rows = np.searchsorted(view.keep, members)
    assert (view.keep[rows] == members).all()
    A = view.A[np.ix_(rows, rows)]
    return bool((A | np.eye(len(rows), dtype=bool)).all())


def test_every_search_is_named_in_the_certificate_format():
    names = [entry.name for entry in _search.SEARCHES]
    assert len(set(names)) == len(names)
    assert set(names) <= set(STRATEGIES) and "none" not in names
    assert names[-1] == "exhaustive search"      # it beats, or proves best, the others


@pytest.mark.parametrize("seed", range(6))
def test_each_search_finds_compatible_pairs_at_most_the_optimum(seed):
    G = _graph(seed)
    view = _search._Candidates.of(G)
    optimum = _optimum(view)
    best = None
    for entry in _search.SEARCHES:
        found = entry.run(view, best)
        if found is None:
            continue
        assert _is_clique(view, list(found.members)), entry.name
        assert found.rank == G.rank(list(found.members)) <= optimum, entry.name
        if best is None or found.rank > best.rank:
            best = found
    selected = _search._select(G)
    assert selected.rank == best.rank
    if selected.exhaustive:
        assert selected.rank == optimum
    assert selected.strategy in STRATEGIES


@pytest.mark.parametrize("seed", [3, 20])
def test_the_exhaustive_search_beats_the_greedy_ones_where_they_miss(seed):
    """On these subfamilies the greedy searches certify one less than can be had."""
    G = _graph(seed)
    view = _search._Candidates.of(G)
    greedy = max(entry.run(view, None).rank for entry in _search.SEARCHES[:-1])
    found = _search._select(G)
    assert found.strategy == "exhaustive search" and found.exhaustive
    assert found.rank == _optimum(view) == greedy + 1


def test_a_search_added_to_the_table_is_run_and_named(monkeypatch):
    """A new search is one entry: here one that takes the optimum outright."""
    G = _graph(0)
    view = _search._Candidates.of(G)

    def take_the_optimum(view, best):
        sub, Kinv = view.ratio_bounds(np.arange(len(view.keep)))
        rank, clique, _ = _search._exact_clique_search(sub, Kinv, 1, 10**6)
        return _search.Found(tuple(int(view.keep[v]) for v in clique), rank)

    first = _search.Search("the optimum", take_the_optimum)
    monkeypatch.setattr(_search, "SEARCHES", (first, *_search.SEARCHES))
    found = _search._select(G)
    assert found.strategy == "the optimum" and found.rank == _optimum(view)
    assert found.exhaustive                  # the exhaustive search proves it best


def test_the_selection_gives_the_certificate_pairs():
    rng = np.random.default_rng(0)
    X = H12[rng.random(len(H12)) < 0.9]
    rank, cert = certify(X, return_certificate=True)
    cons = _constraints.constraints(X)
    chains = _constraints.reach(cons, drop_single=True)
    selection = _search.search(cons, chains)
    qi, ki = selection.pairs()
    np.testing.assert_array_equal(qi, cert.query_index)
    np.testing.assert_array_equal(ki, cert.key_index)
    np.testing.assert_array_equal(selection.denominators(), cert.eps_denominators)
    assert selection.found.rank == rank and selection.found.strategy == cert.strategy
