"""Run All, as a learner does it in JupyterLab (tests/test_run_twice.py: and Run All again).

Each lab's released notebook, untouched, runs top to bottom in one kernel with no error in any
cell: a demo cell that needs an unwritten answer says what it will show and goes on (the
releases test_labs_end_to_end grades whole are checked there, in the same way, and those of
HEAVY, which test_run_twice runs twice, there). A cell that
takes long says so in the markdown before it, in seconds.

The kernel is started as the grader starts one (``grader.judge.sandbox.kernel_env``: its own
home, the lab's warm Inductor cache), in a folder of its own, but with the session's folder of
C++ extensions (tests/conftest.py: EXTENSIONS). That folder is made under the system's temporary
folder, as a grading's run folder is, not under pytest's: a kernel's TMPDIR holds
multiprocessing's sockets (a DataLoader's workers send their batches through one), whose paths
may not exceed 107 bytes, and pytest's folders under an xdist worker are too deep for that
(lab 8's loader cells waited forever for batches that could not be sent)."""
import copy
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from grader import notebook
from grader.judge.grade import warm_cache_dir
from grader.judge.sandbox import kernel_env, warm_cache
from grader.labs import lab_ids, load_lab
from tests.conftest import EXTENSIONS, ROOT
from tests.test_labs_end_to_end import STUBS_GRADED_WHOLE

LABS = [lab for lab in lab_ids() if load_lab(lab).root == ROOT]
#: the labs whose references take longest to run (their checks compile, export, start ranks or
#: run every case script) and whose answer cells register nothing a second run could trip on:
#: their releases run twice instead (tests/test_run_twice.py), and their references are run
#: whole where they are graded (tests/test_labs_end_to_end.py)
HEAVY = ("compile", "distributed", "export", "production")


#: seconds a cell may take in a first pass without saying so in the markdown before it ("takes
#: 15 to 30 seconds"): twice the course's ~10 s, for a machine busy with the rest of the tests
UNANNOUNCED_S = 20.0
#: run after the notebook: the course's own cells leave no setting a failing check would name
SETTINGS_UNCHANGED = ("from grader.kernel.probe import settings_changes\n"
                      "assert not settings_changes(), settings_changes()")


def run_all(path, lab, passes: int) -> list[tuple]:
    """Every code cell of the notebook at ``path`` in order, ``passes`` times over, in one
    kernel, then :data:`SETTINGS_UNCHANGED`. Returns the errors: ``(pass, cell id, exception
    name, first line of its value)``, and ``(1, cell id, "unannounced", seconds)`` for a cell
    that took more than :data:`UNANNOUNCED_S` whose markdown before it says nothing of
    seconds."""
    short = Path(tempfile.mkdtemp(prefix="run-all-"))
    try:
        return _run_all(path, short, lab, passes)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _run_all(path, folder: Path, lab, passes: int) -> list[tuple]:
    home, work = folder / "home", folder / "work"
    (home / "probe").mkdir(parents=True)
    work.mkdir()
    warm_cache(home, warm_cache_dir(lab))
    nb = notebook.read(path)
    client = NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=600,
                            resources={"metadata": {"path": str(work)}})
    errors, said = [], ""
    # (lab 7's C++ builds: the session's, built once; see tests/conftest.py: EXTENSIONS)
    env = kernel_env(home) | {"TORCH_EXTENSIONS_DIR": str(EXTENSIONS)}
    with client.setup_kernel(env=env, cwd=str(work)):
        for n in range(1, passes + 1):
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    said = cell.source
                    continue
                cell = cell if n == 1 else copy.deepcopy(cell)
                start = time.monotonic()
                client.execute_cell(cell, index)
                took = time.monotonic() - start
                if n == 1 and took > UNANNOUNCED_S and "seconds" not in said:
                    errors.append((n, cell.id, "unannounced", round(took)))
                errors += [(n, cell.id, o.get("ename"), str(o.get("evalue", "")).split("\n")[0])
                           for o in cell.outputs if o.get("output_type") == "error"]
        nb.cells.append(last := nbformat.v4.new_code_cell(SETTINGS_UNCHANGED))
        client.execute_cell(last, len(nb.cells) - 1)
        errors += [(passes, last.id, o.get("ename"), o.get("evalue")) for o in last.outputs
                   if o.get("output_type") == "error"]
    return errors


@pytest.mark.parametrize("lab_id", [lab for lab in LABS  # (HEAVY's releases: test_run_twice)
                                    if lab not in STUBS_GRADED_WHOLE and lab not in HEAVY])
def test_run_all_of_the_release_raises_nowhere(lab_id):
    lab = load_lab(lab_id)
    assert run_all(ROOT / "notebooks" / f"{lab.notebook}.ipynb", lab, 1) == []
