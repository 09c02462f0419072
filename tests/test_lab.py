"""`grader lab` (make lab): the learner's copies, the course's kernelspec and settings."""
import json
import sys
from pathlib import Path

import pytest

from grader.lab import SETTINGS, command, copy_releases, display_name, prepare
from grader.labs import lab_ids, load_lab


def test_releases_are_copied_in_lab_order_and_a_learners_copy_is_never_overwritten(tmp_path):
    mine = tmp_path / load_lab("dispatcher").release_path.name
    mine.write_text("my work")
    copied = copy_releases(tmp_path)
    assert copied[0] == mine and mine.read_text() == "my work"
    names = [p.name for p in copied]
    assert names == sorted(names) and len(names) == len(lab_ids())  # toy included (tests)


def test_the_kernel_is_this_python_named_for_the_course(tmp_path):
    env = prepare(tmp_path)
    spec = json.loads((tmp_path / "share/jupyter/kernels/python3/kernel.json").read_text())
    assert spec["display_name"] == display_name() == "PyTorch internals (torch 2.13.0)"
    assert spec["argv"][0] == sys.executable
    assert env["JUPYTER_PATH"].split(":")[0] == str(tmp_path / "share/jupyter")


def test_the_courses_settings_are_written_once_so_a_learners_changes_stay(tmp_path):
    env = prepare(tmp_path)
    tracker = (tmp_path / "user-settings/@jupyterlab/notebook-extension/"
               "tracker.jupyterlab-settings")
    assert env["JUPYTERLAB_SETTINGS_DIR"] == str(tmp_path / "user-settings")
    assert json.loads(tracker.read_text())["codeCellConfig"]["lineNumbers"] is True
    news = (tmp_path / "user-settings/@jupyterlab/apputils-extension/"
            "notification.jupyterlab-settings")
    assert json.loads(news.read_text())["fetchNews"] == "false"
    tracker.write_text('{"codeCellConfig": {"lineNumbers": false}}')
    prepare(tmp_path)
    assert "false" in tracker.read_text()
    assert len(json.loads(SETTINGS.read_text())) == 2


def test_jupyterlab_opens_the_notebook_itself(tmp_path):
    cmd = command(tmp_path / "01_dispatcher.ipynb", "--no-browser")
    assert cmd[:3] == [sys.executable, "-m", "jupyterlab"]
    assert cmd[3] == str(tmp_path / "01_dispatcher.ipynb") and cmd[-1] == "--no-browser"
    assert "--LabApp.default_url=/lab/tree/01_dispatcher.ipynb" in cmd  # the URL printed


def test_grader_lab_hands_jupyter_lab_s_own_options_to_it(tmp_path, monkeypatch):
    """`grader lab work -- --port 8890 --no-browser`: port, token, browser as jupyter lab takes
    them."""
    import grader.lab
    from grader.cli import main

    launched = []
    monkeypatch.setattr(grader.lab, "launch", lambda *a: launched.append(a))
    options = ["--port", "8890", "--no-browser", "--IdentityProvider.token=secret"]
    assert main(["lab", str(tmp_path), "--home", str(tmp_path / "j"), "--", *options]) == 0
    assert main(["lab", str(tmp_path), *options]) == 0
    assert launched == [(tmp_path, tmp_path / "j", options),
                        (tmp_path, Path("build/jupyter"), options)]
    assert main(["lab", str(tmp_path)]) == 0 and launched[-1][2] == []
    with pytest.raises(SystemExit):  # (other commands still refuse what they do not know)
        main(["timings", str(tmp_path), str(tmp_path), "--port", "1"])
