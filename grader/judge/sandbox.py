"""The kernel's sandbox: the limits, working folder and environment a submission runs under.

The grader starts every kernel through this module
(``python -m grader.judge.sandbox LIMITS -- argv``), which sets the process's resource limits and
then ``exec``\\ s the real kernel command, so the kernel (and every process it starts, which
inherit them) runs under:

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
AOTInductor compile in 12 s instead of 27 s), and what it plants dies with its copy. The C++
extensions a notebook builds (``TORCH_EXTENSIONS_DIR``) are in the run's temporary folder too,
but start empty: a library built from a reference's source (and the source beside it) is that
reference's answer, which no kernel may hold. (Linux model:
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
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grader

#: prctl option (linux/prctl.h)
PR_SET_CHILD_SUBREAPER = 36
#: unshare(2) and mount(2) flags (linux/sched.h, linux/mount.h), prctl's PR_SET_PDEATHSIG
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
PR_SET_PDEATHSIG = 1
#: prctl(PR_CAPBSET_DROP) and the capabilities a kernel that stays root loses
#: (linux/capability.h): reading files by handle, immutable files, loading modules, raw I/O,
#: chroot, ptrace (of the judge), mount and the rest of sys_admin, reboot, device nodes
PR_CAPBSET_DROP = 24
DROPPED_CAPS = (2, 9, 16, 17, 18, 19, 21, 22, 27)
#: mounts a kernel keeps writable: the kernel's own devices and processes
_KERNEL_MOUNTS = ("/proc", "/sys", "/dev")
#: the unprivileged user a kernel runs as when the grader runs as root
KERNEL_USER = "nobody"
#: variables the kernel inherits from the grader's environment (when set); all else is dropped
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "LD_LIBRARY_PATH",
              "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


#: the kernel's message packer (``--Session.packer``): :func:`json_packer`
PACKER = "grader.judge.sandbox.json_packer"


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
    many as they choose; see :func:`kernel_env`); ``user``: the (uid, gid) it runs as (None:
    the grader's); ``hide``: paths it must not see (then it gets a mount namespace of its own,
    where they are empty and all is read-only but the folders of ``writable``; only where
    :func:`isolation` says it works)."""

    memory: int
    cpu: int
    file_size: int = 1 << 30
    threads: int | None = None
    user: tuple[int, int] | None = None
    hide: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()

    def argv(self, kernel_argv: list[str]) -> list[str]:
        """The command that starts ``kernel_argv`` under these limits (with the paths of
        ``hide`` hidden, as ``user``: see :func:`isolation`)."""
        isolated = [f"--hide={h}" for h in self.hide]
        isolated += [f"--writable={w}" for w in self.writable] if self.hide else []
        isolated += [f"--user={self.user[0]}:{self.user[1]}"] if self.user else []
        return [sys.executable, "-m", "grader.judge.sandbox", "--memory", str(self.memory),
                "--cpu", str(self.cpu), "--file-size", str(self.file_size), *isolated, "--",
                *kernel_argv]


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
    root = str(grader.ROOT)
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    tmp = home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), TMPDIR=str(tmp), IPYTHONDIR=str(home / ".ipython"),
               JUPYTER_CONFIG_DIR=str(home / ".jupyter"), MPLCONFIGDIR=str(tmp),
               TORCHINDUCTOR_CACHE_DIR=str(inductor_cache(home)),
               # C++ extensions (torch.utils.cpp_extension) build in the run's own folder, outside
               # the warm cache: a library built from a reference's source is its answer
               TORCH_EXTENSIONS_DIR=str(tmp / "torch_extensions"),
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


