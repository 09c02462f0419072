"""The kernel's sandbox: the limits, working folder and environment a submission runs under.

The grader starts every kernel through this module (``python -m grader.sandbox LIMITS -- argv``),
which sets the process's resource limits and then ``exec``\\ s the real kernel command, so the
kernel (and every process it starts, which inherit them) runs under:

- ``RLIMIT_DATA``: its writable memory (heap, ``mmap``'d tensors, thread stacks), in bytes. A
  larger allocation fails in the kernel (``MemoryError``, or torch's "can't allocate memory")
  instead of the machine swapping; the grader reports it as ``crashed``: out of memory. Unlike
  ``RLIMIT_AS`` it leaves address-space reservations alone (CUDA reserves terabytes of them).
  GPU memory is not covered.
- ``RLIMIT_CPU``: CPU seconds; past it the kernel gets ``SIGXCPU`` and dies (a backstop for a
  runaway child process; the wall-clock limits of each exercise act first).
- ``RLIMIT_FSIZE``: the largest file it may write, in bytes (past it, ``write`` fails).
- ``RLIMIT_CORE`` 0: a crash leaves no core file behind.

On Linux the kernel is also a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, kept
across ``exec``): a process its code starts and detaches (``setsid``, a double fork) stays its
descendant, so the grader can find and stop it.

:func:`kernel_env` is the environment the kernel starts with: an allow-list, so nothing of the
grader's own environment (tokens, CI secrets) reaches the submission. Compiler caches are one per
submission: Inductor's (``TORCHINDUCTOR_CACHE_DIR``, which holds its FX graph cache, its C++
kernels, its precompiled headers and Triton's cache) is inside the run's own temporary folder,
so nothing one submission plants there is read while grading another, and it is deleted with
the run. It starts as a copy of its lab's *warm* cache, which only the course's own reference
solutions write (:func:`warm_cache`, :func:`keep_warm_cache`): a learner's kernel does not
compile again what the reference compiled (lab 4 graded in 37 s instead of 47 s here; lab 6's
AOTInductor compile in 12 s instead of 27 s), and what it plants dies with its copy. (Linux model:
``man 2 setrlimit``; jupyter_client's ``KernelManager.format_kernel_cmd`` builds the command.)
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import pwd
import re
import resource
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

#: prctl option (linux/prctl.h)
PR_SET_CHILD_SUBREAPER = 36
#: variables the kernel inherits from the grader's environment (when set); all else is dropped
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "LD_LIBRARY_PATH",
              "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


#: the kernel's message packer (``--Session.packer``): :func:`json_packer`
PACKER = "grader.sandbox.json_packer"


def json_packer(obj) -> bytes:
    """jupyter_client's JSON message packer (``jupyter_client.session.json_packer``), except
    that text UTF-8 cannot hold (a lone surrogate a notebook printed, ``'\\ud800'``) becomes
    U+FFFD instead of failing in the kernel's output thread, which would print a traceback of
    the kernel's own (with its installation paths) into the learner's output."""
    from jupyter_client.jsonutil import json_default
    from jupyter_client.session import json_packer as packer

    try:
        return packer(obj)
    except UnicodeEncodeError:
        text = json.dumps(obj, default=json_default, ensure_ascii=False, allow_nan=False)
        # (UTF-16 with surrogatepass pairs what can be paired; what cannot becomes U+FFFD)
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf8")


@dataclass(frozen=True)
class Limits:
    """What one kernel may use: ``memory`` bytes of writable memory, ``cpu`` CPU seconds,
    ``file_size`` bytes per file written, ``threads`` CPU threads for its libraries (None: as
    many as they choose; see :func:`kernel_env`)."""

    memory: int
    cpu: int
    file_size: int = 1 << 30
    threads: int | None = None

    def argv(self, kernel_argv: list[str]) -> list[str]:
        """The command that starts ``kernel_argv`` under these limits."""
        return [sys.executable, "-m", "grader.sandbox", "--memory", str(self.memory),
                "--cpu", str(self.cpu), "--file-size", str(self.file_size), "--", *kernel_argv]


def inductor_cache(home: Path) -> Path:
    """The kernel's Inductor cache (``TORCHINDUCTOR_CACHE_DIR``) under its ``home``: the folder
    Inductor would choose by default in the kernel's TMPDIR (``torchinductor_<user>``), where it
    keeps its precompiled headers whatever TORCHINDUCTOR_CACHE_DIR says (AOTInductor's is a
    147 MB .gch), so the warm cache holds them too
    (torch/_inductor/runtime/cache_dir_utils.py: default_cache_dir; codecache.py: _HEADER_DIR).
    The kernel has no USER or LOGNAME, so its user is the password database's."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = f"uid_{os.getuid()}"
    return home / "tmp" / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def warm_cache(home: Path, warm: Path) -> None:
    """Start the kernel's Inductor cache under ``home`` as a copy of the warm cache ``warm``
    (nothing when there is none, or it cannot be read whole: grading then compiles cold)."""
    if warm.is_dir():
        try:
            shutil.copytree(warm, inductor_cache(home), symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error):
            shutil.rmtree(inductor_cache(home), ignore_errors=True)


