"""Build C++ (and CUDA) sources into operator libraries, once per source.

:func:`build` compiles a source string with ``torch.utils.cpp_extension.load`` (ninja and the
system's C++ compiler) into a shared library that registers operators through ``TORCH_LIBRARY``
and loads it into this process (``torch.ops.load_library``). It defines the macro
``TORCH_EXTENSION_NAME`` as the library's name, ``<prefix>_<key>`` (``ext_`` unless told),
where ``key`` hashes the source: a source registers its operators with
``TORCH_LIBRARY(TORCH_EXTENSION_NAME, m)`` and finds them under ``torch.ops.<that name>``.
Each version of a source so gets a namespace of its own, so an edited cell can be run again
without restarting the kernel (a loaded library cannot be unloaded, and a namespace can be
defined by one library only: ``torch/library.h: TORCH_LIBRARY``).

Builds live under ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), one folder
per name, which keeps only the library and a marker once the build succeeded: the source and
the compiler's intermediate files are deleted (a reference's source is its answer, and the
folder may be readable to others). A library already built there is loaded without running
ninja again (so a folder copied elsewhere is reused). The grader gives every submission its own,
empty folder (``grader.judge.sandbox.kernel_env``), so one learner's build never reaches
another. A failed build raises :class:`BuildError` with the compiler's errors trimmed to the
source's own lines.
(torch/utils/cpp_extension.py: load, _jit_compile, _write_ninja_file_and_build_library)
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

#: what one build may report of the compiler's errors
MAX_ERRORS = 6

#: the libraries loaded into this process, by name
_loaded: set[str] = set()
#: the builds that failed in this process, with what was said: torch's cpp_extension does not
#: compile an unchanged source twice in one process (its JIT_EXTENSION_VERSIONER), so a second
#: try would only report the library missing
_failed: dict[str, str] = {}


class BuildError(RuntimeError):
    """A source did not compile, link or load. The message quotes the compiler's errors as
    ``line N of the source: error: ...`` with the source's line, numbered as in the source
    string."""


def root() -> Path:
    """Where builds live: ``$TORCH_EXTENSIONS_DIR``, else torch's default
    (``~/.cache/torch_extensions``), in a folder ``course`` (torch/utils/cpp_extension.py:
    get_default_build_root)."""
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / "course"


def library_name(source: str, prefix: str = "ext", cuda: bool = False) -> str:
    """The name :func:`build` gives ``source``'s library and namespace: ``<prefix>_<12 hex
    digits of sha256 over the source, torch's version and whether it is CUDA>``."""
    import torch

    digest = hashlib.sha256("\0".join([source, torch.__version__, str(cuda)]).encode())
    return f"{prefix}_{digest.hexdigest()[:12]}"


def _ninja_on_path() -> None:
    """Put the ``ninja`` of the Python package of that name on PATH when none is there."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


def trim(log: str, source_path: str, source: str) -> str:
    """The compiler's ``log`` cut to the errors in ``source_path``: ``line N of the source:
    error: ...`` followed by the source's line N, at most :data:`MAX_ERRORS`; the linker's
    undefined references; the log's last lines when neither is found."""
    lines = source.splitlines()
    pattern = re.compile(re.escape(source_path) + r":(\d+):(?:\d+:)? (fatal error|error): (.*)")
    found = []
    for match in pattern.finditer(log):
        number = int(match.group(1))
        code = lines[number - 1].strip() if 0 < number <= len(lines) else ""
        found.append(f"line {number} of the source: {match.group(2)}: {match.group(3).strip()}"
                     + (f"\n    {code}" if code else ""))
    found += sorted({m.group(0).strip() for m in re.finditer(r"undefined reference to .*", log)})
    if not found:
        return "\n".join(log.strip().splitlines()[-MAX_ERRORS:])
    more = len(found) - MAX_ERRORS
    return "\n".join(found[:MAX_ERRORS] + ([f"... and {more} more"] if more > 0 else []))


def build(source: str, prefix: str = "ext", cuda: bool = False):
    """Compile ``source`` (C++; CUDA with ``cuda``) into a library named
    :func:`library_name` and load it; returns ``torch.ops.<name>``, the namespace its
    ``TORCH_LIBRARY(TORCH_EXTENSION_NAME, m)`` block defines. A source built before (in this
    process, or by anyone into this build folder) is loaded without compiling. Raises
    BuildError (what the compiler said, trimmed to the source's lines; or why loading
    failed)."""
    import torch
    from torch.utils import cpp_extension

    name = library_name(source, prefix, cuda)
    if name in _failed:
        raise BuildError(_failed[name])
    if name not in _loaded:
        folder = root() / name
        library, done = folder / f"{name}.so", folder / "built"
        if library.is_file() and done.is_file():
            try:
                torch.ops.load_library(str(library))
            except OSError as exc:
                raise BuildError(f"the library built from this source did not load: {exc}")
        else:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / (f"{name}.cu" if cuda else f"{name}.cpp")
            path.write_text(source)
            _ninja_on_path()
            try:
                cpp_extension.load(name=name, sources=[str(path)], build_directory=str(folder),
                                   is_python_module=False)
            except RuntimeError as exc:
                _failed[name] = trim(str(exc), str(path), source)
                raise BuildError(_failed[name]) from None
            except OSError as exc:  # (built, but dlopen refused it: an undefined symbol)
                _failed[name] = f"the library built from this source did not load: {exc}"
                raise BuildError(_failed[name]) from None
            done.write_text("")
            for path in folder.iterdir():  # (the source and the compiler's files go)
                if path not in (library, done) and path.is_file():
                    path.unlink(missing_ok=True)
        _loaded.add(name)
    return getattr(torch.ops, name)