def kernel_user() -> tuple[int, int] | None:
    """(uid, gid) of :data:`KERNEL_USER` when this process is root and that user exists, else
    None (kernels then run as this process's user)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(KERNEL_USER)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


@dataclass(frozen=True)
class Isolation:
    """How kernels are isolated on this machine (see :func:`isolation`): ``user`` is the
    (uid, gid) they run as (None: the grader's own), ``namespace`` whether each gets a mount
    namespace of its own in which the instructor's files are hidden; ``words`` says what that
    means, for the grader's first line."""

    user: tuple[int, int] | None
    namespace: bool
    words: str


def isolation(readable: list[Path]) -> Isolation:
    """Try, once, in a child process, what this machine allows: as root, a mount and a PID
    namespace of its own (``unshare(CLONE_NEWNS | CLONE_NEWPID)``), then becoming
    :data:`KERNEL_USER` and reading each path of ``readable`` (the interpreter, torch, the
    course) as that user."""
    if os.geteuid() != 0:
        return Isolation(None, False, "kernels run as this user (the grader is not root): they "
                         "can read and write what it can; grade as root (CI, Gradescope, Slurm) "
                         "or in a container (README: Isolation) for the full wall")
    user = kernel_user()
    pid = os.fork()
    if pid == 0:  # the trial: 0 all works, 1 the user cannot read, 2 no namespace
        code = 2
        try:
            if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNS | CLONE_NEWPID) == 0:
                code = 1
                if user is not None:
                    os.setgroups([])
                    os.setgid(user[1])
                    os.setuid(user[0])
                    for path in readable:
                        with open(path, "rb"):
                            pass
                    code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    hidden = ("no other process in sight; the reference solutions, the other hand-ins, the "
              "results and the other runs' folders hidden")
    if code == 0:
        return Isolation(user, True, f"kernels run as the user {KERNEL_USER} in mount and PID "
                         f"namespaces of their own ({hidden})")
    if code == 1:
        return Isolation(None, True, f"kernels run as root in mount and PID namespaces of their "
                         f"own ({hidden}; files elsewhere readable): the user {KERNEL_USER} "
                         "cannot read the interpreter or the course here, so kernels stay root "
                         "(README: Isolation)")
    return Isolation(None, False, "kernels run as root, with nothing hidden: this machine "
                     "refuses mount and PID namespaces (README: Isolation)")


