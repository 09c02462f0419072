"""A learner's session in a real browser: JupyterLab (started as ``make lab`` starts it, on a free
loopback port with a token) and Debian's ``chromium`` driven by Playwright's Python package
(``executable_path``: never a browser download). The released lab 1 notebook is opened, run
top to bottom, a hint is revealed, the reference answer of one exercise is typed into its answer
cell, and that exercise's check then passes and the progress display counts it. Lab 2 then
opens on a kernel of its own, the course's, and saved at once it keeps its kernelspec and cells
(JupyterLab adds the kernel's language_info, as it does to any notebook).

Screenshots are written to ``build/browser/`` (CI keeps them as artifacts). Skipped, with the
reason, where ``chromium`` or Playwright is missing (``.ci/run`` installs chromium).
"""
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from grader import notebook
from grader.errors import GraderError
from grader.lab import command, copy_releases, display_name, prepare
from grader.labs import load_lab
from tests.conftest import ROOT

CHROMIUM = shutil.which("chromium")
SHOTS = ROOT / "build" / "browser"
#: the flags that keep chromium quiet, local and headless (see platform-notes)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get "
                       "install chromium; .ci/run installs it)"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")


@pytest.fixture
def jupyterlab(tmp_path):
    """(base URL, token) of a JupyterLab on the learner's copies of the releases in
    ``tmp_path/work``, with the course's kernel and settings under ``tmp_path/home``."""
    copy_releases(tmp_path / "work")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = os.environ | prepare(tmp_path / "home")
    first = load_lab("dispatcher").release_path.name
    log = open(tmp_path / "jupyterlab.log", "w")
    server = subprocess.Popen(
        command(tmp_path / "work" / first, "--no-browser", "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}"),
        env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (
                    (tmp_path / "jupyterlab.log").read_text()[-3000:])
                time.sleep(0.2)
        yield url, token
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _kernels_once_open(url: str, token: str, name: str) -> dict:
    """The server's sessions' kernels by notebook file name, once one for ``name`` exists (60 s
    at most)."""
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(f"{url}/api/sessions?token={token}") as reply:
            kernels = {s["path"].rsplit("/", 1)[-1]: s["kernel"] for s in json.load(reply)}
        if name in kernels or time.monotonic() > deadline:
            return kernels
        time.sleep(0.2)


def _outputs(cell):
    return cell.locator(".jp-OutputArea-output")


def test_a_learner_runs_the_lab_reads_a_hint_and_passes_an_exercise(jupyterlab, tmp_path):
    url, token = jupyterlab
    lab = load_lab("dispatcher")
    first = lab.exercises[0]
    answer = "\n".join(notebook.code_of(
        notebook.read(ROOT / "solutions" / f"{lab.notebook}.ipynb"), "answer", first.id))
    SHOTS.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(60_000)
        page.goto(f"{url}/lab/tree/{lab.release_path.name}?token={token}")
        # the notebook opens directly (no launcher), on the course's kernel, line numbers on
        page.get_by_text(f"{display_name()} | Idle").wait_for()
        assert page.locator(".jp-Launcher").count() == 0
        assert page.locator(".cm-lineNumbers").count() > 0

        page.locator(".lm-MenuBar-itemLabel", has_text="Run").click()
        page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
        stubs = page.locator(".jp-OutputArea-output", has_text="is still the stub")
        stubs.nth(len(lab.exercises) - 1).wait_for()  # the last check has run
        page.get_by_text(f"{display_name()} | Idle").wait_for()
        assert stubs.count() == len(lab.exercises)
        assert page.locator(".jp-OutputArea-output", has_text="✗ error").count() >= len(
            lab.exercises)
        assert page.locator(".jp-mod-outputsScrolled, .jp-OutputArea-output pre",
                            has_text="Traceback").count() == 0
        # (images, widget views and display updates render after the kernel is idle: wait)
        page.locator(".jp-RenderedImage img").nth(2).wait_for(state="attached")  # pictures
        explorers = page.locator(".jp-OutputArea-output .widget-dropdown select")
        explorers.nth(1).wait_for(state="attached")  # the view explorer and the TLS explorer
        failing = "".join(rf"✗ error\s*{re.escape(e.id)}.*" for e in lab.exercises)
        progress = page.locator(".jp-OutputArea-output", has_text=re.compile(failing, re.S))
        progress.nth(1).wait_for(state="attached")  # both progress tables updated
        page.screenshot(path=SHOTS / "1-run-all.png")
        explorers.first.scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        explorers.first.locator("xpath=ancestor::div[contains(@class, 'jp-OutputArea')][1]"
                                ).screenshot(path=SHOTS / "5-view-explorer.png")

        button = page.get_by_role("button", name="Show hint 1 of").first
        button.scroll_into_view_if_needed()
        button.click()
        page.locator(".jp-OutputArea-output", has_text="Hint 1 of").first.wait_for()
        page.get_by_role("button", name="Show hint 2 of").wait_for()
        page.screenshot(path=SHOTS / "2-hint.png")

        cells = page.locator(".jp-CodeCell")
        cell = cells.filter(has_text=f'NotImplementedError("{first.id}")').first
        cell.scroll_into_view_if_needed()
        cell.locator(".cm-content").click()
        page.keyboard.press("Control+A")
        page.keyboard.insert_text(answer)
        page.keyboard.press("Shift+Enter")  # runs the answer cell, selects its check cell
        page.keyboard.press("Shift+Enter")  # runs the check
        check = cells.filter(has_text=f'check("{first.id}")').first
        _outputs(check).filter(has_text="✓ passed").wait_for()
        assert "hidden check" in _outputs(check).first.text_content()
        here = [e for e in lab.exercises if not e.unmet("cpu")]
        said = f"1 of {len(here)} exercises pass their public checks"
        page.locator(".jp-OutputArea-output", has_text=said).nth(1).wait_for(state="attached")
        check.screenshot(path=SHOTS / "3-pass.png")
        top = cells.filter(has_text=f'progress("{lab.id}")').first
        top.scroll_into_view_if_needed()
        page.wait_for_timeout(300)  # (cells scrolled into view render on the next frame)
        top.screenshot(path=SHOTS / "4-progress.png")

        # the next lab opens unmodified, on a kernel of its own: the course's
        second = load_lab("autograd").release_path.name
        page.goto(f"{url}/lab/tree/{second}?token={token}")
        kernels = _kernels_once_open(url, token, second)  # (the status bar may still show lab 1)
        page.get_by_text(f"{display_name()} | Idle").wait_for()
        saved = tmp_path / "work" / second
        before, written = notebook.read(saved), saved.stat().st_mtime_ns
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=second).click()
        page.keyboard.press("Control+s")
        deadline, after = time.monotonic() + 30, None
        while after is None:
            assert time.monotonic() < deadline, "lab 2 was not saved"
            time.sleep(0.2)
            if saved.stat().st_mtime_ns != written:
                try:
                    after = notebook.read(saved)
                except GraderError:  # (read while the server was writing it: an empty file)
                    continue
        assert after.metadata.kernelspec == before.metadata.kernelspec  # not rewritten
        assert [(c.id, c.source) for c in after.cells] == [(c.id, c.source) for c in before.cells]
        assert kernels[second]["name"] == "python3"
        assert kernels[second]["id"] != kernels[lab.release_path.name]["id"]
        browser.close()
    assert time.monotonic() - start < 120
