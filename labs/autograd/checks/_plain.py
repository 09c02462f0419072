"""What the autograd lab's checks accept as a container from an answer, besides the exact builtin
types: the standard library's dict variants, whose comparisons and iteration are dict's own (a
learner's subclass of them is refused like any other, see ``grader.checks.exact``), and what a
probe showed of the rest (``labs.autograd.probes.shown``), rebuilt here."""
from __future__ import annotations

import collections

#: the dict types an answer may return (exactly these types)
DICTS = (dict, collections.OrderedDict, collections.defaultdict)

# --------------------------------------------------------------------------- what a probe showed
class Shown:
    """An object the answer returned that is not plain data, as a probe's marker describes it
    (``labs.autograd.probes.marker``): its type's name and the builtin type it derives from
    (``base``: ``"dict"``, ``"list"``, ``"str"``, ``"Tensor"``..., or None)."""

    def __init__(self, type_name: str, base: str | None):
        self.type_name, self.base = str(type_name), base if isinstance(base, str) else None

    def __repr__(self):
        return f"<a {self.type_name}>"


def type_name(value) -> str:
    """The name of ``value``'s type as the answer had it (a :class:`Shown`'s own)."""
    return value.type_name if isinstance(value, Shown) else type(value).__name__


def is_a(value, types) -> bool:
    """``isinstance(value, types)``, where a :class:`Shown` counts as an instance of its base."""
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, Shown):
        return value.base is not None and value.base in {t.__name__ for t in types}
    return isinstance(value, types)


def exact_shown(value, types, what: str):
    """``grader.checks.exact`` for a rebuilt value: a :class:`Shown` is refused for its type (a
    subclass of its base, or not one of ``types``) with ``exact``'s words."""
    from grader.checks import CheckFailure, exact

    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, Shown):
        return exact(value, types, what)
    names = " or ".join(t.__name__ for t in types)
    base = value.base if value.base in {t.__name__ for t in types} else None
    why = (f"a subclass of {base}; return a plain {base}" if base is not None
           else f"not a {names}")
    raise CheckFailure(f"{what} has type {value.type_name}, {why}.")


def rebuilt(data, resolve=None):
    """What a probe's :func:`labs.autograd.probes.shown` gave, as Python objects again: lists,
    tuples and scalars as they are, each dict marker as a dict (keys rebuilt too), each object
    marker as a :class:`Shown`, and every other marker (a reference to a graph part) as
    ``resolve(marker)`` returns it (a :class:`Shown` when ``resolve`` is None or returns None)."""
    t = type(data)
    if t in (list, tuple):
        return t(rebuilt(v, resolve) for v in data)
    if t is not dict:
        return data
    kind = data.get("?")
    if kind == "dict":
        return {rebuilt(k, resolve): rebuilt(v, resolve) for k, v in data.get("items", [])}
    if kind != "object" and resolve is not None and (got := resolve(data)) is not None:
        return got
    return Shown(data.get("type", "object"), data.get("base"))