def _mount_points() -> list[str]:
    """The mount points of this process's namespace (/proc/self/mountinfo's fifth field)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        points = [line.split()[4] for line in f]
    return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p) for p in points]


def _wall(hide: list[str], writable: list[str]) -> None:
    """Enter a mount namespace of our own; there, hide each path of ``hide`` (an empty tmpfs
    over a folder, /dev/null over a file; a folder of ``writable`` inside one is put back),
    make every mount read-only but the folders of ``writable`` (the kernel's own) and /proc,
    /sys, /dev, and drop :data:`DROPPED_CAPS` from the capability bounding set, so that a kernel
    that stays root can neither undo this nor ptrace the grader. Raises OSError when the
    namespace, a hiding mount or making / read-only is refused."""
    libc = ctypes.CDLL(None, use_errno=True)

    def ok(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    cwd = os.getcwd()
    ok(libc.unshare(CLONE_NEWNS), "unshare")
    ok(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    kept = [os.open(w, os.O_PATH | os.O_DIRECTORY) for w in writable]  # (before any is hidden)
    for path in hide:
        p = os.fsencode(path)
        if os.path.isdir(path):
            ok(libc.mount(b"tmpfs", p, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=755"),
               f"hide {path}")
        elif os.path.exists(path):
            ok(libc.mount(b"/dev/null", p, None, MS_BIND, None), f"hide {path}")
    for path, fd in zip(writable, kept):  # a mount of its own, left writable below
        os.makedirs(path, exist_ok=True)  # (in a hiding tmpfs, where it was covered)
        ok(libc.mount(f"/proc/self/fd/{fd}".encode(), os.fsencode(path), None,
                      MS_BIND | MS_REC, None), f"keep {path}")
        os.close(fd)
    for point in _mount_points():
        if point.startswith(_KERNEL_MOUNTS) or any(
                point == w or point.startswith(w.rstrip("/") + "/") for w in writable):
            continue
        done = libc.mount(None, os.fsencode(point), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        if done != 0 and point == "/":
            ok(done, "make / read-only")
    for cap in DROPPED_CAPS:
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.chdir(cwd)  # (the working folder, looked up again: in its writable mount now)


def _alone(command: list[str], user: tuple[int, int] | None) -> None:
    """Run ``command`` in a PID namespace of its own, with a /proc of its own: it sees and can
    signal no process outside it (the grader's, other kernels'), and everything it starts
    dies with the namespace. PID 1 there is a bare init that reaps orphans; the kernel is this
    process's child (PID 2 there), as ``user`` when given. This process waits for it, ends the
    namespace, and exits as the kernel did (so the grader can say how it died). Signals reach
    the kernel as before: the kernel manager signals the process group, which the kernel
    shares; on SIGTERM this process dies, and the kernel with it (PR_SET_PDEATHSIG); and when
    the grader that started this process dies without stopping it (killed), it ends the
    namespace (:func:`_orphaned`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID)")
    init = os.fork()
    if init == 0:  # PID 1: reap what is left to it, until the namespace ends
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # (the group's are not its)
            signal.signal(sig, signal.SIG_IGN)
        while True:
            try:
                os.wait()
            except ChildProcessError:
                time.sleep(1)
    kernel = os.fork()
    if kernel == 0:
        try:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # (orphans stay its descendants)
            libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
            if user:
                _become(*user, command)
            os.execv(command[0], command)
        finally:
            os._exit(127)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the kernel gets it through the group)
    status = _wait(kernel, init)
    os.kill(init, signal.SIGKILL)  # (and with it every process left in the namespace)
    if os.WIFSIGNALED(status):  # die as it died
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:  # (SIGKILL has no handler to reset)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _wait(kernel: int, init: int) -> int:
    """The kernel's wait status, once it exits; or, once the grader that started this process
    is gone without stopping it (killed), end the namespace and the kernel with it, rather than
    leave a kernel that loops running until its CPU limit. (Polled ten times a second: a
    process that left its PID namespace cannot start a thread to wait on the other.)"""
    parent = os.getppid()
    while True:
        pid, status = os.waitpid(kernel, os.WNOHANG)
        if pid:
            return status
        if os.getppid() != parent:
            os.kill(init, signal.SIGKILL)
            os._exit(1)
        time.sleep(0.1)


def _become(uid: int, gid: int, command: list[str]) -> None:
    """Hand the kernel's connection file (``-f``) to ``uid`` and become ``uid``:``gid`` with
    no supplementary groups."""
    if "-f" in command[:-1]:
        os.chown(command[command.index("-f") + 1], uid, gid)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m grader.judge.sandbox",
                                     description="run a command under the grader's limits")
    parser.add_argument("--memory", type=int, required=True, help="bytes of writable memory")
    parser.add_argument("--cpu", type=int, required=True, help="CPU seconds")
    parser.add_argument("--file-size", type=int, required=True, help="bytes per file written")
    parser.add_argument("--hide", action="append", default=[],
                        help="a path to hide, in a mount namespace of its own (as root)")
    parser.add_argument("--writable", action="append", default=[],
                        help="a folder that stays writable there (the rest is read-only)")
    parser.add_argument("--user", help="uid:gid to run as (as root)")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_DATA, (args.memory, args.memory))
    # SIGXCPU at the soft limit, SIGKILL one second later if it is caught
    resource.setrlimit(resource.RLIMIT_CPU, (args.cpu, args.cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (args.file_size, args.file_size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if sys.platform == "linux":  # orphans of the kernel's children (setsid, double fork) stay
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # its descendants
    user = tuple(map(int, args.user.split(":"))) if args.user else None
    if args.hide:
        _wall(args.hide, args.writable)
        _alone(args.command, user)
    if user:
        _become(*user, args.command)
    os.execv(args.command[0], args.command)


if __name__ == "__main__":
    _main(sys.argv[1:])
