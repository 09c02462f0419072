"""extensions.cpp-op: plausible wrong C++ sources fail (each built once, in seconds), a source that
does not compile is reported at its own lines, and builds are reused by their text
(labs/extensions/build.py). The reference and the stub: test_exercise_contract.py."""
import os
import shutil
import subprocess
import sys

from labs.extensions import build
from tests.conftest import ROOT, assert_rejected, load_answer

OP = "extensions.cpp-op"


def _edited(exercise: str, old: str, new: str):
    """The reference source of ``exercise`` with ``old`` replaced by ``new`` (once)."""
    source = load_answer(exercise)()
    assert old in source, old
    edited = source.replace(old, new, 1)
    return lambda: edited


def test_an_operator_without_a_meta_kernel_fails_on_meta_tensors():
    answer = _edited(OP, "TORCH_LIBRARY_IMPL(TORCH_EXTENSION_NAME, Meta, m) {\n"
                     "  m.impl(\"mul_tanh\", &mul_tanh_meta);\n}", "")
    assert_rejected(OP, answer, "Register a Meta kernel")


def test_a_kernel_that_ignores_strides_fails_on_transposed_inputs():
    answer = _edited(OP, "xc = x.contiguous(), yc = y.contiguous()", "xc = x, yc = y")
    assert_rejected(OP, answer, "The inputs are not contiguous")


def test_a_source_that_does_not_compile_is_quoted_at_its_own_line():
    answer = _edited(OP, "po[i] = px[i] * std::tanh(py[i]);", "po[i] = px[i] * tanh_of(py[i]);")
    line = answer().splitlines().index("      po[i] = px[i] * tanh_of(py[i]);") + 1
    v = assert_rejected(OP, answer, f"line {line} of the source: error:")
    assert "tanh_of" in v.message and "/tmp" not in v.message and "ninja" not in v.message
    # checked again in the same process (torch does not compile it twice): the same errors
    assert assert_rejected(OP, answer).message == v.message


def test_a_build_is_loaded_again_from_a_copied_folder_without_compiling(tmp_path):
    # (in another process: a library's namespace can be defined once per process)
    source = load_answer(OP)()
    name = build.build(source).name  # (built by the tests above, or now)
    assert sorted(p.name for p in (build.root() / name).iterdir()) == ["built", f"{name}.so"]
    shutil.copytree(build.root() / name, tmp_path / "course" / name)
    code = ("import torch, torch.utils.cpp_extension as c\n"
            "def no(**kw): raise AssertionError('compiled again')\n"
            "c.load = no\n"
            "from labs.extensions import build\n"
            "import sys\n"
            "ns = build.build(sys.stdin.read())\n"
            "print(ns.name, ns.mul_tanh(torch.ones(2), torch.zeros(2)).tolist())")
    done = subprocess.run([sys.executable, "-c", code], input=source, capture_output=True,
                          text=True, env={**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)},
                          cwd=ROOT)
    assert done.stdout.split() == [name, "[0.0,", "0.0]"], done.stderr[-2000:]
    assert build.library_name(source + " ") != name  # another text, another build


def test_trim_keeps_the_sources_errors_and_lines():
    log = ("[1/2] c++ -c /x/ext_1.cpp\nFAILED: ext_1.o\n/x/ext_1.cpp:2:5: error: 'foo' was not "
           "declared in this scope\n    2 |     foo();\n/usr/include/x.h:9:1: note: bla\n")
    assert build.trim(log, "/x/ext_1.cpp", "int f() {\n    foo();\n}") == (
        "line 2 of the source: error: 'foo' was not declared in this scope\n    foo();")
