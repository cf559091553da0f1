"""Model selection for Min-IP: the full-set splitter, rank and seed sweeps, ensembles."""

from ._ensemble import fit_ensemble
from ._execution import resolve_devices  # noqa: F401  (importable here, not exported)
from ._search import cv_results_to_frame
from ._split import FullSetSplit
from ._store import (  # noqa: F401  (KeyedStore, check_writable: importable, not exported)
    KeyedStore,
    ResultsFolderWarning,
    check_writable,
    load_sweep,
)
from ._summary import summarize_sweep
from ._sweep import rank_sweep
from ._values import jsonable  # noqa: F401  (importable here, not exported)

__all__ = [
    "FullSetSplit",
    "ResultsFolderWarning",
    "cv_results_to_frame",
    "fit_ensemble",
    "load_sweep",
    "rank_sweep",
    "summarize_sweep",
]
