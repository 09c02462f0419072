"""grader.kernel.modelled: an answer that runs the code its exercise models, or starts a process,
is seen by the probe whatever it returns; the probe's own calls, imports, and answers that
compute for themselves are not."""
import os
import subprocess
import sys

import pytest

from grader.checks import ran_modelled
from grader.kernel import probe
from grader.kernel.modelled import observe

FSDP = ("torch/distributed/fsdp/", "torch/distributed/_composable/")  # (fully_shard is
# wrapped by torch/distributed/_composable/contract.py: contract)


def _reply(answer, models, *args):
    return probe.decode(probe.call(answer, None, args, {}, 0, models))


def test_a_call_into_the_modelled_folder_is_reported_with_the_learners_line():
    from torch.distributed.fsdp import fully_shard

    def answer(n):
        try:
            fully_shard(None)
        except Exception:  # noqa: BLE001  (a refusal caught does not hide the call)
            pass
        return n

    ran = _reply(answer, FSDP, 3)["modelled"]
    assert ran["where"].startswith("torch/distributed/_composable/contract.py: "), ran
    assert ran["code"] == "fully_shard(None)" and ran["kind"] == "modelled", ran
    message = ran_modelled(ran, FSDP)
    assert "your answer ran torch/distributed/_composable/contract.py" in message, message
    assert "mechanism this exercise asks you to model" in message, message


def test_an_answer_that_computes_for_itself_passes_and_gets_its_value():
    import torch

    assert _reply(lambda n: torch.arange(n).sum().item(), FSDP, 4) == {"value": 6}


def test_a_qualified_name_pattern_picks_functions_of_a_file():
    from torch.distributed.tensor import Replicate, Shard

    models = ("torch/distributed/tensor/placement_types.py:*._[!_]*",)
    assert "value" in _reply(lambda: Shard(0).is_shard() and Replicate().is_replicate(), models)
    import torch

    def splits():
        return len(Shard(0)._split_tensor(torch.arange(4.0), 2)[0])

    assert _reply(splits, models)["modelled"]["where"].endswith("Shard._split_tensor")


def test_a_function_written_in_c_is_named_by_module_and_name():
    import torch.distributed as dist

    models = ("torch/_C/_distributed_c10d:_compute_bucket_*",)

    def buckets():
        import torch

        return dist._compute_bucket_assignment_by_size([torch.zeros(4)], [1 << 20])[0]

    ran = _reply(buckets, models)["modelled"]
    assert ran["where"] == "torch/_C/_distributed_c10d: _compute_bucket_assignment_by_size", ran


def test_importing_the_modelled_code_is_not_running_it():
    sys.modules.pop("torch.distributed.fsdp._fully_shard._fsdp_init", None)

    def imports():
        import torch.distributed.fsdp._fully_shard._fsdp_init  # noqa: F401
        return 1

    assert _reply(imports, FSDP) == {"value": 1}


def test_what_the_probe_calls_itself_is_not_the_answers():
    """The probe's own frames (and whatever called the probe) are not the learner's code."""
    from torch.distributed.fsdp import fully_shard

    with observe(FSDP, sys._getframe()) as seen:
        try:
            fully_shard(None)
        except Exception:  # noqa: BLE001
            pass
    assert seen["ran"] is None


def test_starting_a_process_is_reported():
    def answer():
        return subprocess.run(["true"]).returncode

    ran = _reply(answer, FSDP)["modelled"]
    assert ran["kind"] == "start" and "subprocess.py" in ran["where"], ran
    assert "your answer started a process" in ran_modelled(ran, FSDP)


def test_an_exercise_that_starts_processes_may_start_them_and_is_still_observed_in_them():
    """``starts_processes = true`` (a loader's workers): a process started is no refusal, and
    what the answer runs in a child still is (its calls come back through the shared file)."""
    import multiprocessing

    from grader.kernel.modelled import PROCESSES
    from grader.labs import load_lab

    assert PROCESSES in load_lab("modules").exercise("modules.loader").models
    assert PROCESSES not in load_lab("modules").exercise("modules.mini-module").models

    def answer():
        return subprocess.run(["true"]).returncode

    assert _reply(answer, (*FSDP, PROCESSES)) == {"value": 0}

    def child():
        from torch.distributed.fsdp import fully_shard

        try:
            fully_shard(None)
        except Exception:  # noqa: BLE001  (a refusal caught does not hide the call)
            pass

    def forks():
        p = multiprocessing.get_context("fork").Process(target=child)
        p.start()
        p.join()
        return p.exitcode

    ran = _reply(forks, (*FSDP, PROCESSES))["modelled"]
    assert ran["kind"] == "modelled" and PROCESSES not in ran_modelled(ran, (*FSDP, PROCESSES))


