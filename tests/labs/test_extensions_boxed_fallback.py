"""extensions.boxed-fallback: a plausible wrong C++ source fails, and two versions of a source can
log in one process, one after the other (the reference and the stub:
test_exercise_contract.py)."""
from labs.extensions import build, probes
from tests.conftest import assert_rejected, load_answer
from tests.labs.test_extensions_cpp_op import _edited

FB = "extensions.boxed-fallback"


def test_a_fallback_that_logs_what_the_kernels_below_call():
    answer = _edited(FB, "  c10::impl::ExcludeDispatchKeyGuard no_logging(kKey);\n", "")
    assert_rejected(FB, answer, "exclude the key while you redispatch")


def test_two_versions_of_a_source_log_in_one_process_one_after_the_other():
    # the fallback is registered by start() and dropped by stop(): a key has one per process
    # (the wrong source above is the other version: built already)
    right = load_answer(FB)()
    other = right.replace("  c10::impl::ExcludeDispatchKeyGuard no_logging(kKey);\n", "")
    for text in (right, other, right):
        ns = build.build(text)
        ns.start()
        probes.run_program(["mm"], 0)
        log = ns.stop()
        assert "aten::mm" in log and log[-1] == f"{ns.name}::stop", log  # (stop's own call last)
