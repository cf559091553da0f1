"""Model selection for Min-IP: the full-set splitter, rank and seed sweeps, ensembles."""

from ._ensemble import fit_ensemble
from ._execution import resolve_devices
from ._search import cv_results_to_frame
from ._split import FullSetSplit
from ._store import KeyedStore, ResultsFolderWarning, check_writable, load_sweep
from ._summary import summarize_sweep
from ._sweep import rank_sweep
from ._values import jsonable

__all__ = [
    "FullSetSplit",
    "KeyedStore",
    "ResultsFolderWarning",
    "check_writable",
    "cv_results_to_frame",
    "fit_ensemble",
    "jsonable",
    "load_sweep",
    "rank_sweep",
    "resolve_devices",
    "summarize_sweep",
]
