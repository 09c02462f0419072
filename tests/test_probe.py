"""grader.kernel.probe: the plain data that crosses between the learner's kernel and the judge,
and the records of what an answer raised (milliseconds, in this process); what the kernel side
imports."""
import io
import os
import pickle
import subprocess
import sys

import pytest
import torch

from grader.kernel import probe
from grader.checks import AnswerRaised, CheckFailure, LocalAnswer
from tests.conftest import ROOT


class LyingStr(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


class Scaled(torch.Tensor):
    pass


PLAIN = [None, True, 3, 2.5, 1 + 2j, "s", b"b", [1, (2, 3)], {"a": {1: [torch.ones(2)]}},
         torch.Size([2, 3]), torch.float64, torch.device("cpu"), (torch.arange(3),)]


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_data_crosses_both_ways_unchanged(value):
    assert probe.plain(value) == ""
    back = probe.decode(probe.encode(value))
    assert type(back) is type(value)
    assert repr(back) == repr(value)


@pytest.mark.parametrize("value, phrase", [
    (LyingStr("x"), "LyingStr, a subclass of str"),
    ([1, {"k": LyingStr("x")}], "the value[1]['k'] is a LyingStr"),
    (torch.ones(2).as_subclass(Scaled), "Scaled, a subclass of Tensor"),
    (lambda: 1, "is a function"),
    ({object(): 1}, "a key of the value is a object"),
    (torch.ones(2).to_sparse(), "torch.sparse_coo tensor"),
])
def test_what_is_not_plain_is_named(value, phrase):
    assert phrase in probe.plain(value)


def test_a_pickle_that_names_any_class_is_refused_unread():
    class Boom:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(ValueError, match="not plain data"):
        probe.decode(pickle.dumps(Boom()))
    buf = io.BytesIO()
    torch.save(torch.ones(2).as_subclass(Scaled), buf)
    with pytest.raises(ValueError, match="not plain data"):
        probe.decode(buf.getvalue())


def test_a_reply_too_large_is_refused(monkeypatch):
    monkeypatch.setattr(probe, "MAX_REPLY_BYTES", 100)
    with pytest.raises(ValueError, match="at most 100"):
        probe.decode(probe.encode("x" * 1000))


def test_what_the_answer_raised_arrives_as_a_record_with_the_learners_line():
    ns = {}
    exec(compile("def f(x):\n    return x + None\n", "/tmp/ipykernel_1/9.py", "exec"), ns)
    with pytest.raises(AnswerRaised) as info:
        LocalAnswer(ns["f"], "toy.add")(1)
    assert info.value.ename == "TypeError"
    assert info.value.record["where"].startswith(" at line 2 of your cell")
    assert not info.value.record["ours"]


def test_a_non_plain_return_fails_the_check_saying_what_it_is():
    with pytest.raises(CheckFailure, match="LyingStr, a subclass of str"):
        LocalAnswer(lambda: LyingStr("x"), "toy.add")()


def test_a_check_cannot_send_what_is_not_plain():
    with pytest.raises(TypeError, match="not plain"):
        LocalAnswer(lambda f: f(), "toy.add")(lambda: 1)


def test_tensors_come_back_detached_on_the_cpu_and_the_answers_rng_is_seeded():
    x = torch.ones(3, requires_grad=True)
    got = LocalAnswer(lambda: (x * 2, torch.rand(2)), "toy.add", seed=4)()
    again = LocalAnswer(lambda: torch.rand(2), "toy.add", seed=4)()
    assert not got[0].requires_grad and torch.equal(got[1], again)


def test_a_kernel_without_torch_encodes_with_pickle(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "torch")
    data = probe.encode({"a": [1, 2.5, "x"]})
    assert data[:2] != b"PK" and probe.decode(data) == {"a": [1, 2.5, "x"]}


def test_data_without_tensors_is_a_pickle_even_where_torch_is_loaded():
    assert probe.encode([1, "x"])[:2] != b"PK" and probe.encode([torch.float32])[:2] == b"PK"


def test_the_kernel_side_imports_nothing_of_the_judge_or_the_reports():
    """What a learner's kernel loads (the self-check, the probes, the displays, every lab's probes
    and pictures) pulls in no module of grader.judge, grader.reports or the CLI: a fresh
    interpreter imports them all and lists what of the grader it loaded."""
    from grader.labs import lab_ids

    labs = [lab for lab in lab_ids() if (ROOT / "labs" / lab / "probes.py").is_file()]
    code = ("import importlib, sys\n"
            "import grader.kernel.display, grader.kernel.probe, grader.kernel.selfcheck\n"
            f"for lab in {labs!r}:\n"
            "    importlib.import_module(f'labs.{lab}.probes')\n"
            "    importlib.import_module(f'labs.{lab}.viz')\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('grader'))))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    assert "grader.kernel.selfcheck" in loaded and len(labs) >= 5
    assert [m for m in loaded if m.startswith(("grader.judge", "grader.reports", "grader.cli"))
            ] == []


def test_config_changes_names_what_the_notebook_set_with_torch_s_defaults():
    """What a check patches to run under Inductor's own configuration (lab 6's AOTInductor
    probe: a Homebrew compiler left in cpp.cxx cost export.aoti)."""
    import torch._inductor.config as inductor_config

    from grader.checks import config_changes

    default = inductor_config.cpp.cxx
    # (what a library set earlier in this process, as AOTInductor's metadata, is left aside)
    earlier = config_changes(inductor_config)
    assert "cpp.cxx" not in earlier
    with inductor_config.patch({"cpp.cxx": ("/opt/homebrew/opt/llvm/bin/clang++",)}):
        assert config_changes(inductor_config) == {**earlier, "cpp.cxx": default}
        with inductor_config.patch(config_changes(inductor_config)):
            assert inductor_config.cpp.cxx == default
        assert inductor_config.cpp.cxx == ("/opt/homebrew/opt/llvm/bin/clang++",)


def test_checks_compile_into_the_cache_folder_the_process_started_with(tmp_path, monkeypatch):
    """A notebook pointed Inductor's and Triton's caches elsewhere (a Colab Drive path, one that
    cannot be made): what a check compiles still goes where the process was started with."""
    import os

    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    from grader.checks import compiler_caches_as_started, started_environ

    started = started_environ().get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    drive = "/proc/no/content/drive/MyDrive/inductor"  # (cannot be made)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", drive)
    monkeypatch.setenv("TRITON_CACHE_DIR", drive + "/triton")
    with compiler_caches_as_started():
        assert cache_dir() == os.path.abspath(started)
        assert os.environ.get("TRITON_CACHE_DIR") == started_environ().get("TRITON_CACHE_DIR")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == drive
    assert os.environ["TRITON_CACHE_DIR"] == drive + "/triton"


def test_settings_changes_name_what_a_person_types_not_what_a_library_installs():
    """A Homebrew compiler in cpp.cxx is named; a pass object (torchao installs one as
    pre_grad_custom_pass when its quantizer is imported) is not: the learner did not set it."""
    import torch._inductor.config as inductor_config

    from grader.kernel.probe import settings_changes

    def a_pass(graph):
        return graph

    with inductor_config.patch({"cpp.cxx": ("clang++",), "pre_grad_custom_pass": a_pass}):
        found = settings_changes()
    assert "torch._inductor.config.cpp.cxx = ('clang++',)" in found
    assert not [f for f in found if "pre_grad_custom_pass" in f]
