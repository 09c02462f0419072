"""labs/production/viz.py: the loss curves, the memory timeline and the measured cheatsheet,
drawn headless; each picture's artists found by their gids."""
import math

import pytest

from labs.production import viz
from tests.labs._figures import by_gid, render


def test_loss_curves_mark_the_first_step_that_is_not_finite():
    fig = render(viz.loss_curves({"before": [2.0, 1.5, math.nan, math.nan], "after": [2.0, 1.4]}))
    ax = fig.axes[0]
    assert len(by_gid(ax.lines, "curve:")) == 2
    (cross,) = by_gid(ax.lines, "nonfinite:")
    assert cross.get_gid() == "nonfinite:before" and list(cross.get_xdata()) == [2]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["before (not finite from step 2)", "after"]
    with pytest.raises(ValueError):
        viz.loss_curves({})


def test_the_memory_timeline_gives_each_runs_growth():
    fig = render(viz.memory_timeline({"leak": [0, 1 << 20, 2 << 20], "fixed": [0, 0, 0]}))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["leak: +2.0 MiB over 3 steps", "fixed: +0.0 MiB over 3 steps"]
    assert len(by_gid(fig.axes[0].lines, "memory:")) == 2
    with pytest.raises(ValueError):
        viz.memory_timeline({"leak": [0]}, unit="MB")


def test_a_row_is_measured_as_a_pair_and_one_without_its_device_is_not():
    row = viz.measure_row("inference_mode", "cpu", min_run_time=0.01)
    assert row["baseline_s"] > 0 and row["faster_s"] > 0
    assert row["ratio"] == pytest.approx(row["baseline_s"] / row["faster_s"])
    assert viz.measure_row("pin_memory", "cpu")["ratio"] is None
    with pytest.raises(ValueError):
        viz.measure_row("no such row")


def test_the_cheatsheet_figure_colours_each_row_by_whether_it_holds():
    rows = [{"row": "a", "ratio": 2.0, "holds": "yes", "device": "cpu", "threads": 2},
            {"row": "b", "ratio": 0.5, "holds": "no", "device": "cpu", "threads": 2},
            {"row": "c", "ratio": None, "holds": "not measured", "device": "cpu", "threads": 2}]
    fig = render(viz.cheatsheet_figure(rows))
    bars = {b.get_gid(): b for b in by_gid(fig.axes[0].patches, "ratio:")}
    assert bars["ratio:a"].get_width() == pytest.approx(math.log10(2.0))
    assert bars["ratio:b"].get_width() < 0 and bars["ratio:c"].get_width() == 0
    assert bars["ratio:a"].get_facecolor() != bars["ratio:b"].get_facecolor()
