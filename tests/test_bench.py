"""tools/bench.py (make bench): its measurements, statistics, batch and verdicts, on cheap
commands (a whole bench takes most of an hour: README, "Performance")."""
import importlib.util
import sys

import pytest

from grader.judge.batch import find_submissions
from grader.labs import load_lab
from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("bench", ROOT / "tools" / "bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_measure_times_a_command_and_samples_its_peak_memory():
    m = bench.measure([sys.executable, "-c", "import time; b = bytearray(300 << 20); "
                       "b[::4096] = b'x' * len(b[::4096]); time.sleep(0.6)"])
    assert m["rc"] == 0 and m["wall_s"] >= 0.6
    assert 300 <= m["grader_rss_mib"] < 600 and m["kernel_rss_mib"] == 0
    with pytest.raises(RuntimeError, match="exited with 3"):
        bench.measure([sys.executable, "-c", "raise SystemExit(3)"])


def test_spread_is_the_median_and_range_of_the_runs():
    assert bench.spread([3.0, 1.0, 2.5]) == {"median": 2.5, "min": 1.0, "max": 3.0,
                                             "runs": [3.0, 1.0, 2.5]}


def test_the_batch_is_one_hand_in_per_learner_none_of_them_the_reference(tmp_path):
    lab = load_lab("toy")
    bench.make_batch(tmp_path, lab, 3)
    subs = find_submissions([str(tmp_path)])
    assert [s.learner for s in subs] == ["learner01", "learner02", "learner03"]
    reference = (lab.root / "solutions" / f"{lab.notebook}.ipynb").read_bytes()
    assert all(s.path.read_bytes() != reference for s in subs)


def _results(ratio: float, speedup: float, course_s: float) -> dict:
    s = lambda v: bench.spread([v])  # noqa: E731
    return {"repeat": 1, "batch_lab": "autograd", "whole_course": True,
            "labs": {"toy": {"papermill_s": s(10.0), "grader_s": s(10.0 * ratio),
                             "ratio": s(ratio), "grader_rss_mib": 1, "kernel_rss_mib": 2}},
            "course": {"notebooks": 1, "jobs_1_s": s(course_s), "jobs_2_s": s(course_s),
                       "speedup": s(1.0), "grader_rss_mib": 1, "kernel_rss_mib": 2},
            "batch": {"notebooks": 12, "jobs_1_s": s(10.0 * speedup), "jobs_2_s": s(10.0),
                      "speedup": s(speedup), "grader_rss_mib": 1, "kernel_rss_mib": 2},
            "cpu_scaling": {"alone_s": s(2.0), "together_s": s(2.1), "ceiling": s(1.9)}}


def test_each_target_is_met_or_missed_with_its_figure():
    met = bench.verdicts(_results(1.05, 1.8, 200))
    assert [line.split(": ")[1].split()[0] for line in met] == ["met"] * 3
    assert "toy 1.05" in met[0] and "(1.80×; " in met[1] and "(200 s)" in met[2]
    assert "1.90× as fast as one" in met[1]
    missed = bench.verdicts(_results(1.2, 1.5, 400))
    assert [line.split(": ")[1].split()[0] for line in missed] == ["MISSED"] * 3
    assert len(bench.tables(_results(1.2, 1.5, 400))) == 3
    part = bench.verdicts(_results(1.05, 1.8, 400) | {"whole_course": False})
    assert part[2].endswith(": not judged: --labs chose 1 of the labs (400 s)")


def test_cpu_scaling_times_one_loop_alone_then_two_at_once(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "SPIN", "import time; time.sleep(0.3)")  # sleeps scale fully
    b = bench.Bench(2, tmp_path, bench.Console(quiet=True))
    s = bench.cpu_scaling(b)
    assert s["alone_s"]["min"] >= 0.3 and s["together_s"]["min"] >= 0.3
    assert len(s["ceiling"]["runs"]) == 2 and 1.5 < s["ceiling"]["median"] <= 2.1
    monkeypatch.setattr(bench, "SPIN", "raise SystemExit(1)")
    with pytest.raises(RuntimeError, match="loop failed"):
        bench.cpu_scaling(b)
