"""One registry class for the named parts of ``nn``: feature maps and sequence mixers.

A :class:`Registry` maps names to the subclasses of one base class and resolves the
values a ``feature_map=`` or ``mixer=`` parameter takes: a registered name, a subclass
of the base (used as it is), or a user's :class:`torch.nn.Module` class or factory,
which is wrapped in the registry's user class. The public functions of
:mod:`minip_learn.nn.feature_maps` and :mod:`minip_learn.nn.mixers`
(``register_*``, ``available_*``, ``*_table``, ``get_*``, ``make_*``) are its methods.
"""

__all__ = ["Registry"]


class Registry:
    """Names to classes for one kind of part (feature maps, mixers).

    Parameters
    ----------
    kind : str
        The part's name in messages (``"feature map"``, ``"mixer"``).
    parameter : str
        The estimator parameter that takes a part (``"feature_map"``, ``"mixer"``).
    base : type
        The base class of the registered classes; a subclass passed as a value is used
        as it is.
    user : type
        The wrapper of a user's module class or factory, built as
        ``user(*args, factory=value, **kwargs)``.
    call : str
        How a user's class is called, for messages
        (``"cls(n_bits, rank, **feature_kwargs)"``).
    columns : dict of str to callable
        The columns of :meth:`table` between ``"name"`` and ``"class"``: each callable
        reads a registered class.
    check : callable, default=None
        ``check(name, cls)`` run before a class is registered (raises ValueError to
        refuse it).

    Examples
    --------
    >>> from torch import nn
    >>> from minip_learn.nn._registry import Registry
    >>> class Part(nn.Module):
    ...     name = None
    >>> class UserPart(Part):
    ...     def __init__(self, n, *, factory):
    ...         super().__init__()
    ...         self.module = factory(n)
    >>> parts = Registry("part", "part", Part, UserPart, call="cls(n)",
    ...                  columns={"doc": lambda cls: cls.__doc__})
    >>> @parts.register("one")
    ... class One(Part):
    ...     '''The first part.'''
    >>> parts.available(), parts.table()[0]["doc"], parts.get(nn.Linear).__name__
    (['one'], 'The first part.', 'UserPart')
    >>> parts.get("two")
    Traceback (most recent call last):
    ...
    ValueError: Unknown part 'two'; valid names are ['one'], or pass a Part subclass or a torch.nn.Module class called as cls(n).
    """  # noqa: E501

    def __init__(self, kind, parameter, base, user, *, call, columns, check=None):
        self.kind = kind
        self.parameter = parameter
        self.base = base
        self.user = user
        self.call = call
        self.columns = dict(columns)
        self.check = check
        self.classes = {}

    def register(self, name):
        """Class decorator adding a subclass of the base under ``name`` (must be new);
        the class gets it as ``name``."""

        def decorator(cls):
            if name in self.classes:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            if self.check is not None:
                self.check(name, cls)
            cls.name = name
            self.classes[name] = cls
            return cls

        return decorator

    def unregister(self, name):
        """Remove ``name`` from the registry and return its class (a KeyError naming
        the registered names when it is not one)."""
        if name not in self.classes:
            raise KeyError(f"{self.kind} {name!r} is not registered; registered names are "
                           f"{self.available()}")
        return self.classes.pop(name)

    def available(self, **declarations):
        """Registered names, sorted; ``declarations`` not None keep the classes whose
        attribute of that name equals the value."""
        wanted = {k: v for k, v in declarations.items() if v is not None}
        return sorted(name for name, cls in self.classes.items()
                      if all(getattr(cls, k) == v for k, v in wanted.items()))

    def table(self):
        """One dict per registered class, sorted by name: ``"name"``, the
        :attr:`columns` and ``"class"`` (the qualified name)."""
        rows = []
        for name in self.available():
            cls = self.classes[name]
            rows.append({"name": name,
                         **{key: read(cls) for key, read in self.columns.items()},
                         "class": f"{cls.__module__}.{cls.__qualname__}"})
        return rows

    def get(self, value):
        """The class that ``parameter=value`` builds: a registered name's class, a
        subclass of the base as it is, or the user class for any other callable."""
        if isinstance(value, type) and issubclass(value, self.base):
            return value
        if isinstance(value, str):
            if value in self.classes:
                return self.classes[value]
        elif callable(value):
            return self.user
        raise ValueError(
            f"Unknown {self.parameter} {value!r}; valid names are {self.available()}, or "
            f"pass a {self.base.__name__} subclass or a torch.nn.Module class called as "
            f"{self.call}."
        )

    def make(self, value, *args, **kwargs):
        """Build ``parameter=value`` as ``cls(*args, **kwargs)``; a user's class or
        factory as ``user(*args, factory=value, **kwargs)``."""
        cls = self.get(value)
        if cls is self.user and value is not self.user:
            return self.user(*args, factory=value, **kwargs)
        return cls(*args, **kwargs)

    def name(self, value):
        """Readable name of a ``parameter=`` value, for messages and tables: a string
        as it is, a registered class's name, else the qualified name."""
        if isinstance(value, str):
            return value
        if (isinstance(value, type) and issubclass(value, self.base)
                and self.classes.get(value.name) is value):
            return value.name
        module = getattr(value, "__module__", None)
        qualname = getattr(value, "__qualname__", None) or repr(value)
        return f"{module}.{qualname}" if module else qualname

    def is_registered(self, value):
        """Whether ``value`` is a registered name or class."""
        if isinstance(value, str):
            return value in self.classes
        return any(value is cls for cls in self.classes.values())
