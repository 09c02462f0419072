"""The probe side of a check: what runs in the learner's kernel when an answer is judged.

A check (``labs/<lab>/checks``) is a *judge*: it runs in the grader's own process, chooses the
inputs, computes torch's answer and decides. Whenever it needs the learner's answer it asks the
kernel for a *probe*: a call of the answer (``answer(*args)``) or of a public probe function of
the lab (``answer.probe(fn, *args)``, ``fn`` defined with :func:`probe` in
``labs/<lab>/probes.py``, which builds inputs no plain data can carry, such as an autograd
graph, and reduces what the answer did to plain data). Both directions carry *plain data* only
(:func:`plain`): ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``,
``list``, ``tuple``, ``dict``, plain ``torch.Tensor``, ``torch.Size``, ``torch.dtype`` and
``torch.device``, in ``torch.save``'s format and read back with ``weights_only=True``: no code,
no object that could lie about its value. What the answer raised travels as a plain record.

This module imports nothing from the judge side: the learner's kernel holds no check it is
graded by, no expected value and no key. :func:`call` is the probe itself (the judge calls it
in-process for a self-check or a test, and :func:`serve` in the kernel when grading), so both
paths run the same code and give the same verdict.
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import pickle
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import grader
from grader.kernel.modelled import answered_by, observe

#: the most bytes a probe's reply may take (a larger one is refused as not plain data)
MAX_REPLY_BYTES = 64 << 20
#: probe functions by "module:name"
_PROBES: dict[str, Callable] = {}


def probe(fn: Callable) -> Callable:
    """Register ``fn(answer, *args) -> plain data`` as a probe. Probes live in
    ``labs/<lab>/probes.py``, which every copy of the course ships (the learner's kernel runs
    them); a probe builds what the answer needs, calls it, and returns what it observed as plain
    data, never a verdict."""
    if not fn.__module__.startswith("labs.") or not fn.__module__.endswith(".probes"):
        raise ValueError(f"probe {fn.__qualname__} is in {fn.__module__}: probes live in "
                         "labs/<lab>/probes.py")
    _PROBES[name_of(fn)] = fn
    return fn


def name_of(fn: Callable) -> str:
    """A probe's registered name: ``module:qualname``."""
    return f"{fn.__module__}:{fn.__qualname__}"


def _lookup(name: str) -> Callable:
    import importlib

    module = name.partition(":")[0]
    if module.startswith("labs.") and module.endswith(".probes"):
        importlib.import_module(module)
    if name not in _PROBES:
        raise LookupError(f"no probe {name!r} (probes live in labs/<lab>/probes.py)")
    return _PROBES[name]


# --------------------------------------------------------------------------- plain data
_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def plain(value: Any, what: str = "the value") -> str:
    """``""`` when ``value`` is plain data (see the module's docstring), else what is not, in
    words (``"result[2]['a'] is a LyingStr, a subclass of str"``). Types must be exact: a
    subclass can override ``__eq__`` or ``__torch_function__`` to lie about its contents."""
    torch = sys.modules.get("torch")  # (no tensor exists where torch was never imported)
    tensors = (torch.Tensor, torch.nn.Parameter) if torch else ()
    others = (torch.dtype, torch.device, torch.Size) if torch else ()
    stack = [(value, what)]
    seen = 0
    while stack:
        v, at = stack.pop()
        seen += 1
        if seen > 1_000_000:
            return f"{what} holds more than a million values"
        t = type(v)
        if t in _SCALARS or t in others:
            continue
        if t in (list, tuple):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))
        elif t is dict:
            for k, x in v.items():
                if type(k) not in (str, int, bool, tuple, float, type(None)):
                    return f"a key of {at} is a {type(k).__name__}: use str or int keys"
                stack.append((x, f"{at}[{k!r}]"))
        elif t in tensors:
            if v.layout != torch.strided or v.is_quantized or v.device.type == "meta":
                return f"{at} is a {v.layout} tensor on {v.device}: return a dense tensor"
        else:
            base = next((b for b in (*_SCALARS[1:], list, tuple, dict, *tensors[:1])
                         if isinstance(v, b)), None)
            sub = f", a subclass of {base.__name__}" if base is not None else ""
            return f"{at} is a {t.__qualname__}{sub}: return plain data ({_PLAIN_WORDS})"
    return ""


