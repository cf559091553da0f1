"""One registry class for the named parts of ``nn``: feature maps and sequence mixers.

A :class:`Registry` maps names to the subclasses of one base class and resolves the
values a ``feature_map=`` or ``mixer=`` parameter takes: a registered name, a subclass
of the base (used as it is), or a user's :class:`torch.nn.Module` class or factory,
which is wrapped in the registry's user class. The public functions of
:mod:`minip_learn.nn.feature_maps` and :mod:`minip_learn.nn.mixers`
(``register_*``, ``available_*``, ``*_table``, ``get_*``, ``make_*``) are its methods,
and the parts of their docstrings that read the same for every registry are written
once here (:data:`DOC_BLOCKS`, :meth:`Registry.document`). A user's module is held by
the user class through :class:`UserModule`. The library's heads and mixers record the
arguments they were built with (:class:`RecordsArguments`), from which a saved model is
built again without running code from its file.
"""

import functools
import inspect

import torch
from torch import nn

__all__ = ["DOC_BLOCKS", "RecordsArguments", "Registry", "UserModule", "init_arguments"]

#: Docstring blocks shared by the registries' public functions and user classes:
#: ``%(key)s`` in a docstring completed by :meth:`Registry.document` becomes the block,
#: with ``{base}``, ``{user}``, ``{kind}`` and ``{options}`` those of the registry.
DOC_BLOCKS = {
    "unregister": """Parameters
    ----------
    name : str
        A registered name.

    Returns
    -------
    cls : {base} subclass
        The class that was registered under ``name``.

    Raises
    ------
    KeyError
        If ``name`` is not registered.""",
    "register_returns": """Returns
    -------
    decorator : callable""",
    "get_raises": """Raises
    ------
    ValueError
        If the value is an unknown name (the message lists the valid names) or neither a
        name nor callable.""",
    "user": """factory : callable
        A module class or a function returning a module.
    **kwargs
        Passed to ``factory`` (the estimator's ``{options}``).

    Attributes
    ----------
    module : torch.nn.Module
        The user's {kind}.""",
}


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

    @property
    def options(self):
        """The estimator parameter of the keyword options :attr:`call` passes
        (``"feature_kwargs"``)."""
        return self.call.rsplit("**", 1)[-1].rstrip(")")

    def document(self, obj):
        """Complete the docstring of ``obj`` (a function or class): each ``%(key)s`` of
        :data:`DOC_BLOCKS` becomes that block, written for this registry."""
        fields = {"base": self.base.__name__, "user": self.user.__name__,
                  "kind": self.kind, "options": self.options}
        for key, block in DOC_BLOCKS.items():
            obj.__doc__ = obj.__doc__.replace(f"%({key})s", block.format(**fields))
        return obj

    def check_shape(self, out, value, expected, *, what, tokens, shape):
        """Raise a ValueError naming ``parameter=value`` unless ``out`` is a tensor of
        shape ``expected``: ``what`` it holds (``"features"``), the shapes of the tokens
        and of ``out`` in words (``tokens``, ``shape``)."""
        label = self.name(value)
        if not isinstance(out, torch.Tensor):
            raise ValueError(
                f"{self.parameter}={label!r} must return a torch.Tensor of {what}; got "
                f"{type(out).__name__}."
            )
        if tuple(out.shape) != expected:
            raise ValueError(
                f"{self.parameter}={label!r} must map tokens of shape {tokens} to {what} "
                f"of shape {shape} = {expected}; got shape {tuple(out.shape)}."
            )


class UserModule:
    """What the user classes of the registries share: the user's module, run as the
    forward.

    :class:`~minip_learn.nn.UserFeatureMap` and :class:`~minip_learn.nn.UserMixer`
    call :meth:`hold` from their constructor and declare the rest.
    """

    def hold(self, registry, factory, *args, **kwargs):
        """Keep ``factory``, its readable name (``name``) and the module
        ``factory(*args, **kwargs)`` (``module``); a ValueError naming
        ``registry.parameter`` when that is not a :class:`torch.nn.Module`."""
        self.factory = factory
        self.name = registry.name(factory)
        module = factory(*args, **kwargs)
        if not isinstance(module, nn.Module):
            called_as = registry.parameter + registry.call[registry.call.index("("):]
            raise ValueError(
                f"{registry.parameter}={self.name!r} must build a torch.nn.Module when "
                f"called as {called_as}; got {type(module).__name__}."
            )
        self.module = module

    def forward(self, x):
        return self.module(x)


@functools.cache
def _init_signature(cls):
    return inspect.signature(cls.__init__)


class RecordsArguments:
    """Mixin of the modules that record the keyword arguments they were built with.

    ``cls(*args, **kwargs)`` keeps ``{name: value}`` of ``cls.__init__``'s parameters
    (positional ones by name, the contents of ``**kwargs`` spread out) on the instance;
    :func:`init_arguments` reads them. ``type(m)(**init_arguments(m))`` builds a module
    of the same architecture, into which ``m.state_dict()`` loads. A copy
    (``copy.deepcopy``) keeps them; an instance restored from a pickle made before
    modules recorded them has none.
    """

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        if args or kwargs:  # a copy or an unpickled module is made without arguments
            try:
                bound = _init_signature(cls).bind(None, *args, **kwargs)
            except TypeError:  # __init__ raises its own message
                return self
            arguments = {}
            for name, value in list(bound.arguments.items())[1:]:
                kind = bound.signature.parameters[name].kind
                if kind is inspect.Parameter.VAR_KEYWORD:
                    arguments.update(value)
                elif kind is inspect.Parameter.VAR_POSITIONAL:
                    arguments[name] = tuple(value)
                else:
                    arguments[name] = value
            object.__setattr__(self, "_init_arguments", arguments)
        return self


def init_arguments(module):
    """The keyword arguments ``module`` was built with, or None when it did not record
    them (not a :class:`RecordsArguments` module, or restored from an old pickle).

    Examples
    --------
    >>> from minip_learn.nn import KernelAttentionHead
    >>> from minip_learn.nn import init_arguments
    >>> init_arguments(KernelAttentionHead(6, 2, feature_map="exp"))
    {'n_bits': 6, 'rank': 2, 'feature_map': 'exp'}
    """
    arguments = module.__dict__.get("_init_arguments")
    return None if arguments is None else dict(arguments)
