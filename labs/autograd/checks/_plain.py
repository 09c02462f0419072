"""What the autograd lab's checks accept as a container from an answer, besides the exact builtin
types: the standard library's dict variants, whose comparisons and iteration are dict's own (a
learner's subclass of them is refused like any other, see ``grader.checks.exact``), and namedtuple
classes that redefine none of tuple's dunders."""
from __future__ import annotations

import collections

#: the dict types an answer may return (exactly these types)
DICTS = (dict, collections.OrderedDict, collections.defaultdict)

# what a namedtuple class must leave as tuple's own for its items to be what they seem
_TUPLE_DUNDERS = ("__iter__", "__len__", "__getitem__", "__contains__", "__eq__", "__ne__", "__bool__",
                  "__getattribute__", "__getattr__", "__reversed__")


def plain_namedtuple(value) -> bool:
    """Whether ``value`` is an instance of a namedtuple class (``collections.namedtuple`` or
    ``typing.NamedTuple``) that redefines none of tuple's dunders and holds nothing besides its items
    (no ``__dict__``): then ``tuple.__iter__(value)`` gives exactly what it holds."""
    cls = type(value)
    if not isinstance(value, tuple) or cls is tuple or not isinstance(getattr(cls, "_fields", None), tuple):
        return False
    own = [k for k in cls.__mro__ if k not in (tuple, object)]
    if any(name in vars(k) for k in own for name in _TUPLE_DUNDERS):
        return False
    try:
        object.__getattribute__(value, "__dict__")
    except AttributeError:
        return True
    return False