_PLAIN_WORDS = ("None, bool, int, float, str, list, tuple, dict, or a plain torch.Tensor, "
                "torch.Size, dtype or device")


def _detached(value: Any) -> Any:
    """``value`` with every tensor detached, moved to the CPU and made contiguous (what the
    judge compares is the value, not the graph or the storage it lives in)."""
    torch = sys.modules.get("torch")
    if torch is not None and type(value) in (torch.Tensor, torch.nn.Parameter):
        return value.detach().to("cpu").contiguous().clone()
    if type(value) in (list, tuple):
        return type(value)(_detached(x) for x in value)
    if type(value) is dict:
        return {k: _detached(x) for k, x in value.items()}
    return value


def _holds_torch(value: Any) -> bool:
    """Whether plain data ``value`` holds a tensor, Size, dtype or device."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    kinds = (torch.Tensor, torch.dtype, torch.device)  # (torch.Size is a tuple)
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, kinds) or type(v) is torch.Size:
            return True
        if type(v) in (list, tuple):
            stack.extend(v)
        elif type(v) is dict:
            stack.extend(v.values())
    return False


def encode(value: Any) -> bytes:
    """``value`` (plain data) as bytes: in ``torch.save``'s format when it holds torch's types,
    else as a pickle of Python's own containers and scalars (so a judge whose data holds no
    tensor never loads torch to read it)."""
    if not _holds_torch(value):
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    import torch

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


class _NoGlobals(pickle.Unpickler):
    """An unpickler that builds no object but Python's containers and scalars: it refuses to
    look up any class or function (the ``pickle`` documentation's *Restricting Globals*)."""

    def find_class(self, module, name):
        if (module, name) == ("builtins", "complex"):
            return complex
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def decode(data: bytes) -> Any:
    """Plain data back from :func:`encode`'s bytes: ``torch.load(weights_only=True)`` for
    torch's format (which builds no object but plain containers and tensors), :class:`_NoGlobals`
    for a pickle. Raises ValueError when ``data`` is larger than :data:`MAX_REPLY_BYTES` or not
    plain data."""
    if len(data) > MAX_REPLY_BYTES:
        raise ValueError(f"{len(data)} bytes (at most {MAX_REPLY_BYTES} are read)")
    try:
        if data[:2] == b"PK":  # torch.save's zip file
            import torch

            value = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        else:
            value = _NoGlobals(io.BytesIO(data)).load()
    except Exception as exc:
        raise ValueError(f"not plain data ({type(exc).__name__})") from None
    if why := plain(value):
        raise ValueError(why)
    return value


# --------------------------------------------------------------------------- what it raised
#: the file name of code compiled from a string (eval, exec): no line of the cell
_EVALUATED = "<string>"


def _course_dirs() -> tuple[str, ...]:
    import labs

    return (str(grader.ROOT / "grader"), *labs.__path__)


def raised(exc: BaseException) -> dict:
    """A plain record of an exception the answer (or a probe calling it) raised:
    ``ename``, ``evalue``, ``where`` (``" at line N of your cell: `<line>`"`` when it was
    raised in the learner's code, else ``""``) and ``ours`` (it was raised in a probe or the
    grader's code while reading the answer)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/lib/python" not in
              f.filename]
    own = _course_dirs()
    inner = next((f for f in reversed(frames) if f.filename != _EVALUATED), None)
    ours = inner is not None and inner.filename.startswith(own)
    where = ""
    if inner is not None and not ours:
        code = (inner.line or "").strip()
        code = code if len(code) <= 120 else code[:117] + "..."
        where = f" at line {inner.lineno} of your cell" + (f": `{code}`" if code else "")
        if frames[-1].filename == _EVALUATED:
            where += " (in the code that line evaluates)"
    return {"ename": type(exc).__name__, "evalue": str(exc)[:2000], "where": where,
            "ours": ours}


# --------------------------------------------------------------------------- torch's defaults
def state_changes() -> list[str]:
    """How torch's global state in this process differs from torch's defaults, in words (empty
    when it does not, or torch is not loaded): grad mode, inference mode, default dtype and
    device, deterministic algorithms, anomaly detection, autocast, and Python modes left active.
    (torch/csrc/autograd/grad_mode.h: GradMode; c10/core/InferenceMode.h: InferenceMode;
    torch/__init__.py: set_default_dtype, set_default_device, use_deterministic_algorithms.)"""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    found = []
    if torch.is_inference_mode_enabled():
        found.append("inference mode is on (torch.inference_mode() entered and not left)")
    elif not torch.is_grad_enabled():
        found.append("grad mode is off (torch.set_grad_enabled(False), or torch.no_grad() "
                     "entered and not left)")
    if (dtype := torch.get_default_dtype()) != torch.float32:
        found.append(f"the default dtype is {dtype} (torch.set_default_dtype or "
                     "set_default_tensor_type)")
    if (device := torch.get_default_device()).type != "cpu":
        found.append(f"the default device is {device} (torch.set_default_device)")
    if torch.are_deterministic_algorithms_enabled():
        found.append("deterministic algorithms are on (torch.use_deterministic_algorithms)")
    if torch.is_anomaly_enabled():
        found.append("anomaly detection is on (torch.autograd.set_detect_anomaly)")
    for kind in ("cpu", "cuda"):
        if torch.is_autocast_enabled(kind):
            found.append(f"autocast is on for {kind} (torch.autocast entered and not left)")
    modes = [type(m).__name__ for m in _function_modes()
             if type(m).__name__ != "DeviceContext"]  # (that one is the default device)
    modes += [type(m).__name__ for m in _dispatch_modes(torch)]
    if modes:
        found.append(f"Python modes are active ({', '.join(modes)}: a mode's __enter__ without "
                     "its __exit__)")
    return found


def _function_modes() -> list:
    from torch.overrides import _get_current_function_mode_stack

    return list(_get_current_function_mode_stack())


def _dispatch_modes(torch) -> list:
    if not torch._C._len_torch_dispatch_stack():
        return []
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())


@contextlib.contextmanager
def _no_function_modes(torch):
    """Pop every TorchFunctionMode (the default device's DeviceContext too); push them back."""
    popped = [torch._C._pop_torch_function_stack()
              for _ in range(torch._C._len_torch_function_stack())]
    try:
        yield
    finally:
        for mode in reversed(popped):
            torch._C._push_on_torch_function_stack(mode)


def started_environ() -> dict[str, str]:
    """The environment this process was started with (``/proc/self/environ``: what its parent
    gave it, whatever ``os.environ`` says since); where there is no ``/proc``, ``os.environ``."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environ)
    return {k.decode(errors="replace"): v.decode(errors="replace")
            for k, _, v in (item.partition(b"=") for item in raw.split(b"\0") if b"=" in item)}


@contextlib.contextmanager
def compiler_caches_as_started():
    """Run the body with Inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``) and Triton's
    (``TRITON_CACHE_DIR``) as this process was started with them, whatever the notebook set
    since (a Colab Drive path, a folder that cannot be made): what a check compiles stays in
    the grader's folders (the run's own, in a grading kernel). The notebook's settings are back
    afterwards. (torch/_inductor/runtime/cache_dir_utils.py: cache_dir, temporary_cache_dir.)"""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir, temporary_cache_dir

    started = started_environ()
    inductor = os.path.abspath(started.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())
    triton = started.get("TRITON_CACHE_DIR")
    now = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with contextlib.ExitStack() as stack:
        if now is not None and os.path.abspath(now) != inductor:
            stack.enter_context(temporary_cache_dir(inductor))
        if (before := os.environ.get("TRITON_CACHE_DIR")) != triton:
            stack.callback(_set_env, "TRITON_CACHE_DIR", before)
            _set_env("TRITON_CACHE_DIR", triton)
        yield


def _set_env(name: str, value: str | None) -> None:
    """``os.environ[name] = value``, or no ``name`` when value is None."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def config_changes(module) -> dict[str, Any]:
    """The entries of a torch config module (``torch._inductor.config``,
    ``torch._dynamo.config``...) that differ from their defaults, mapped to those defaults (a
    value an environment variable forces or defaults counts as the default): the body of
    ``with module.patch(config_changes(module)):`` runs with torch's own configuration, whatever
    the notebook set (a Homebrew ``cpp.cxx``, a cache setting), and the notebook's is back
    afterwards. (torch/utils/_config_module.py: ConfigModule, _ConfigEntry.)"""
    from torch.utils._config_module import _UNSET_SENTINEL

    defaults = {}
    for name, entry in module._config.items():
        if entry.alias is not None:
            continue
        if entry.env_value_force is not _UNSET_SENTINEL:
            defaults[name] = entry.env_value_force
        elif entry.env_value_default is not _UNSET_SENTINEL:
            defaults[name] = entry.env_value_default
        else:
            defaults[name] = entry.default
    now = module.get_config_copy()
    return {k: defaults[k] for k in now if k in defaults and now[k] != defaults[k]}


