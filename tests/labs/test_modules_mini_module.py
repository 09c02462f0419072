"""modules.mini-module: plausible wrong Module base classes fail, judged through run_checks
against the same trees built on nn.Module. The reference and the stub are tested for every
exercise in test_exercise_contract.py."""
import collections

import torch

from tests.conftest import assert_rejected, load_answer

EX = "modules.mini-module"


def _variant(**methods):
    """The reference Module with ``methods`` replaced."""
    return type("Module", (load_answer(EX),), methods)


def test_parameters_kept_in_the_instance_dict_too_are_not_routed():
    base = load_answer(EX)

    def __setattr__(self, name, value):
        base.__setattr__(self, name, value)
        if isinstance(value, torch.nn.Parameter):
            object.__setattr__(self, name, value)  # shadows the routing

    assert_rejected(EX, _variant(__setattr__=__setattr__), "routing")


def test_non_persistent_buffers_are_not_saved():
    def state_dict(self, destination=None, prefix=""):
        destination = collections.OrderedDict() if destination is None else destination
        for place in (self._parameters, self._buffers):
            for name, value in place.items():
                if value is not None:
                    destination[prefix + name] = value.detach()
        for name, child in self._modules.items():
            if child is not None:
                child.state_dict(destination, prefix + name + ".")
        return destination

    assert_rejected(EX, _variant(state_dict=state_dict), "persistent buffers")


def test_a_tied_parameter_is_yielded_once():
    base = load_answer(EX)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return base._named_members(self, "_parameters", prefix, recurse, False)

    assert_rejected(EX, _variant(named_parameters=named_parameters), "named_parameters")


def test_a_shared_module_is_walked_once():
    base = load_answer(EX)

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        return base.named_modules(self, memo, prefix, remove_duplicate=False)

    assert_rejected(EX, _variant(named_modules=named_modules), "named_modules")


def test_unexpected_keys_are_reported():
    base = load_answer(EX)

    def load_state_dict(self, state_dict, strict=True):
        known = set(self.state_dict())
        return base.load_state_dict(self, {k: v for k, v in state_dict.items() if k in known},
                                    strict)

    assert_rejected(EX, _variant(load_state_dict=load_state_dict), "unexpected")


def test_what_a_forward_hook_returns_replaces_the_output():
    def __call__(self, *args):
        for hook in list(self._forward_pre_hooks.values()):
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
        out = self.forward(*args)
        for hook in list(self._forward_hooks.values()):
            hook(self, args, out)  # its result dropped
        return out

    assert_rejected(EX, _variant(__call__=__call__), "call with hooks")
