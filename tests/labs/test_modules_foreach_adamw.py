"""modules.foreach-adamw: plausible wrong optimizers fail, each the reference (rewritten here with
one method per step, so that one step can be changed) with one step changed; and what the judge
relies on holds: AdamW resumed from its own state_dict goes on as if never stopped. The
reference and the stub are tested for every exercise in test_exercise_contract.py."""
import torch

from labs.modules import probes
from labs.modules.checks import foreach_adamw as judge
from tests.conftest import assert_rejected

EX = "modules.foreach-adamw"


class Reference(torch.optim.Optimizer):
    """The reference answer, one method per step."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, maximize=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))

    def new_state(self, p, group):
        state = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                 "exp_avg_sq": torch.zeros_like(p)}
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(p)
        return state

    def skip(self, p):
        return p.grad is None

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            ps = [p for p in group["params"] if not self.skip(p)]
            for p in ps:
                if not self.state[p]:
                    self.state[p].update(self.new_state(p, group))
            if ps:
                self.update(group, ps, [self.state[p] for p in ps])

    def grads(self, group, ps):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ps]
        return torch._foreach_neg(grads) if group["maximize"] else grads

    def counts(self, steps):
        torch._foreach_add_(steps, 1.0)
        return [s.item() for s in steps]

    def decay(self, group, ps, grads):
        if group["weight_decay"] != 0:
            torch._foreach_mul_(ps, 1 - group["lr"] * group["weight_decay"])
        return grads

    def maxima(self, group, states, exp_avgs, exp_avg_sqs):
        maxima = [s["max_exp_avg_sq"] for s in states]
        torch._foreach_maximum_(maxima, exp_avg_sqs)
        return maxima

    def denominators(self, group, second, counts):
        beta2 = group["betas"][1]
        denom = torch._foreach_sqrt(second)
        torch._foreach_div_(denom, [(1 - beta2**t) ** 0.5 for t in counts])
        torch._foreach_add_(denom, group["eps"])
        return denom

    def step_sizes(self, group, counts):
        return [-(group["lr"] / (1 - group["betas"][0] ** t)) for t in counts]

    def update(self, group, ps, states):
        beta1, beta2 = group["betas"]
        grads = self.grads(group, ps)
        counts = self.counts([s["step"] for s in states])
        grads = self.decay(group, ps, grads)
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        second = self.maxima(group, states, exp_avgs, exp_avg_sqs) if group["amsgrad"] \
            else exp_avg_sqs
        denom = self.denominators(group, second, counts)
        torch._foreach_addcdiv_(ps, exp_avgs, denom, self.step_sizes(group, counts))


def test_the_rewritten_reference_passes():
    v = judge_all(Reference)
    assert v.status == "passed", v.message


def judge_all(answer, seed=0):
    from grader.checks import run_checks

    return run_checks(EX, answer, seed=seed, hidden=True)


class AdamL2(Reference):
    """Adam's weight decay: added to the grad (L2), not applied to the parameter."""

    def decay(self, group, ps, grads):
        return torch._foreach_add(grads, ps, alpha=group["weight_decay"])


class NoBiasCorrection(Reference):
    def step_sizes(self, group, counts):
        return [-group["lr"]] * len(counts)

    def denominators(self, group, second, counts):
        denom = torch._foreach_sqrt(second)
        torch._foreach_add_(denom, group["eps"])
        return denom


class CountsBeforeIncrement(Reference):
    def counts(self, steps):
        counts = [s.item() for s in steps]
        torch._foreach_add_(steps, 1.0)
        return counts


class EpsBeforeDivision(Reference):
    def denominators(self, group, second, counts):
        beta2 = group["betas"][1]
        denom = torch._foreach_sqrt(second)
        torch._foreach_add_(denom, group["eps"])
        torch._foreach_div_(denom, [(1 - beta2**t) ** 0.5 for t in counts])
        return denom


