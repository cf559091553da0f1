"""Model selection for Min-IP: splitters (and, later, sweeps over rank and seed)."""

from ._split import FullSetSplit
from ._sweep import cv_results_to_frame, load_sweep, rank_sweep, summarize_sweep
from ._ensemble import fit_ensemble

__all__ = ["FullSetSplit"]
__all__ += ["cv_results_to_frame", "load_sweep", "rank_sweep", "summarize_sweep"]
__all__ += ["fit_ensemble"]
