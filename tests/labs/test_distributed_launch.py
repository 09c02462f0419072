"""labs/distributed/launch.py: ``run`` returns what each rank returned, by rank; a rank that
raises, exits, is killed or hangs is reported by rank with what it did and where (the root cause,
not the peer that lost its connection to it); the stub's NotImplementedError comes back as such;
a process group left initialized in the calling process is destroyed, costing nothing; and whatever
happens, no rank, no process a rank started and no temporary folder outlives the call. Each run
forks real ranks on gloo (about 0.1 s); timeouts are short."""
import inspect
import linecache
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from labs.distributed import launch
from labs.distributed.launch import RankFailure, run


def test_a_world_whose_ranks_could_not_connect_is_started_once_more(tmp_path, monkeypatch,
                                                                   capsys):
    marker, real = tmp_path / "failed-once", dist.init_process_group

    def flaky(*args, **kwargs):  # (forked ranks share files, not memory)
        if kwargs["rank"] == 0 and not marker.exists():
            marker.touch()
            raise RuntimeError("Gloo connectFullMesh failed: Connection closed by peer")
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", flaky)
    # (the barrier keeps rank 1 from leaving while rank 0 still connects: this test spends the
    # one retry, so gloo's own connect race must not happen in the second world)
    assert run(lambda: print("joined") or dist.barrier() or dist.get_rank(), 2) == [0, 1]
    assert marker.exists() and "Gloo" not in capsys.readouterr().out  # (only the world that ran)


def test_a_world_whose_new_group_could_not_connect_is_started_once_more(tmp_path,
                                                                      monkeypatch):
    """gloo lost a peer while the ranks created a group of their own (init_device_mesh's
    new_group, seen on a loaded machine): the world is started again, and that one works."""
    from torch.distributed import distributed_c10d

    marker, real = tmp_path / "failed-once", distributed_c10d._new_process_group_helper

    def flaky(*args, **kwargs):
        if dist.is_initialized() and dist.get_rank() == 0 and not marker.exists():
            marker.touch()
            raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                               "[127.0.0.1]:53895")
        return real(*args, **kwargs)

    monkeypatch.setattr(distributed_c10d, "_new_process_group_helper", flaky)
    assert run(_in_a_new_group, 2, echo=False) == [0, 1]
    assert marker.exists()


def _in_a_new_group():
    group = dist.new_group([0, 1])
    dist.barrier(group=group)
    return dist.get_rank(group)


def test_a_lost_peer_outside_group_creation_is_the_answers_and_not_retried(tmp_path):
    """A rank that lost its peer in a collective (the peer's own failure) is no reason to
    start a new world: the world runs once, and the root cause is reported."""
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(RankFailure, match="rank 1 raised ValueError: broken"):
        run(_fails_on_rank_1, 2, str(runs), timeout=10, echo=False)
    assert len(list(runs.iterdir())) == 2  # (each rank once: one world)


def _fails_on_rank_1(folder: str):
    Path(folder, str(dist.get_rank())).touch()
    if dist.get_rank() == 1:
        raise ValueError("broken")
    dist.barrier()


def test_a_rank_that_never_joins_is_reported_after_the_retry(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no network")

    monkeypatch.setattr(dist, "init_process_group", broken)
    with pytest.raises(RankFailure, match="no network"):
        run(lambda: 0, 2)


@pytest.fixture(autouse=True)
def leaves_nothing_behind(tmp_path, monkeypatch):
    """Every test: no child process and no ``ranks-*`` folder outlives it. (The temporary
    folder is this test's own, so that runs in other test processes do not show up in it.)"""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    folders = set(Path(tempfile.gettempdir()).glob("ranks-*"))
    yield
    from multiprocessing import forkserver, resource_tracker

    servers = {forkserver._forkserver._forkserver_pid,  # (clean worlds' server: lives on)
               resource_tracker._resource_tracker._pid}
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.pid not in servers]
    assert not left, left
    assert set(Path(tempfile.gettempdir()).glob("ranks-*")) == folders