class TensorBiasCorrection(Reference):
    """The bias corrections computed from the float32 step tensors, not as Python floats."""

    def denominators(self, group, second, counts):
        beta2 = group["betas"][1]
        steps = torch.tensor(counts)  # float32
        denom = torch._foreach_sqrt(second)
        torch._foreach_div_(denom, [float((1 - beta2**t) ** 0.5) for t in steps])
        torch._foreach_add_(denom, group["eps"])
        return denom


class AmsgradOfTheMean(Reference):
    def maxima(self, group, states, exp_avgs, exp_avg_sqs):
        maxima = [s["max_exp_avg_sq"] for s in states]
        torch._foreach_maximum_(maxima, torch._foreach_mul(exp_avgs, exp_avgs))
        return maxima


class IgnoresMaximize(Reference):
    def grads(self, group, ps):
        return [p.grad for p in ps]


class PerParameterLoop(Reference):
    def update(self, group, ps, states):
        for p, s in zip(ps, states):
            super().update(group, [p], [s])


class StepAsInt(Reference):
    def new_state(self, p, group):
        return {**super().new_state(p, group), "step": 0}

    def update(self, group, ps, states):
        for s in states:
            s["step"] += 1
        self.counted = [float(s["step"]) for s in states]
        super().update(group, ps, states)

    def counts(self, steps):
        return self.counted


class StepInt64(Reference):
    def new_state(self, p, group):
        return {**super().new_state(p, group), "step": torch.tensor(0)}

    def counts(self, steps):
        torch._foreach_add_(steps, 1)
        return [s.item() for s in steps]


class StateForEveryParameter(Reference):
    def skip(self, p):
        return False


def test_weight_decay_on_the_grad_is_adam_not_adamw():
    assert_rejected(EX, AdamL2, "state['exp_avg'] differs")


def test_no_bias_correction():
    assert_rejected(EX, NoBiasCorrection, "the parameter differs")


def test_bias_correction_with_the_step_before_it_is_counted():
    assert_rejected(EX, CountsBeforeIncrement, "ZeroDivisionError")


def test_eps_added_before_the_bias_correction_is_a_small_difference_in_ulps():
    v = assert_rejected(EX, EpsBeforeDivision, "ulps")
    assert "_single_tensor_adam" in v.message


def test_bias_corrections_in_float32_differ_in_the_last_bits():
    v = assert_rejected(EX, TensorBiasCorrection, "another order of operations")
    assert "ulps" in v.message


def test_amsgrad_keeps_the_maximum_of_the_wrong_tensor():
    assert_rejected(EX, AmsgradOfTheMean, "state['max_exp_avg_sq'] differs")


def test_maximize_ignored():
    assert_rejected(EX, IgnoresMaximize, "state['exp_avg'] differs")


def test_a_python_loop_over_the_parameters_is_not_foreach():
    assert_rejected(EX, PerParameterLoop, "a Python loop over the parameters")


def test_step_kept_as_a_python_int():
    assert_rejected(EX, StepAsInt, "state['step'] is 1, not a tensor")


def test_step_kept_as_an_int64_tensor():
    assert_rejected(EX, StepInt64, "torch.int64")


def test_state_for_a_parameter_whose_grad_is_none():
    assert_rejected(EX, StateForEveryParameter, "AdamW skips such a parameter")


def test_adamw_resumed_from_its_state_dict_goes_on_as_if_never_stopped():
    case = {"seed": 3, "groups": [{"shapes": [[2], [3]], "dtypes": ["float32", "float64"]},
                                  {"shapes": [[]], "dtypes": ["float32"], "lr": 0.1}],
            "options": {"amsgrad": True}, "steps": 5, "none": [[], [1], [], [0, 2], []]}
    whole = probes.adamw_steps(judge.torch_adamw, case)
    resumed = probes.adamw_steps(judge.torch_adamw, judge.resumed(case, 2))
    assert len(resumed) == 3
    for a, b in zip(whole[2:], resumed):
        assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
        assert a["state"][0]["exp_avg"].equal(b["state"][0]["exp_avg"])


def test_ulps_counts_units_in_the_last_place():
    one = torch.tensor([1.0])
    assert judge.ulps(torch.nextafter(one, torch.tensor([2.0])), one) == 1.0
    assert judge.ulps(one, one) == 0.0