#: environment variables that steer torch's compilers, caches, logs, devices and process groups
#: (a name, or a prefix ending in "_"): those :func:`settings_changes` reports
SETTING_VARS = ("GLOO_", "NCCL_", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHINDUCTOR_", "TORCHDYNAMO_", "TRITON_",
                "TORCH_LOGS", "TORCH_COMPILE_DEBUG", "PYTORCH_", "CUDA_VISIBLE_DEVICES",
                "CUDA_LAUNCH_BLOCKING", "OMP_NUM_THREADS")
#: the config modules :func:`settings_changes` compares with their defaults (once imported)
SETTING_CONFIGS = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")
#: the name under which :func:`call` answers with :func:`settings_changes` (no probe runs)
SETTINGS = "grader:settings"


def settings_changes() -> list[str]:
    """How this process's settings differ from torch's defaults and from the environment it was
    started with, in words, one entry each: torch's global state (:func:`state_changes`), the
    environment variables of :data:`SETTING_VARS` set, changed or removed since
    (``"GLOO_SOCKET_IFNAME='en0' (unset when the kernel started)"``; Inductor's cache folder set
    to its default is torch's own doing, not reported), and the entries of
    :data:`SETTING_CONFIGS` that differ
    from their defaults (:func:`config_changes`: ``"torch._inductor.config.cpp.cxx =
    'clang++'"``), those a person types (:func:`_typed`). Empty when nothing differs."""
    found = []
    for part in (state_changes, _environ_changes,
                 *(functools.partial(_config_entries, label) for label in SETTING_CONFIGS)):
        try:  # (a part that cannot be read, e.g. a config entry set to a tensor, is left out)
            found += part()
        except Exception:  # noqa: BLE001
            continue
    return found


