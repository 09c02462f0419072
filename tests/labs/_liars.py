"""Building blocks for lying answers: objects whose comparison dunders (or, for tensors,
``__torch_function__``) say "yes" to whatever a check asks. The labs' tests wrap wrong answers in
them and assert that the checks refuse them for their type before comparing anything."""
import torch


class Anything:
    """Equal to everything, truthy, contains everything."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__

    def __bool__(self):
        return True

    def __contains__(self, item):
        return True

    def __repr__(self):
        return "Anything()"


class LyingStr(str):
    """A str that equals every other value."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__


class LyingList(list):
    """A list that equals every other value and claims the length it is given (``claims``), while
    iterating over what it really holds."""

    def __init__(self, items=(), claims=None):
        super().__init__(items)
        self.claims = claims

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = None

    def __len__(self):
        return list.__len__(self) if self.claims is None else self.claims


class LyingDict(dict):
    """A dict that equals every other value and claims to contain every key."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = None

    def __contains__(self, key):
        return True


def _broadcast_shape(args):
    shapes = [a.shape for a in args[:2] if isinstance(a, torch.Tensor)]
    return torch.broadcast_shapes(*shapes)


class LyingTensor(torch.Tensor):
    """A tensor subclass whose ``__torch_function__`` says that it is equal / close to anything
    (``allclose``, ``equal``, ``isclose``, ``eq``: which also fools ``torch.testing.assert_close``);
    everything else runs as for the values it really holds."""

    _SAYS_TRUE = (torch.allclose, torch.equal, torch.Tensor.allclose, torch.Tensor.equal)
    _SAYS_ALL_TRUE = (torch.isclose, torch.eq, torch.Tensor.isclose, torch.Tensor.eq, torch.Tensor.__eq__)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in cls._SAYS_TRUE:
            return True
        if func in cls._SAYS_ALL_TRUE:
            with torch._C.DisableTorchFunctionSubclass():
                return torch.ones(_broadcast_shape(args), dtype=torch.bool)
        return super().__torch_function__(func, types, args, kwargs)


def lying(t):
    """``t``'s values, as a LyingTensor (shares t's data)."""
    return t.as_subclass(LyingTensor)


def fools_allclose(t, other) -> bool:
    """Whether ``t`` makes the naive comparisons a check could make say "equal" to ``other``."""
    return (torch.allclose(t, other) and torch.equal(t, other) and bool((t == other).all())
            and _assert_close_passes(t, other))


def _assert_close_passes(t, other) -> bool:
    try:
        torch.testing.assert_close(t, other)
    except AssertionError:
        return False
    return True
