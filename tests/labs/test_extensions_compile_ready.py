"""extensions.compile-ready: plausible wrong fake kernels fail, called directly through
run_checks (the reference and the stub: test_exercise_contract.py)."""
import torch

from tests.conftest import assert_rejected

EX = "extensions.compile-ready"


def test_a_fake_kernel_that_keeps_the_input_shape():
    assert_rejected(EX, lambda x, multiple: x.new_empty(x.shape), "the fake kernel gave")


def test_a_fake_kernel_that_reads_values():
    def pad_rows_fake(x, multiple):  # data: a FakeTensor has none
        rows = int(torch.ceil(torch.tensor(x.shape[0] / multiple)).item()) * multiple
        return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))]) * (x.sum() > 0)
    assert_rejected(EX, pad_rows_fake, "")


def test_a_fake_kernel_that_pads_to_the_next_multiple_even_when_already_one():
    def pad_rows_fake(x, multiple):
        return x.new_empty((x.shape[0] // multiple * multiple + multiple, *x.shape[1:]))
    assert_rejected(EX, pad_rows_fake, "the fake kernel gave")