def test_a_forked_child_reports_its_calls_through_the_shared_file():
    """A rank the probe forks runs the answer there: what it ran comes back to the parent."""
    from torch.distributed.fsdp import fully_shard

    def answer():
        try:
            fully_shard(None)
        except Exception:  # noqa: BLE001
            pass

    with observe(FSDP, sys._getframe()) as seen:
        pid = os.fork()  # (the probe's fork: this frame is the probe's)
        if pid == 0:
            answer()
            os._exit(0)
        os.waitpid(pid, 0)
    assert seen["ran"]["code"] == "fully_shard(None)", seen


def test_an_answer_that_removes_the_profiler_does_not_pass_and_the_old_one_is_back():
    def mine(frame, event, arg):
        pass

    sys.setprofile(mine)
    try:
        ran = _reply(lambda: sys.setprofile(None), FSDP)["modelled"]
        assert sys.getprofile() is mine
    finally:
        sys.setprofile(None)
    assert "switched off or went around the profiler" in ran_modelled(ran, FSDP)


def test_a_librarys_callback_on_earlier_garbage_is_not_the_answers():
    """Garbage left before the probe (a cycle keyed in dynamo's weak dictionary) is not
    collected while the answer runs, so its weakref callback (library code) is not taken for a
    call of the answer's; it is collected after."""
    import gc

    from torch._dynamo.utils import ExactWeakKeyDictionary

    class Key:
        pass

    keys, key = ExactWeakKeyDictionary(), Key()
    key.cycle = key
    keys[key] = 1
    del key
    assert _reply(lambda: gc.collect() * 0 + 3, ("torch/_dynamo/",)) == {"value": 3}
    gc.collect()
    assert len(keys.values) == 0


def test_no_patterns_observe_nothing():
    assert _reply(lambda: subprocess.run(["true"]).returncode, ()) == {"value": 0}


@pytest.mark.parametrize("field", [["ok", 3], "torch/export/", [""]])
def test_a_malformed_models_field_is_refused(tmp_path, monkeypatch, field):
    from grader import labs

    table = tmp_path / "demo" / "lab.toml"
    table.parent.mkdir()
    table.write_text('id = "demo"\ntitle = "t"\nnotebook = "99_demo"\n[[exercises]]\n'
                     f'id = "demo.x"\ntitle = "x"\nanswer = "x"\npoints = 1\n'
                     f"models = {field!r}\n".replace("'", '"'))
    monkeypatch.setattr(labs, "_tables", lambda: {"demo": table})
    with pytest.raises(labs.GraderError, match="malformed lab table"):
        labs.load_lab("demo")


def test_an_answer_that_is_the_mechanism_itself_is_seen_before_it_runs():
    """Bound to torch's own function (through a partial too), or a class built on its class:
    the probe calls it from its own frames, where no frame of the learner's stands above."""
    import functools

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    hooks = ("torch/distributed/algorithms/ddp_comm_hooks/",)
    for answer in (default_hooks.fp16_compress_hook,
                   functools.partial(default_hooks.fp16_compress_hook, None)):
        ran = _reply(answer, hooks)["modelled"]
        assert ran["kind"] == "answer" and "default_hooks.py: fp16_compress_hook" in ran["where"]
        assert "PyTorch's own code" in ran_modelled(ran, hooks)

    class Mine(DistributedDataParallel):
        pass

    ran = _reply(Mine, ("torch/nn/parallel/distributed.py",))["modelled"]
    assert ran["where"].endswith("distributed.py: DistributedDataParallel"), ran
    assert "value" in _reply(lambda: 1, hooks)  # (a function of the learner's own)


