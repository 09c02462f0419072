"""The kernel's sandbox: the limits reach the command it starts, and the environment is an
allow-list with a home inside the run's folder."""
import json
import os
import subprocess
import sys
import pwd
from pathlib import Path

import pytest

from grader.judge.sandbox import (Limits, inductor_cache, keep_warm_cache, kernel_env,
                            warm_cache)

ROOT = Path(__file__).resolve().parent.parent
USER = pwd.getpwuid(os.getuid()).pw_name
PROBE = ("import json, resource; print(json.dumps({r: resource.getrlimit(getattr(resource, r)) "
         "for r in ('RLIMIT_DATA', 'RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_CORE')}))")


def test_the_command_runs_under_the_limits():
    out = subprocess.run(Limits(memory=1 << 30, cpu=50, file_size=1 << 20).argv(
        [sys.executable, "-c", PROBE]), capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"RLIMIT_DATA": [1 << 30, 1 << 30], "RLIMIT_CPU": [50, 51],
                               "RLIMIT_FSIZE": [1 << 20, 1 << 20], "RLIMIT_CORE": [0, 0]}


def test_an_allocation_over_the_memory_limit_fails_inside_the_command():
    code = "try:\n    bytearray(600 << 20)\nexcept MemoryError:\n    print('MemoryError')"
    done = subprocess.run(Limits(memory=300 << 20, cpu=50).argv([sys.executable, "-c", code]),
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "MemoryError"), done.stderr


def test_a_file_over_the_size_limit_cannot_be_written(tmp_path):
    code = f"open({str(tmp_path / 'big')!r}, 'wb').write(bytes(2 << 20))"
    done = subprocess.run(Limits(memory=1 << 30, cpu=50, file_size=1 << 20).argv(
        [sys.executable, "-c", code]), capture_output=True, text=True)
    assert done.returncode != 0 and "File too large" in done.stderr


def test_the_environment_is_an_allow_list_with_its_own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv("GRADESCOPE_API_KEY", "secret")
    env = kernel_env(tmp_path)
    assert "GITHUB_TOKEN" not in env and "GRADESCOPE_API_KEY" not in env
    assert not [k for k in env if "PYTEST" in k]
    assert env["HOME"] == str(tmp_path) and env["TMPDIR"] == str(tmp_path / "tmp")
    assert (tmp_path / "tmp").is_dir()
    # one compiler cache per submission, inside its own run folder
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "tmp" / f"torchinductor_{USER}")
    # C++ extensions too, but outside the warm cache (a reference's build is its answer)
    assert env["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "tmp" / "torch_extensions")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)  # grader and labs importable


def test_threads_are_the_kernels_share_unless_the_environment_sets_them(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    env = kernel_env(tmp_path, threads=1)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("1", "3")
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"  # compiles in the kernel, no pool
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in kernel_env(tmp_path)


def test_the_warm_cache_is_copied_in_and_written_back_only_when_kept(tmp_path):
    warm, home = tmp_path / "warm", tmp_path / "home"
    (warm / "fx").mkdir(parents=True)
    (warm / "fx" / "graph").write_text("compiled")
    warm_cache(home, warm)
    assert (inductor_cache(home) / "fx" / "graph").read_text() == "compiled"
    (inductor_cache(home) / "planted").write_text("x")  # the kernel's copy is its own
    assert not (warm / "planted").exists()
    keep_warm_cache(home, warm)  # (after a run of the reference solution)
    assert sorted(p.name for p in warm.rglob("*")) == ["fx", "graph", "planted"]
    # another reference run at the same time adds its entries; none overwrites one already there
    second = tmp_path / "second"
    (inductor_cache(second) / "fx").mkdir(parents=True)
    (inductor_cache(second) / "fx" / "graph").write_text("another copy")
    (inductor_cache(second) / "fx" / "other").write_text("compiled too")
    keep_warm_cache(second, warm)
    assert sorted(p.name for p in warm.rglob("*")) == ["fx", "graph", "other", "planted"]
    assert (warm / "fx" / "graph").read_text() == "compiled"  # (no .part file left either)
    other = tmp_path / "other"
    warm_cache(other, tmp_path / "none")  # no warm cache yet: the kernel compiles cold
    assert not inductor_cache(other).exists()


def test_kernel_messages_with_text_utf8_cannot_hold_are_packed_not_lost():
    from jupyter_client import session
    from jupyter_client.session import json_unpacker

    from grader.judge.sandbox import json_packer

    msg = {"text": "caf\udce9 \ud800 ok \ud83d\ude00", "n": 1}
    assert json_unpacker(json_packer(msg)) == {"text": "caf\ufffd \ufffd ok 😀", "n": 1}
    assert json_packer({"text": "plain"}) == session.json_packer({"text": "plain"})


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                    reason="a kernel's PID namespace needs root on Linux")
def test_a_kernel_whose_grader_is_killed_does_not_outlive_it(tmp_path):
    """A grader killed while its kernel loops (kill -9, a job's time limit) cannot stop the
    kernel: the sandbox sees its parent gone and ends the kernel's namespace."""
    import signal
    import time

    (tmp_path / "hidden").mkdir()
    argv = Limits(memory=1 << 30, cpu=60, hide=(str(tmp_path / "hidden"),)).argv(
        [sys.executable, "-c", "while True: pass"])
    grader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         f"p = subprocess.Popen({argv!r})\nprint(p.pid, flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    sandbox = int(grader.stdout.readline())

    kernel = [sys.executable, "-c", "while True: pass"]

    def alive() -> dict[int, str]:
        """The sandbox, its namespace's init and the kernel, by pid, while they live."""
        found = {}
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes().decode().split("\0")[:-1]
            except OSError:
                continue
            if stat[0] != "Z" and (cmdline == kernel or cmdline == argv):
                found[int(name)] = "kernel" if cmdline == kernel else "sandbox"
        return found

    deadline = time.monotonic() + 10
    while "kernel" not in alive().values() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox in alive() and "kernel" in alive().values(), alive()
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    deadline = time.monotonic() + 5
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive() == {}, f"outlived the grader: {alive()}"