def keep_warm_cache(home: Path, warm: Path) -> None:
    """Add what the Inductor cache of a kernel under ``home`` holds (it started from ``warm``)
    to the warm cache ``warm``: call it only after running the course's own reference
    solution. Files already there are kept (the cache is content-addressed: a key names one
    content); each new file appears whole (written beside, then renamed), so reference runs at
    once (``--jobs``) add to it without losing each other's entries, and a kernel copying it
    meanwhile never reads half a file."""
    cache = inductor_cache(home)
    if not cache.is_dir():
        return

    def add(src: str, dst: str) -> None:
        if not os.path.lexists(dst):
            part = f"{dst}.{os.getpid()}.part"
            shutil.copy2(src, part, follow_symlinks=False)
            os.replace(part, dst)

    try:
        shutil.copytree(cache, warm, symlinks=True, dirs_exist_ok=True, copy_function=add)
    except (OSError, shutil.Error):
        pass  # (a warm cache that misses an entry costs a compile, nothing else)


def kernel_env(home: Path, threads: int | None = None) -> dict[str, str]:
    """The kernel's environment: the allow-listed variables, plus ``home`` as its home, with
    its temporary folder, IPython/Jupyter/matplotlib configuration and Inductor's cache inside
    (so no one's startup files or caches are used, and nothing is written elsewhere by
    default). ``threads``: the CPU threads its libraries may use, the cores over the kernels
    that run at once (``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``, unless the grader's own
    environment sets them; ``TORCHINDUCTOR_COMPILE_THREADS``, Inductor's compile workers: with 1
    it compiles in the kernel, without starting a pool of worker processes)."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    tmp = home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), TMPDIR=str(tmp), IPYTHONDIR=str(home / ".ipython"),
               JUPYTER_CONFIG_DIR=str(home / ".jupyter"), MPLCONFIGDIR=str(tmp),
               TORCHINDUCTOR_CACHE_DIR=str(inductor_cache(home)),
               PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1",
               # Inductor keeps its precompiled header (a 147 MB .gch) under TMPDIR, not in its
               # cache: built again in every run's own TMPDIR it costs more than it saves, and
               # its path, part of every C++ kernel's cache key, would make the warm cache miss
               TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS="0")
    if threads:
        env.setdefault("OMP_NUM_THREADS", str(threads))
        env.setdefault("MKL_NUM_THREADS", str(threads))
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    return env


def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m grader.sandbox",
                                     description="run a command under the grader's limits")
    parser.add_argument("--memory", type=int, required=True, help="bytes of writable memory")
    parser.add_argument("--cpu", type=int, required=True, help="CPU seconds")
    parser.add_argument("--file-size", type=int, required=True, help="bytes per file written")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_DATA, (args.memory, args.memory))
    # SIGXCPU at the soft limit, SIGKILL one second later if it is caught
    resource.setrlimit(resource.RLIMIT_CPU, (args.cpu, args.cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (args.file_size, args.file_size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if sys.platform == "linux":  # orphans of the kernel's children (setsid, double fork) stay
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # its descendants
    os.execv(args.command[0], args.command)


if __name__ == "__main__":
    _main(sys.argv[1:])
