"""Progress of long steps: one :mod:`tqdm` bar whose stages are named as they start.

``certify``, ``verify_certificate``, the witness-suite builder and the ``certify`` /
``verify`` commands run a few long stages each (build the constraints, search, write
the certificate ...); :class:`Stages` shows which one is running and how long the
whole has taken. With ``enabled=False`` nothing is printed and nothing is imported.
"""

__all__ = ["Stages", "stages"]


class Stages:
    """A progress bar over named stages, on standard error.

    Parameters
    ----------
    desc : str
        What is being done (the bar's label), e.g. ``"certify"``.
    names : sequence of str
        The stages in order; :meth:`start` must be called with them in that order.
    enabled : bool, default=True
        False: print nothing.

    Examples
    --------
    >>> from minip_learn._progress import Stages
    >>> with Stages("certify", ["constraints", "search"], enabled=False) as bar:
    ...     bar.start("constraints")
    ...     bar.start("search")
    >>> bar.done
    2
    """

    def __init__(self, desc, names, *, enabled=True):
        self.desc = desc
        self.names = list(names)
        self.enabled = enabled
        self.done = 0
        self._bar = None
        self._current = None

    def __enter__(self):
        if self.enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=len(self.names), desc=self.desc, unit="stage",
                             bar_format="{desc}: {n_fmt}/{total_fmt} stages, {elapsed} "
                                        "{postfix}", leave=False)
        return self

    def start(self, name):
        """Mark the previous stage done and show ``name`` as running."""
        if name not in self.names:
            raise ValueError(f"unknown stage {name!r}; stages are {self.names}.")
        self._finish_current()
        self._current = name
        if self._bar is not None:
            self._bar.set_postfix_str(f"[{name}]")

    def _finish_current(self):
        if self._current is not None:
            self.done += 1
            if self._bar is not None:
                self._bar.update(1)
        self._current = None

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self._finish_current()
        if self._bar is not None:
            self._bar.close()
        return False


def stages(desc, names, progress):
    """:class:`Stages` for ``desc``, shown when ``progress`` is true."""
    return Stages(desc, names, enabled=bool(progress))
