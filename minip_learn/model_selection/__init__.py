"""Model selection for Min-IP: splitters (and, later, sweeps over rank and seed)."""

from ._split import FullSetSplit

__all__ = ["FullSetSplit"]