def _environ_changes() -> list[str]:
    found = []
    started, now = started_environ(), dict(os.environ)
    for name in sorted(set(started) | set(now)):
        was, value = started.get(name), now.get(name)
        if was == value or not any(name == v or v.endswith("_") and name.startswith(v)
                                   for v in SETTING_VARS):
            continue
        if name == "TORCHINDUCTOR_CACHE_DIR" and was is None and value == _inductor_default():
            continue
        said = name if re.fullmatch(r"\w+", name, re.ASCII) else _short(name)
        then = "unset" if was is None else _short(was)
        found.append(f"{said} unset (it was {then} when the kernel started)" if value is None
                     else f"{said}={_short(value)} ({then} when the kernel started)")
    return found


def set_by_hand(module) -> list[str]:
    """The names of the entries of a torch config module that differ from their defaults
    (:func:`config_changes`) and hold a value a person types (a flag, number, string, or a list
    of those), sorted: not an object or dict a library installs there (torchao's pre-grad pass,
    the metadata AOTInductor records), which a note about the notebook's settings leaves out."""
    values = module.get_config_copy()
    return [key for key in sorted(config_changes(module)) if _typed(values[key])]


def _config_entries(label: str) -> list[str]:
    if (module := sys.modules.get(label)) is None:
        return []
    values = module.get_config_copy()
    return [f"{label}.{key} = {_short(values[key])}" for key in set_by_hand(module)]


def _typed(value: Any) -> bool:
    """Whether a config value is one a person types (a flag, number, string, or a tuple or list
    of those), not an object or dict a library installs (torchao's pre-grad pass, the metadata
    AOTInductor records)."""
    if type(value) in (tuple, list):
        return all(type(v) in (bool, int, float, str) for v in value)
    return type(value) in (type(None), bool, int, float, str)


def _inductor_default() -> str | None:
    module = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    return module.default_cache_dir() if module is not None else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@contextlib.contextmanager
