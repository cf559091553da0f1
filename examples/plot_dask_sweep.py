"""
A rank sweep on a Dask ``LocalCluster``
=======================================

:func:`~minip_learn.model_selection.rank_sweep` runs its fits through
:class:`joblib.Parallel`. Any joblib backend works, so the same call that uses local
processes can send its fits to a Dask cluster: start a
:class:`dask.distributed.Client` and wrap the call in
``joblib.parallel_config(backend="dask")``. Here the cluster is a
:class:`~dask.distributed.LocalCluster` with two single-threaded workers; on a real
cluster pass the scheduler's address to ``Client`` instead, nothing else changes.

The sweep fits ``table`` and ``elu+1`` heads over a few ranks on the small witness suite
(certified rank 8) and writes one JSON file per finished fit into a run folder, so an
interrupted sweep resumes where it stopped: the second call below reads every fit back
instead of recomputing it.

Needs the ``dask`` extra: ``pip install "minip-learn[dask]"``.
"""

# %%
import os
import tempfile

import matplotlib.pyplot as plt
from dask.distributed import Client, LocalCluster
from joblib import parallel_config

from minip_learn import KernelAttentionRegressor
from minip_learn.datasets import make_witness_suite
from minip_learn.experiments import markdown_table
from minip_learn.model_selection import load_sweep, rank_sweep
from minip_learn.plotting import plot_phase_transition

FAST = os.environ.get("MINIP_EXAMPLES_FAST") == "1"
RANKS = [4, 32] if FAST else [4, 16, 32]
MAPS = ["table"] if FAST else ["table", "elu+1"]
MAX_EPOCHS = 200 if FAST else 300

suite = make_witness_suite(n_bits=24, seq_len=3, construction="small")
estimator = KernelAttentionRegressor(max_epochs=MAX_EPOCHS, stop_tolerance=0.5)
out = tempfile.mkdtemp(prefix="minip-dask-")

# %%
# The sweep on the cluster
# ------------------------
# ``processes=False`` runs the two workers as threads of this process: the cluster
# starts in well under a second, which suits a gallery, and ``dashboard_address=":0"``
# puts its status page on any free local port. Thread workers share torch's global
# random generator, so two fits initialised at the same moment are not bit-for-bit
# reproducible from their seeds. For real sweeps use worker processes (the default,
# ``processes=True``; the script must then run its code under
# ``if __name__ == "__main__":``) or a remote cluster, ``Client("tcp://host:8786")``.
# ``threads_per_fit=1`` (the default) caps torch's intra-op threads in each fit.
cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                       dashboard_address=":0")
client = Client(cluster)
print(client)
sweep_args = dict(ranks=RANKS, seeds=[0], param_grid={"feature_map": MAPS},
                  certified_min_rank=suite.certified_min_rank, out=out,
                  name="dask-demo", progress=False, tags={"model": "kernel"})
with parallel_config(backend="dask"):
    res = rank_sweep(estimator, suite.X, suite.y, **sweep_args)
print(f"computed {res.n_computed} fits, resumed {res.n_resumed}")

# %%
# Resuming
# --------
# The same call again finds every fit in the run folder and computes nothing.
with parallel_config(backend="dask"):
    again = rank_sweep(estimator, suite.X, suite.y, **sweep_args)
print(f"second call: computed {again.n_computed}, resumed {again.n_resumed}")
client.close()
cluster.close()

# %%
# Results on disk
# ---------------
# :func:`~minip_learn.model_selection.load_sweep` reads every finished fit of a run
# folder (or of all run folders under a root) back into a table.
print("run folder:", res.path)
print(len(load_sweep(out)), "fits on disk")
print(markdown_table(res.summary[["feature_map", "rank", "n_solved", "n_fits",
                                  "exact_match_mean", "max_abs_error_median"]]))
plot_phase_transition(res.summary, certified_min_rank=suite.certified_min_rank,
                      constructive_rank=suite.constructive_rank,
                      title="Sweep on a Dask LocalCluster (small witness suite)")
plt.show()
