"""JupyterLab for the course (``grader lab``, ``make lab``): the learner's copies of the released
notebooks, the course's kernel and the course's JupyterLab settings.

The kernel is the environment's own Python, as a kernelspec named ``python3`` (the name every
notebook asks for) shown as "PyTorch internals (torch 2.13.0)". The settings (line numbers on,
no news prompt) are the project's, in :data:`SETTINGS`; they are written into a settings folder
of the course's own under ``build/jupyter/`` (with the kernelspec and the workspaces), so the
user's own JupyterLab settings are neither used nor changed. The browser test starts JupyterLab
the same way.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

from grader import notebook
from grader.labs import lab_ids, load_lab

#: JupyterLab settings the course ships: plugin id -> settings
SETTINGS = Path(__file__).with_name("lab_settings.json")


def display_name() -> str:
    """The kernel's name in JupyterLab: ``PyTorch internals (torch 2.13.0)``, for the
    installed torch."""
    return notebook.kernelspec(version("torch"))["display_name"]


def copy_releases(folder: Path) -> list[Path]:
    """Copy each lab's released notebook into ``folder`` unless a file of that name is already
    there (a learner's work is never overwritten); return the notebooks in lab order."""
    folder.mkdir(parents=True, exist_ok=True)
    found = []
    for lab in sorted((load_lab(i) for i in lab_ids()), key=lambda lab: lab.notebook):
        if not lab.release_path.exists():
            continue
        target = folder / lab.release_path.name
        if not target.exists():
            shutil.copyfile(lab.release_path, target)
        found.append(target)
    return found


def prepare(home: Path) -> dict[str, str]:
    """Install the course's kernelspec and settings under ``home`` (e.g. ``build/jupyter``) and
    return the environment variables that make JupyterLab use them (and keep its workspaces
    there). Settings files already there are kept: a learner's own changes stay."""
    from ipykernel.kernelspec import write_kernel_spec

    kernel = home / "share" / "jupyter" / "kernels" / "python3"
    shutil.rmtree(kernel, ignore_errors=True)
    write_kernel_spec(kernel, overrides={"display_name": display_name()})
    for plugin, values in json.loads(SETTINGS.read_text(encoding="utf-8")).items():
        package, name = plugin.split(":")
        path = home / "user-settings" / package / f"{name}.jupyterlab-settings"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values, indent=2), encoding="utf-8")
    paths = [str(home / "share" / "jupyter"), os.environ.get("JUPYTER_PATH", "")]
    return {"JUPYTER_PATH": os.pathsep.join(filter(None, paths)),
            "JUPYTERLAB_SETTINGS_DIR": str(home / "user-settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces")}


def command(notebook: Path, *extra: str) -> list[str]:
    """The command line of a JupyterLab that opens ``notebook`` (its folder as the root), in
    the browser it starts and at the URL it prints (for a browser elsewhere)."""
    root = ["--allow-root"] if hasattr(os, "getuid") and os.getuid() == 0 else []
    return [sys.executable, "-m", "jupyterlab", str(notebook),
            f"--LabApp.default_url=/lab/tree/{notebook.name}", *root, *extra]


def launch(folder: Path, home: Path, options: list[str] = ()) -> None:
    """Copy the releases into ``folder`` and replace this process with a JupyterLab on the
    first lab, given ``options`` (``jupyter lab``'s own: ``--port``, ``--no-browser``...).
    Raises GraderError when there is no released notebook."""
    from grader.errors import GraderError

    notebooks = copy_releases(folder)
    if not notebooks:
        raise GraderError("no released notebook to open: run `make release` first")
    env = os.environ | prepare(home)
    cmd = command(notebooks[0], *options)
    os.execve(cmd[0], cmd, env)