def _line(fn, text):
    """The line number of the line of ``fn`` that contains ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


# ------------------------------------------------------------------ results
def _sum_and_env(k):
    rank = dist.get_rank()
    x = torch.full((3,), float(rank))
    dist.all_reduce(x)
    env = {v: os.environ[v] for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return {"rank": rank, "sum": x * k, "env": env, "threads": torch.get_num_threads()}


def test_values_come_back_by_rank_with_torchruns_environment():
    values = run(_sum_and_env, 3, 2, timeout=5, echo=False)
    assert [v["rank"] for v in values] == [0, 1, 2]
    for r, v in enumerate(values):
        assert torch.equal(v["sum"], torch.full((3,), 6.0))  # 2 * (0 + 1 + 2)
        assert v["env"] == {"RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": str(r),
                            "LOCAL_WORLD_SIZE": "3"}
        assert v["threads"] == 1


def _prints():
    print(f"hello from {dist.get_rank()}")
    print("second line")


def test_echo_prints_each_ranks_output_prefixed_and_echo_false_prints_nothing(capsys):
    run(_prints, 2, timeout=5)
    out = capsys.readouterr().out.splitlines()
    assert out == ["[rank 0] hello from 0", "[rank 0] second line",
                   "[rank 1] hello from 1", "[rank 1] second line"]
    run(_prints, 2, timeout=5, echo=False)
    assert capsys.readouterr() == ("", "")


def _warns():
    import sys
    import warnings

    rank = dist.get_rank()
    # (as warnings.showwarning prints it in a kernel; pytest records warnings instead)
    sys.stderr.write(warnings.formatwarning("`old_api` is deprecated", FutureWarning,
                                            "/x/c10d_logger.py", 83, "    return f()"))
    # (the form torch's logging gives a record on a rank: tag, level, date, time, thread id)
    print(f"[rank{rank}]:W1204 22:45:06.82600{rank} 32{rank}9 torch/_logging/_internal.py:1345] "
          "CPU process group does not support alltoall yet", flush=True)
    print(f"done {rank}")


def test_a_warning_every_rank_prints_is_echoed_once_with_the_ranks_that_printed_it(capsys):
    run(_warns, 3, timeout=5)
    out = capsys.readouterr().out.splitlines()
    warned = [line for line in out if "FutureWarning: `old_api` is deprecated" in line]
    assert len(warned) == 1 and warned[0].startswith("[ranks 0-2] "), out
    assert out.count("[ranks 0-2] W torch/_logging/_internal.py:1345] CPU process group does "
                     "not support alltoall yet") == 1, out
    assert [line for line in out if "done" in line] == [
        "[rank 0] done 0", "[rank 1] done 1", "[rank 2] done 2"], out


def test_two_runs_at_once_share_no_store_and_no_port():
    results, errors = {}, []

    def call(k):
        try:
            results[k] = run(_sum_and_env, 2, k, timeout=10, echo=False)
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(k,)) for k in (1, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in (1, 10):
        assert [v["sum"].tolist() for v in results[k]] == [[float(k)] * 3] * 2


# ------------------------------------------------------------------ failures
def _raises_after_its_peer_lost_it():
    if dist.get_rank() == 1:  # (rank 0's lost connection is reported first)
        dist.destroy_process_group()
        time.sleep(0.3)
        raise ValueError("the real cause")
    dist.recv(torch.zeros(2), 1)


def test_the_rank_that_raised_is_blamed_not_the_peer_that_lost_it():
    with pytest.raises(RankFailure) as info:
        run(_raises_after_its_peer_lost_it, 2, timeout=5, echo=False)
    e = info.value
    assert (e.rank, e.exception) == (1, "ValueError")
    assert str(e).startswith("rank 1 raised ValueError: the real cause"), str(e)
    assert "(then rank 0 failed too, waiting for it)" in str(e)
    assert "Connection" not in str(e)


def _exits():
    if dist.get_rank() == 1:
        os._exit(3)
    dist.recv(torch.zeros(2), 1)


def _killed():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.recv(torch.zeros(2), 1)


@pytest.mark.parametrize("fn, what", [(_exits, "exited (exit code 3)"),
                                      (_killed, "was killed by SIGKILL")])
def test_a_rank_that_ends_without_a_result_is_named(fn, what):
    with pytest.raises(RankFailure) as info:
        run(fn, 2, timeout=5, echo=False)
    assert str(info.value).startswith(f"rank 1 {what} before returning a result"), info.value
    assert (info.value.rank, info.value.exception) == (1, "")


def _waits():
    if dist.get_rank() == 1:
        time.sleep(60)
    dist.recv(torch.zeros(2), 1)


def _receives_a_float64_into_float32():
    if dist.get_rank() == 0:
        dist.send(torch.ones(4, dtype=torch.float64), 1)
    else:
        dist.recv(torch.zeros(4), 0)


def test_gloo_s_abort_on_a_message_bigger_than_its_buffer_is_explained():
    with pytest.raises(RankFailure) as info:
        run(_receives_a_float64_into_float32, 2, echo=False)
    msg = str(info.value)
    assert msg.startswith("rank 1 was killed by SIGABRT before returning a result"), msg
    assert ("(gloo aborts a rank when a message of 32 bytes arrives for a receive buffer of 16: "
            "a recv's tensor must have as many elements, of the same dtype") in msg, msg


@pytest.fixture
def calm(monkeypatch):
    """A machine with nothing else to run: time limits are not stretched (launch.allowed)."""
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))


def test_a_busy_machine_stretches_a_time_limit_by_its_load_per_cpu(monkeypatch):
    cpus = os.cpu_count()
    for load, stretch in ((0.5 * cpus, 1.0), (2.5 * cpus, 2.5), (40.0 * cpus, launch.MOST_STRETCH)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert launch.allowed(10.0) == pytest.approx(10.0 * stretch)


def test_a_clean_world_forks_its_ranks_from_a_server_not_from_this_process():
    """The judges' worlds (clean=True) come from multiprocessing's forkserver: no lock a thread
    of this process holds can come along; their function travels by name."""
    values = run(_sum_and_env, 2, 3, clean=True, echo=False)
    assert [v["rank"] for v in values] == [0, 1] and values[0]["sum"].tolist() == [3.0] * 3
    assert all(v["threads"] == 1 for v in values)


def test_a_rank_that_never_joins_the_group_starts_the_world_again(tmp_path, monkeypatch, calm):
    """A fork that inherited a lock another thread of the parent held hangs before joining the
    process group: after launch.JOIN seconds the world is started again, and that one works."""
    real, first = dist.init_process_group, tmp_path / "first"

    def stuck_once(*args, **kwargs):
        if kwargs.get("rank") == 1 and not first.exists():
            first.touch()
            time.sleep(60)  # (as if waiting on a lock no thread of this process will release)
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", stuck_once)
    monkeypatch.setattr(launch, "JOIN", 1.0)
    start = time.monotonic()
    assert [r["rank"] for r in run(_sum_and_env, 2, 1, timeout=20, echo=False)] == [0, 1]
    assert first.exists() and 1.0 <= time.monotonic() - start < 10


def test_ranks_that_hang_are_stopped_and_named_with_where_they_were(calm):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run(_waits, 2, timeout=2, echo=False)
    assert time.monotonic() - start < 5
    msg = str(info.value)
    assert msg.startswith("these ranks did not finish within 2 s and were stopped: "), msg
    assert (f"rank 0 in _waits (line {_line(_waits, 'dist.recv')}), "
            f"rank 1 in _waits (line {_line(_waits, 'time.sleep')})") in msg, msg
    assert info.value.rank == 0


def _stub():
    raise NotImplementedError("distributed.ring-allreduce")


def test_the_stub_is_re_raised_as_the_stub():
    with pytest.raises(NotImplementedError) as info:
        run(_stub, 2, timeout=5, echo=False)
    assert info.value.args == ("distributed.ring-allreduce",)


def _unpicklable():
    return lambda: dist.get_rank()


def test_a_value_that_cannot_be_pickled_is_reported():
    with pytest.raises(RankFailure, match="returned a value that cannot be sent back to the "
                                          "notebook") as info:
        run(_unpicklable, 2, timeout=5, echo=False)
    assert "return plain data" in str(info.value)


def test_a_process_group_of_the_calling_process_is_destroyed_and_costs_nothing(capsys):
    """A dist.init_process_group line left in an answer cell (or any cell) of the notebook: the
    ranks start without it, and the learner is told (it had cost the exercise's points)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert [v["rank"] for v in run(_sum_and_env, 2, 1, timeout=5, echo=False)] == [0, 1]
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert "a process group was initialized in the notebook's own process" in \
        capsys.readouterr().err


def _sleeps():
    time.sleep(60)


def test_an_interrupt_stops_the_ranks():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            run(_sleeps, 2, timeout=30, echo=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - start < 5


def _starts_a_process_and_hangs(pid_file):
    if dist.get_rank() == 0:
        Path(pid_file).write_text(str(subprocess.Popen(["sleep", "60"]).pid))
    time.sleep(60)


def test_a_process_a_rank_started_dies_with_it(tmp_path, calm):
    pid_file = tmp_path / "grandchild"
    with pytest.raises(RankFailure, match="did not finish within 1 s"):
        run(_starts_a_process_and_hangs, 2, str(pid_file), timeout=1, echo=False)
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # (killed; reaped by whichever process adopted it)
        try:
            if psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the process rank 0 started ({grandchild}) is still running")


# ------------------------------------------------------------------ through the grader
CELL = '''def ring_all_reduce(tensor):
    rank = dist.get_rank()
    if rank == 1:
        raise ValueError("chunk sizes do not add up")
    dist.recv(tensor, 1)
'''


def test_an_answer_that_raises_on_a_rank_is_an_error_with_the_learners_line():
    from grader.checks import run_checks

    cell = "/tmp/ipykernel_4242/2718281828.py"  # (as ipykernel names a cell's code)
    linecache.cache[cell] = (len(CELL), None, CELL.splitlines(True), cell)
    try:
        namespace = {"dist": dist}
        exec(compile(CELL, cell, "exec"), namespace)
        v = run_checks("distributed.ring-allreduce", namespace["ring_all_reduce"], seed=0)
    finally:
        del linecache.cache[cell]
    assert v.status == "error", v.message
    assert ("rank 1 raised ValueError: chunk sizes do not add up at line 4 of your cell: "
            '`raise ValueError("chunk sizes do not add up")`') in v.message, v.message


def _network_seen():
    return os.environ.get("GLOO_SOCKET_IFNAME"), dist.get_rank()


def test_a_network_interface_the_notebook_set_for_another_machine_does_not_reach_the_ranks(
        monkeypatch):
    """A notebook written on a laptop set GLOO_SOCKET_IFNAME="en0": gloo finds no such
    interface here and every rank fails to join. The ranks get the network settings the
    process was started with (here: none)."""
    assert launch.started_network_env()["GLOO_SOCKET_IFNAME"] is None  # (this test's premise)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "en0")
    monkeypatch.setenv("MASTER_PORT", "1")
    assert run(_network_seen, 2) == [(None, 0), (None, 1)]
    assert run(_network_seen, 2, clean=True) == [(None, 0), (None, 1)]
