"""grader.kernel.strays, in this process: the threads and child processes an answer leaves
running, seen from the kernel (each is a look since the last one)."""
import subprocess
import threading
import time

import pytest

from grader.kernel import strays


@pytest.fixture(autouse=True)
def begun():
    strays.begin()


def test_threads_running_notebook_code_are_reported_once_library_threads_never():
    stop = threading.Event()

    def spin():  # defined here, like a notebook's function
        stop.wait()

    mine = threading.Thread(target=spin, name="mine")
    timer = threading.Timer(60, lambda: None)
    sleeper = threading.Thread(target=time.sleep, args=(0.5,), name="sleeper")  # a builtin
    library = threading.Thread(target=threading.Event().wait, args=(0.5,), name="library")
    for t in (mine, timer, sleeper, library):
        t.start()
    try:
        threads, procs = strays.strays()
        assert sorted(threads) == sorted(["'mine'", "'sleeper'", f"'{timer.name}'"])
        assert procs == []
        assert strays.strays() == ([], [])
    finally:
        stop.set()
        timer.cancel()


def test_child_processes_are_reported_and_killed_and_the_report_says_so(tmp_path):
    child = subprocess.Popen(["sleep", "3611"])
    report = tmp_path / "strays.txt"
    strays.report(str(report), "after its answer cells ran")
    said = report.read_text()
    # (named by its command line, or by its name when /proc gives no command line yet)
    assert f"pid {child.pid} (sleep" in said and "killed them" in said
    assert said.endswith("join the threads, wait for the processes.")
    assert child.wait(timeout=5) < 0  # killed
    strays.report(str(report), "while the checks called it")
    assert report.read_text() == ""
