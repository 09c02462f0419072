"""dispatcher.key-priority: plausible wrong models of dispatch fail, called directly through
run_checks. The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch

from grader.checks import run_checks
from tests.conftest import assert_rejected
from tests.labs._liars import LyingStr

EX = "dispatcher.key-priority"


def _full_order():
    text = repr(torch._C._dispatch_keyset_full())
    return text[text.index("(") + 1: text.rindex(")")].split(", ")


# ------------------------------------------------------------------ plausible wrong answers
def _model(*, order=None, use_include=True, use_exclude=True, skip_fallthroughs=True,
           skip_missing=False):
    """A dispatch model with one deliberate flaw, chosen by the keywords."""
    order = order or _full_order()
    rank = {k: i for i, k in enumerate(order)}

    def dispatch_key(keyset, kernels, fallthroughs=(), include=(), exclude=()):
        candidates = set(keyset) | (set(include) if use_include else set())
        if use_exclude:
            candidates -= set(exclude)
        if skip_fallthroughs:
            candidates -= set(fallthroughs)
        ranked = sorted(candidates, key=lambda k: rank.get(k, -1), reverse=True)
        if skip_missing:                       # keeps looking for a key that has a kernel
            ranked = [k for k in ranked if k in set(kernels) or k in set(fallthroughs)]
        if not ranked:
            return None
        top = ranked[0]
        return top if top in set(kernels) else None
    return dispatch_key


def _backend_first():
    """Functionality keys below the dense backends: backends win."""
    order = _full_order()
    backends = [k for k in order if k in ("CPU", "Meta")]
    return [k for k in order if k not in backends] + backends


def _enum_member_order():
    """The order pybind lists torch._C.DispatchKey's members in (not the priority order)."""
    return list(torch._C.DispatchKey.__members__)


def _highest_kernel(keyset, kernels, fallthroughs=(), include=(), exclude=()):
    """The highest-priority key that has a kernel, among all kernels (ignores the tensor's keys)."""
    rank = {k: i for i, k in enumerate(_full_order())}
    kernels = [k for k in kernels if k not in set(exclude)]
    return max(kernels, key=lambda k: rank.get(k, -1)) if kernels else None


WRONG = {
    "ignores the TLS exclude set": (_model(use_exclude=False), "exclude"),
    "ignores the TLS include set": (_model(use_include=False), "include"),
    "runs fallthrough kernels": (_model(skip_fallthroughs=False), "fallthrough"),
    "skips keys without a kernel": (_model(skip_missing=True), "does not go on looking"),
    "backend before autograd": (_model(order=_backend_first()), "priority order"),
    "DispatchKey member order": (_model(order=_enum_member_order()), "you returned"),
    "alphabetical order": (_model(order=sorted(_full_order())), "you returned"),
    "highest kernel, whatever the keys": (_highest_kernel, "you returned"),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name, seed):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase, seed=seed)


def test_libraries_are_destroyed():
    """Repeated runs leave no operator of the checks behind in the dispatcher."""
    before = {n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_kp_")}
    run_checks(EX, _model(), seed=0, hidden=True)
    run_checks(EX, _model(use_exclude=False), seed=1, hidden=True)
    after = {n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_kp_")}
    assert after == before


# ------------------------------------------------------------------ lying answers
def _always_claims(keyset, kernels, fallthroughs=(), include=(), exclude=()):
    """Models nothing: a str subclass that claims to equal any key name (and None)."""
    return LyingStr("CPU")


def _flawed_but_claims(keyset, kernels, fallthroughs=(), include=(), exclude=()):
    """Ignores the TLS exclude set, and dresses its answer (even 'none') as a str that claims to equal
    the right one."""
    key = _model(use_exclude=False)(keyset, kernels, fallthroughs, include, exclude)
    return LyingStr("" if key is None else key)


LYING = {
    "a key name that equals anything": (_always_claims, "subclass of str"),
    "a flawed model whose names equal anything": (_flawed_but_claims, "subclass of str"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    got = _always_claims(["CPU"], ["CPU"])
    assert got == "AutogradCPU" and got == None  # noqa: E711


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name, seed):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase, seed=seed)
