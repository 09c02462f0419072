"""labs/production/probes.py: run, the case runner every production exercise and its checks
use: a script's main(config) in a forked process, its result, its failure with the script's
line, its output, and bounds that always end it (time: the whole process group; memory)."""
import os
import signal
import time

import pytest

from labs.production.probes import Case, run

SCRIPT = """
import os
import signal
import sys
import time


def main(config):
    print("out", config["n"])
    print("err", file=sys.stderr)
    if config.get("raise"):
        raise ValueError("bad step")
    if config.get("spawn"):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        with open(config["pidfile"], "w") as f:
            f.write(str(pid))
        time.sleep(60)
    if config.get("daemon"):
        if os.fork() == 0:  # a session of its own: out of the run's process group
            os.setsid()
            with open(config["pidfile"], "w") as f:
                f.write(str(os.getpid()))
            time.sleep(60)
            os._exit(0)
        while not os.path.getsize(config["pidfile"]):
            time.sleep(0.01)
    if config.get("allocate"):
        import torch
        torch.empty(config["allocate"], dtype=torch.uint8).fill_(1)
    if config.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    return {"twice": config["n"] * 2}
"""


def test_a_run_returns_what_main_returned_and_what_it_printed():
    r = run(SCRIPT, {"n": 21}, filename="demo.py")
    assert (r.status, r.result, r.error, r.line) == ("ok", {"twice": 42}, "", None)
    assert r.stdout == "out 21\n" and "err" in r.stderr
    assert r.peak_rss_bytes > 0 and 0 < r.seconds < 30


def test_a_script_that_raises_reports_the_error_and_its_own_line():
    r = run(SCRIPT, {"n": 1, "raise": True}, filename="demo.py")
    assert r.status == "raised" and r.error == "ValueError: bad step" and r.line == 12
    assert 'File "demo.py", line 12, in main' in r.stderr and "raise ValueError" in r.stderr


def test_a_timeout_kills_the_run_and_every_process_it_started(tmp_path):
    pidfile = tmp_path / "pid"
    start = time.monotonic()
    r = run(SCRIPT, {"n": 1, "spawn": True, "pidfile": str(pidfile)}, timeout_s=1.0)
    assert r.status == "timeout" and "1 s" in r.error
    assert time.monotonic() - start < 10
    grandchild = int(pidfile.read_text())
    for _ in range(100):  # (killed: gone once init reaps it)
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"process {grandchild} the run started is still alive")


def test_a_daemon_that_left_the_runs_process_group_is_killed_when_the_run_ends(tmp_path):
    pidfile = tmp_path / "pid"
    pidfile.write_text("")
    r = run(SCRIPT, {"n": 1, "daemon": True, "pidfile": str(pidfile)})
    assert r.status == "ok", r.stderr
    daemon = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):  # (killed and reaped by the runner)
        os.kill(daemon, 0)


def test_memory_beyond_the_bound_fails_the_run_not_the_caller():
    r = run(SCRIPT, {"n": 1, "allocate": 1 << 30}, memory_bytes=256 << 20)
    assert r.status == "raised" and "can't allocate memory" in r.error


def test_a_run_killed_by_a_signal_died():
    r = run(SCRIPT, {"n": 1, "kill": True})
    assert r.status == "died" and r.error == f"killed by {signal.SIGKILL.name}"


def test_a_source_that_does_not_compile_runs_nothing():
    with pytest.raises(SyntaxError):
        run("def main(config):\n    return (", {})


def test_a_case_runs_its_own_script_with_its_settings_and_what_is_laid_over_them():
    case = Case("nan", {"steps": 3})
    assert "def main(config" in case.source and case.filename == "nan.py"
    echo = "def main(config):\n    return config\n"
    assert case.run(echo, {"extra": 1}).result == {"steps": 3, "extra": 1}


def test_the_runner_counts_dynamos_graphs_and_shows_warnings_on_stderr():
    """Counted in the run's process (not taken from the script's result); a warning reaches the
    run's stderr although pytest records warnings in this process."""
    script = (
        "import warnings\nimport torch\n\n\ndef main(config):\n"
        "    warnings.warn('careful now')\n"
        "    f = torch.compile(lambda x: x * config['k'], backend='eager')\n"
        "    for k in range(config['n']):\n"
        "        f(torch.ones(2) * k)\n"
        "    return {}\n"
    )
    r = run(script, {"k": 2, "n": 3})
    assert (r.status, r.graphs) == ("ok", 1), r.stderr
    assert "UserWarning: careful now" in r.stderr


def test_the_runner_samples_how_far_the_heap_rose_while_main_ran():
    """A tensor held until main returns (then freed) is seen by the runner's samples."""
    script = ("import time\nimport torch\n\n\ndef main(config):\n"
              "    held = [torch.ones(config['n'], dtype=torch.uint8) for _ in range(4)]\n"
              "    time.sleep(0.05)\n    return {'held': len(held)}\n")
    big, small = run(script, {"n": 16 << 20}), run(script, {"n": 16})
    assert big.heap_growth_bytes >= 60 << 20 > small.heap_growth_bytes, (big, small)
