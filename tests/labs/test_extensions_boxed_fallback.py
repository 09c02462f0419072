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


def test_an_edited_source_logs_in_the_same_process():
    # the fallback is registered by start() and dropped by stop(): a key has one per process
    source = load_answer(FB)()
    for text in (source, source + "\n// edited\n", source):
        ns = build.build(text, "logging")
        ns.start()
        probes.run_program(["mm"], 0)
        assert ns.stop()[-2:] == ["aten::mm", f"{ns.name}::stop"]  # (stop's own call last)