def test_an_object_that_calls_or_bases_the_mechanism_is_seen_as_it():
    """A trial's forgeries: an object whose ``__call__`` is the mechanism (a class or a partial
    of one), an object whose ``__mro_entries__`` puts the mechanism's class under the probe's
    own class statement, and the mechanism's class with its ``__module__`` renamed."""
    import functools

    import torch
    from torch.utils.data import DataLoader

    class Calls:
        __call__ = DataLoader

    class CallsPartial:
        __call__ = functools.partial(torch.optim.AdamW, foreach=True)

    class Bases:
        __call__ = None

        def __mro_entries__(self, bases):
            return (torch.nn.Module,)

    for answer, pattern in ((Calls(), "torch/utils/data/dataloader.py"),
                            (CallsPartial(), "torch/optim/adamw.py"),
                            (Bases(), "torch/nn/modules/module.py")):
        ran = _reply(answer, (pattern,))["modelled"]
        assert ran["kind"] == "answer" and ran["where"].startswith(pattern), ran
    renamed = type("Module", (), {"__module__": "not_a_module",
                                  "forward": torch.nn.Module.forward})
    ran = _reply(renamed, ("torch/nn/modules/module.py",))["modelled"]
    assert ran["kind"] == "answer", ran

    class Mine:
        def __call__(self):
            return 1

    assert _reply(Mine(), ("torch/utils/data/dataloader.py",)) == {"value": 1}


def test_an_answer_that_is_the_courses_own_code_is_refused():
    """A probe's helper (the hook-order lab's real run) bound as the answer: its calls would
    be the course's, not the learner's, so it is refused before it runs."""
    import functools

    from labs.modules import probes

    answer = functools.partial(probes.build_tree, seed=0)
    ran = _reply(answer, ("torch/nn/modules/",))["modelled"]
    assert ran["kind"] == "course" and ran["where"] == "labs/modules/probes.py: build_tree", ran
    assert "the course's own code" in ran_modelled(ran, ("torch/nn/modules/",))


def test_code_compiled_under_a_librarys_file_name_is_the_learners():
    """A helper compiled with a made-up file name inside site-packages still runs as the
    learner's code: no file holds it."""
    import os

    import torch
    from torch.distributed.fsdp import fully_shard

    fake = os.path.join(os.path.dirname(torch.__file__), "_not_a_file_of_torch.py")
    namespace = {"fully_shard": fully_shard}
    exec(compile("def helper():\n    fully_shard(None)\n", fake, "exec"), namespace)

    def answer():
        try:
            namespace["helper"]()
        except Exception:  # noqa: BLE001  (a refusal caught does not hide the call)
            pass
        return 1

    ran = _reply(answer, FSDP)["modelled"]
    assert ran["kind"] == "modelled", ran


def test_code_compiled_from_a_string_is_the_learners_when_it_runs():
    from torch.distributed.fsdp import fully_shard

    answer = eval("lambda: [f(None) for f in [fully_shard]]", {"fully_shard": fully_shard})
    ran = _reply(answer, FSDP)["modelled"]
    assert ran["kind"] == "modelled", ran


def test_switching_the_profiler_off_and_back_on_is_seen():
    def answer():
        saved = sys.getprofile()
        sys.setprofile(None)
        sys.setprofile(saved)
        return 1

    ran = _reply(answer, FSDP)["modelled"]
    assert ran["kind"] == "blind" and ran["where"] == "sys: setprofile", ran
    assert "went around the profiler the check runs it under (sys: setprofile)" in ran_modelled(
        ran, FSDP)


def test_a_thread_started_below_threading_is_seen_and_threading_is_not():
    import _thread
    import threading

    ran = _reply(lambda: _thread.start_new_thread(int, ()), FSDP)["modelled"]
    assert ran["kind"] == "blind" and "start_new_thread" in ran["where"], ran

    def threaded():
        t = threading.Thread(target=int)
        t.start()
        t.join()
        return 2

    assert _reply(threaded, FSDP) == {"value": 2}  # (threading gives its threads the profiler)


def test_a_method_of_a_cpp_class_is_named_by_its_module_and_own_name():
    import torch.distributed as dist

    store = dist.HashStore()
    ran = _reply(lambda: store.set("k", "v"), ("torch/_C/_distributed_c10d:set",))
    assert ran["modelled"]["where"] == "torch/_C/_distributed_c10d: set", ran