def torch_defaults():
    """Run the body under torch's default global state, whatever the notebook set before:
    grad mode on, inference mode off, default dtype float32 and device cpu, deterministic
    algorithms, anomaly detection and autocast off, no TorchFunctionMode or TorchDispatchMode
    active. The notebook's state is restored on exit. Probes (and checks) are written for this
    state. A no-op when torch is not loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    dtype = torch.get_default_dtype()
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    autocast = {kind: torch.is_autocast_enabled(kind) for kind in ("cpu", "cuda")}
    with contextlib.ExitStack() as stack:
        stack.enter_context(_no_function_modes(torch))
        if torch._C._len_torch_dispatch_stack():
            from torch.utils._python_dispatch import _disable_current_modes

            stack.enter_context(_disable_current_modes())
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        stack.enter_context(torch.autograd.set_detect_anomaly(False))
        try:  # (only what differs is set: use_deterministic_algorithms alone costs ~10 ms)
            if dtype != torch.float32:
                torch.set_default_dtype(torch.float32)
            if deterministic[0]:
                torch.use_deterministic_algorithms(False)
            for kind in (kind for kind, on in autocast.items() if on):
                torch.set_autocast_enabled(kind, False)
            yield
        finally:
            if dtype != torch.float32:
                torch.set_default_dtype(dtype)
            if deterministic[0]:
                torch.use_deterministic_algorithms(True, warn_only=deterministic[1])
            for kind in (kind for kind, on in autocast.items() if on):
                torch.set_autocast_enabled(kind, True)


@contextlib.contextmanager
def seeded_rng(seed: int):
    """Fork torch's global CPU RNG and seed it with ``seed`` (the learner's RNG state is left as
    it was), if torch is loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# --------------------------------------------------------------------------- the probe
def call(answer: Any, probe_name: str | None, args: tuple, kwargs: dict, seed: int,
         models: tuple[str, ...] = ()) -> bytes:
    """Run one probe: ``answer(*args, **kwargs)``, or the probe registered as ``probe_name``
    called as ``fn(answer, *args, **kwargs)``, under torch's defaults and torch's RNG seeded
    with ``seed``, observed for calls into ``models`` (:func:`grader.kernel.modelled.observe`);
    return the reply, encoded (:func:`encode`): ``{"value": plain data}``, ``{"raised":
    record}`` (:func:`raised`), ``{"unplain": why}`` (the value was not plain data) or
    ``{"modelled": record}`` (the answer ran the modelled mechanism, whatever it returned).
    Never raises for what the answer does (``KeyboardInterrupt``, the grader's time limit, is
    passed on). For ``probe_name`` :data:`SETTINGS`, the reply is :func:`settings_changes`."""
    if probe_name == SETTINGS:
        try:
            return encode({"value": settings_changes()})
        except Exception:  # noqa: BLE001  (a note the judge then leaves out)
            return encode({"value": []})
    seen: dict = {"ran": None}
    if (record := answered_by(answer, models)) is not None:
        return encode({"modelled": record})
    try:
        fn = _lookup(probe_name) if probe_name else None
        with torch_defaults(), seeded_rng(seed), observe(models, sys._getframe()) as seen:
            value = fn(answer, *args, **kwargs) if fn else answer(*args, **kwargs)
        value = _detached(value)
        why = plain(value, "what your answer gave" if fn else "the value your answer returned")
        reply = {"unplain": why} if why else {"value": value}
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: it costs this probe, not the kernel
        reply = {"raised": raised(exc)}
    if seen["ran"] is not None:
        reply = {"modelled": seen["ran"]}
    try:
        return encode(reply)
    except Exception as exc:
        return encode({"unplain": f"it could not be saved ({type(exc).__name__})"})


def serve(request: str) -> None:
    """The grader's probe cell: read the request the judge wrote at path ``request`` (plain
    data: exercise, answer name, probe, args, kwargs, seed, models, reply path), run
    :func:`call` on the answer the notebook binds under that name, and write the reply where
    the request says."""
    import __main__

    req = decode(Path(request).read_bytes())
    Path(request).unlink()
    namespace = vars(__main__)
    if req["answer"] not in namespace:
        reply = encode({"missing": req["answer"]})
    else:
        reply = call(namespace[req["answer"]], req["probe"], tuple(req["args"]),
                     dict(req["kwargs"]), req["seed"], tuple(req["models"]))
    Path(req["reply"]).write_bytes(reply)
