"""modules.hook-order: plausible wrong predictions fail against a real run's events, judged
through run_checks. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
from tests.conftest import assert_rejected, load_answer

EX = "modules.hook-order"


def _with_hooks(rewrite):
    """The reference run on hooks that ``rewrite`` changed (the model is left alone)."""
    hook_order = load_answer(EX)
    return lambda model, hooks: hook_order(model, rewrite(hooks))


def test_prepend_puts_a_hook_first():
    answer = _with_hooks(lambda hooks: [{**h, "prepend": False} for h in hooks])
    assert_rejected(EX, answer, "prepend=True puts a hook before those already registered")


def test_a_global_hook_runs_on_every_module_not_only_the_root():
    answer = _with_hooks(lambda hooks: [{**h, "on": ""} if h["on"] is None else h
                                        for h in hooks])
    assert_rejected(EX, answer, "global")


def test_backward_hooks_come_in_reverse_call_order():
    hook_order = load_answer(EX)

    def answer(model, hooks):
        events = hook_order(model, hooks)
        cut = max(i for i, e in enumerate(events) if e[0] == "forward"
                  or any(h["label"] == e[0] and h["kind"].startswith("forward") for h in hooks))
        return events[: cut + 1] + events[cut + 1:][::-1]

    assert_rejected(EX, answer, "BackwardHook")


def test_backward_pre_hooks_and_backward_hooks_are_not_at_the_same_point():
    hook_order = load_answer(EX)

    def answer(model, hooks):  # every backward pre-hook relabelled as a backward hook
        return hook_order(model, [{**h, "kind": "backward"} if h["kind"] == "backward_pre"
                                  else h for h in hooks])

    assert_rejected(EX, answer, "pre-hooks run when the gradient of its output arrives")
