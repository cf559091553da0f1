"""Docstring parts that several public functions of :mod:`minip_learn.theory` share."""

__all__ = ["VERIFY_DOC", "verify_doc"]

#: The docstring parts that every check accepting or rejecting (``verify_*``) shares,
#: written once: :func:`verify_doc` puts each where a docstring says ``%(key)s``.
VERIFY_DOC = {
    "raise_on_failure": """raise_on_failure : bool, default=True
        Raise a :class:`ValueError` naming the first failed check; otherwise return
        False.""",
    "valid": """Returns
    -------
    valid : bool
        True when every check passes.""",
}


def verify_doc(func):
    """Complete ``func``'s docstring with the shared parts of the checks
    (``VERIFY_DOC``)."""
    if func.__doc__:
        for key, block in VERIFY_DOC.items():
            func.__doc__ = func.__doc__.replace(f"%({key})s", block)
    return func
