"""Names that moved: a module keeps serving them for one release, with a warning."""

import warnings

__all__ = ["moved_names"]


def moved_names(module, names, home):
    """A module-level ``__getattr__`` for ``module`` that serves each of ``names`` from
    the module ``home``, with a :class:`FutureWarning` naming its new path.

    Examples
    --------
    >>> import math, warnings
    >>> from minip_learn._deprecation import moved_names
    >>> getattr_ = moved_names("old.place", ("pi",), math)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     value = getattr_("pi")
    >>> value == math.pi, str(caught[0].message)
    (True, 'old.place.pi is deprecated; import math.pi instead.')
    """
    names = frozenset(names)

    def __getattr__(name):
        if name in names:
            warnings.warn(f"{module}.{name} is deprecated; import {home.__name__}.{name} "
                          "instead.", FutureWarning, stacklevel=2)
            return getattr(home, name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
