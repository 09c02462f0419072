"""The modules lab's probes: what runs in the learner's kernel when an exercise is judged (see
``grader.kernel.probe``). Each builds what an answer needs from plain parameters (a model tree
from a spec, parameter groups and gradients from a seed, a dataset, a traced graph, a profiler
trace), calls the answer, and returns what it observed as plain data; the judges in
``labs/modules/checks`` build the same things in the grader's process with the same builders
(defined here, public), ask torch for its answer and decide. Nothing here knows a right
answer."""

from __future__ import annotations

import functools

from grader.checks import probe

# ================================================================ modules.mini-module
#: a model tree, as plain data: ``{"params": [[name, shape or None]], "buffers": [[name, shape,
#: persistent]], "children": [[name, tree or {"same_as": path}]], "calls": [child names, in the
#: order forward calls them]}``; the root may add ``"ties": [[param path, new path]]`` (the
#: second name is bound to the root's Parameter).


@functools.lru_cache(maxsize=8)
def tree_class(base: type) -> type:
    """A module class on ``base`` (``nn.Module`` or the learner's ``Module``) whose forward
    calls its children in its spec's order, then adds the mean of each of its parameters and
    buffers and takes tanh: every parameter gets a gradient, and a hook that changes a value
    changes the output. When ``base`` has a list ``events``, each forward appends
    ``["forward", its path]`` to it."""
    import torch

    class Tree(base):
        def __init__(self, calls):
            super().__init__()
            self.calls = list(calls)  # a plain attribute: neither parameter, buffer nor module

        def forward(self, x):
            if getattr(type(self), "events", None) is not None:
                type(self).events.append(["forward", self.path])
            for name in self.calls:
                x = getattr(self, name)(x)
            for name in self.own:
                value = getattr(self, name)
                if value is not None:
                    x = x + value.mean()
            return torch.tanh(x)

    Tree.__qualname__ = Tree.__name__ = f"Tree({base.__name__})"
    return Tree


def _at(root, path: str):
    for part in filter(None, path.split(".")):
        root = getattr(root, part)
    return root


def build_tree(base: type, spec: dict, seed: int):
    """The model ``spec`` describes, built on ``base`` by attribute assignment (parameters,
    modules), ``register_buffer`` and ``register_parameter(name, None)``, its values drawn from
    a generator seeded with ``seed``. Returns ``(root, {path: module})`` (each module under the
    path it was root built at)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    made: dict = {}

    def make(node: dict, path: str):
        if "same_as" in node:
            return made[node["same_as"]]
        m = tree_class(base)(node.get("calls", []))
        own = []
        for name, shape in node.get("params", []):
            if shape is None:
                m.register_parameter(name, None)
            else:
                setattr(m, name, torch.nn.Parameter(torch.randn(shape, generator=gen)))
            own.append(name)
        for name, shape, persistent in node.get("buffers", []):
            m.register_buffer(name, torch.randn(shape, generator=gen), persistent=persistent)
            own.append(name)
        object.__setattr__(m, "own", own)
        object.__setattr__(m, "path", path)
        made[path] = m
        for name, child in node.get("children", []):
            setattr(m, name, make(child, f"{path}.{name}" if path else name))
        return m

    root = make(spec, "")
    for source, target in spec.get("ties", []):
        owner, _, name = target.rpartition(".")
        setattr(_at(root, owner), name, _at(root, source))
    return root, made


def _try(fn, *args):
    """``fn(*args)`` as plain data, or ``{"raised": type name, "text": message}``."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001  (what the answer raised is an observation)
        return {"raised": type(exc).__name__, "text": str(exc)[:500]}


def _names(pairs) -> list:
    return [name for name, _ in pairs]


def observe_tree(base: type, spec: dict, seed: int, loaded: dict, x) -> dict:
    """What a model built on ``base`` does, as plain data: the routing of each module's
    attributes, ``named_*`` traversals, ``state_dict``, loading ``loaded`` (a state dict of
    another model of the same spec) strictly and not, a call with forward hooks, and
    assignments that must be refused or re-routed. Each entry is the value or what raised."""
    import torch

    root, made = build_tree(base, spec, seed)
    seen: dict = {}

    def routing():
        out = {}
        for path, m in made.items():
            d = vars(m)
            out[path or "<root>"] = {
                "params": sorted(d.get("_parameters", {}) or {}),
                "buffers": sorted(d.get("_buffers", {}) or {}),
                "modules": sorted(d.get("_modules", {}) or {}),
                "in __dict__": sorted(n for n in m.own if n in d),
            }
        return out

    seen["routing"] = _try(routing)
    seen["named_parameters"] = _try(lambda: _names(root.named_parameters()))
    seen["named_parameters(prefix='model', recurse=False)"] = _try(
        lambda: _names(root.named_parameters(prefix="model", recurse=False))
    )
    seen["named_parameters(remove_duplicate=False)"] = _try(
        lambda: _names(root.named_parameters(remove_duplicate=False))
    )
    seen["named_buffers"] = _try(lambda: _names(root.named_buffers()))
    seen["named_modules"] = _try(lambda: _names(root.named_modules()))
    seen["parameters"] = _try(lambda: [p.detach().clone() for p in root.parameters()])
    seen["state_dict"] = _try(
        lambda: [[k, v.detach().clone()] for k, v in root.state_dict().items()]
    )
    # loading: every key, then one missing and one unexpected, not strictly and strictly
    keys = list(loaded)

    def load(sd, strict):
        result = root.load_state_dict(sd, strict=strict)
        return [list(result[0]), list(result[1])]

    seen["load_state_dict(strict=True)"] = _try(load, dict(loaded), True)
    seen["state_dict after loading"] = _try(
        lambda: [[k, v.detach().clone()] for k, v in root.state_dict().items()]
    )
    if keys:
        odd = {k: v for k, v in loaded.items() if k != keys[-1]}
        odd["extra.weight"] = torch.zeros(1)
        seen["load_state_dict(strict=False) missing one key, one unexpected"] = _try(
            load, odd, False
        )
        seen["load_state_dict(strict=True) missing one key, one unexpected"] = _try(
            load, odd, True
        )
        bad = dict(loaded)
        bad[keys[0]] = torch.zeros(7, 1, 3)
        seen["load_state_dict(strict=True) a tensor of another shape"] = _try(load, bad, True)
    # a call with hooks: a pre-hook that doubles the input, a hook removed again, a forward
    # hook that adds 1, a forward hook that only records
    log: list = []

    def call():
        handles = [
            root.register_forward_pre_hook(lambda m, args: log.append("pre") or (args[0] * 2,)),
            root.register_forward_hook(lambda m, args, out: log.append("removed")),
            root.register_forward_hook(lambda m, args, out: log.append("add") or out + 1),
            root.register_forward_hook(lambda m, args, out: log.append(f"saw {len(args)}")),
        ]
        handles[1].remove()
        out = root(x).detach().clone()
        handles[0].remove()
        again = root(x).detach().clone()
        return [out, again, log]

    seen["call with hooks"] = _try(call)
    name = next((n for n, s in spec.get("params", []) if s is not None), None)

    def refused():
        out = []
        if name is not None:
            out.append(_try(setattr, root, name, torch.zeros(2)))  # a plain tensor: TypeError
            setattr(root, name, None)  # None keeps the name a parameter
            out.append(name in vars(root)["_parameters"] and getattr(root, name) is None)
        out.append(_try(getattr, root, "no_such_attribute"))
        return out

    seen["assignments"] = _try(refused)

    def rerouted():
        out = []
        children = [n for n, _ in spec.get("children", [])]
        if children:
            delattr(root, children[0])
            out.append(sorted(vars(root)["_modules"]))
        root.note = 3  # a plain attribute, then a module under the same name
        out.append([vars(root).get("note"), "note" in vars(root)["_modules"]])
        root.note = base()
        out.append(["note" in vars(root), "note" in vars(root)["_modules"]])
        buffers = [n for n, _, _ in spec.get("buffers", [])]
        if buffers:  # a Parameter over a buffer's name: the buffer goes, the parameter comes
            setattr(root, buffers[0], torch.nn.Parameter(torch.zeros(1)))
            out.append(
                [buffers[0] in vars(root)["_buffers"], buffers[0] in vars(root)["_parameters"]]
            )
        return out

    seen["reassignment and deletion"] = _try(rerouted)
    return seen


@probe
def module_tree(Module, spec: dict, seed: int, loaded: dict, x):
    """:func:`observe_tree` on the learner's ``Module``."""
    return observe_tree(Module, spec, seed, loaded, x)


# ================================================================ modules.hook-order
#: the hooks of a run, as plain data: ``[{"label", "kind" (forward_pre, forward, backward_pre,
#: backward), "on" (a module's path, "" for the root, or None for a global hook on every
#: module), "prepend" (module hooks only)}]``, registered in the list's order
HOOK_KINDS = ("forward_pre", "forward", "backward_pre", "backward")


def traced_run(spec: dict, hooks: list, seed: int) -> list:
    """The events of a real run of ``spec`` (built on ``nn.Module``) with ``hooks``: forward
    on an input that requires grad, then backward of the output's sum. Returns ``[[label or
    "forward", module path], ...]`` in the order they happened (a module built once and called
    under two paths is named by the root). Global hooks are removed again, whatever raises."""
    import torch
    from torch.nn.modules import module as nn_module

    log: list = []
    logged = type("Logged", (torch.nn.Module,), {"events": log})
    root, made = build_tree(logged, spec, seed)
    glob = {
        "forward_pre": nn_module.register_module_forward_pre_hook,
        "forward": nn_module.register_module_forward_hook,
        "backward_pre": nn_module.register_module_full_backward_pre_hook,
        "backward": nn_module.register_module_full_backward_hook,
    }
    handles = []

    def recorder(label):
        return lambda module, *rest: log.append([label, module.path])

    try:
        for h in hooks:
            fn = recorder(h["label"])
            if h["on"] is None:
                handles.append(glob[h["kind"]](fn))
                continue
            m = _at(root, h["on"])
            register = {
                "forward_pre": m.register_forward_pre_hook,
                "forward": m.register_forward_hook,
                "backward_pre": m.register_full_backward_pre_hook,
                "backward": m.register_full_backward_hook,
            }[h["kind"]]
            handles.append(register(fn, prepend=h["prepend"]))
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        root(x).sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    return log


# ================================================================ modules.foreach-adamw
# An AdamW case, as plain data: {"seed", "groups": [{"shapes", "dtypes" ("float32" or
# "float64"), and any of ADAMW_GROUP_KEYS}], "options": constructor keywords (lr, betas, eps,
# weight_decay, amsgrad, maximize), "steps", "none": per step, the flat indices of the
# parameters whose grad is None}, plus "resume": {"after", "params", "state_dict"} for a case
# that continues, at step `after`, from a real AdamW's state_dict and parameters.

#: the hyperparameters a group of an AdamW case may set for itself
ADAMW_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay")


def adamw_params(case: dict) -> list[list]:
    """The parameters of an AdamW ``case``, one list per group: leaves of the group's shapes and
    dtypes, drawn from ``case["seed"]``."""
    import torch

    g = torch.Generator().manual_seed(case["seed"])
    return [
        [
            torch.randn(shape, generator=g, dtype=getattr(torch, dtype)).requires_grad_()
            for shape, dtype in zip(group["shapes"], group["dtypes"])
        ]
        for group in case["groups"]
    ]


def _betas(options: dict) -> dict:
    return {k: tuple(v) if k == "betas" else v for k, v in options.items()}


def adamw_param_groups(case: dict, params: list[list]) -> list[dict]:
    """The parameter groups of ``case`` for an optimizer's constructor."""
    return [
        {"params": ps, **_betas({k: v for k, v in g.items() if k in ADAMW_GROUP_KEYS})}
        for g, ps in zip(case["groups"], params)
    ]


def adamw_options(case: dict) -> dict:
    """The constructor's keywords of ``case`` (betas as a tuple)."""
    return _betas(case.get("options", {}))


def adamw_grads(case: dict, flat: list, step: int) -> None:
    """Give the parameters ``flat`` (groups in order) their gradients of ``step`` (0-based),
    drawn from the case's seed and the step; None for the indices in ``case["none"][step]``."""
    import torch

    g = torch.Generator().manual_seed(case["seed"] * 1009 + step + 1)
    none = set(case["none"][step]) if step < len(case.get("none", [])) else set()
    for i, p in enumerate(flat):
        grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        p.grad = None if i in none else grad


def _state_value(value):
    """A value of an optimizer's state as plain data (a tensor detached and copied; a number as
    it is; anything else named by its type)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if type(value) in (bool, int, float):
        return value
    return f"<a {type(value).__name__}>"


def adamw_snapshot(opt, flat: list) -> dict:
    """``{"params": the parameters' values, "state": for each, its entries in the optimizer's
    state ({} where it has none)}``, in the order of ``flat``."""
    state = opt.state
    entries = [state.get(p) or {} for p in flat]
    return {
        "params": [p.detach().clone() for p in flat],
        "state": [{str(k): _state_value(v) for k, v in dict(e).items()} for e in entries],
    }


def adamw_steps(make, case: dict, keep=None) -> list[dict]:
    """Run ``case`` on the optimizer ``make(param_groups, **options)`` builds (resumed from the
    case's state_dict when it has one) and return the snapshot after each step, from the first
    one run to ``case["steps"]``. ``keep``: a list that receives the optimizer and the flat
    parameters."""
    import torch

    params = adamw_params(case)
    flat = [p for ps in params for p in ps]
    resume = case.get("resume")
    if resume:
        with torch.no_grad():
            for p, value in zip(flat, resume["params"]):
                p.copy_(value)
    opt = make(adamw_param_groups(case, params), **adamw_options(case))
    if resume:
        opt.load_state_dict(resume["state_dict"])
    if keep is not None:
        keep.extend([opt, flat])
    snapshots = []
    for step in range(resume["after"] if resume else 0, case["steps"]):
        adamw_grads(case, flat, step)
        opt.step()
        snapshots.append(adamw_snapshot(opt, flat))
    return snapshots


@probe
def foreach_adamw(ForeachAdamW, cases: list) -> list:
    """For each case, the snapshots after each of its steps (:func:`adamw_steps`) of the
    answer's optimizer."""
    return [adamw_steps(ForeachAdamW, case) for case in cases]


#: what reads a number out of a tensor (``step.item()``): not counted as arithmetic
ADAMW_READS = ("aten._local_scalar_dense.default",)


@probe
def foreach_adamw_ops(ForeachAdamW, sizes: list) -> list:
    """For each ``n`` of ``sizes``: the operators (name -> calls) that the third step() of the
    answer's optimizer runs on one group of ``n`` float32 parameters (its state made by the
    first), counted by a TorchDispatchMode."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls[str(func)] += 1
            return func(*args, **(kwargs or {}))

    found = []
    for n in sizes:
        case = {"seed": n, "groups": [{"shapes": [[3]] * n, "dtypes": ["float32"] * n}],
                "options": {"lr": 0.01}, "steps": 3}
        flat = [p for ps in adamw_params(case) for p in ps]
        opt = ForeachAdamW(adamw_param_groups(case, [flat]), **adamw_options(case))
        for step in range(case["steps"]):
            adamw_grads(case, flat, step)
            if step < case["steps"] - 1:
                opt.step()
                continue
            with Count() as count:
                opt.step()
        found.append(dict(count.calls))
    return found


# ================================================================ modules.loader
# A loader case, as plain data: {"seed", "n", "batch_size", "shuffle", "num_workers",
# "drop_last", "prefetch_factor" (given to the loader only with workers), "generator" (a seed
# for a torch.Generator, or None), "init" (pass worker_init), "epochs", "sleep": {index: ms},
# "fail": an index or None, "error": the name of what it raises (LOADER_ERRORS), "abandon":
# drop the iterator after that many batches}.

#: how long a case may run before the probe stops it (seconds)
LOADER_DEADLINE = 10.0
#: how long the workers of a dropped iterator have to exit before the probe kills them
LOADER_GRACE = 1.0
#: what the probe's worker_init records in the process it runs in (-1: none ran there)
WORKER = {"id": -1}


class UnreadableItem(Exception):
    """What the loader dataset raises at its ``fail`` index when asked for this type."""


#: what the loader dataset may raise, by name
LOADER_ERRORS = {e.__name__: e for e in (ValueError, KeyError, ZeroDivisionError, UnreadableItem)}


class LoaderItems:
    """The map-style dataset of a loader case: item ``i`` is ``{"index": i, "torch": two numbers
    from torch's generator, "random": one from Python's random, "worker": WORKER["id"]}``, drawn
    in the process that fetches it (a worker draws from its own seeded generators). It sleeps
    ``sleep[i]`` ms first, and at index ``fail`` raises ``error`` instead."""

    def __init__(self, n: int, sleep: dict | None = None, fail: int | None = None,
                 error: str = "ValueError"):
        self.n, self.sleep, self.fail, self.error = n, dict(sleep or {}), fail, error

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        import random
        import time

        import torch

        i = int(i)
        if i in self.sleep:
            time.sleep(self.sleep[i] / 1000)
        if i == self.fail:
            raise LOADER_ERRORS[self.error](f"item {i} of the dataset is unreadable")
        return {"index": i, "torch": torch.rand(2), "random": random.random(),
                "worker": WORKER["id"]}


def worker_init(worker_id: int) -> None:
    """The loader cases' worker_init_fn: records ``worker_id`` and draws from the worker's
    generators, so that what the dataset draws afterwards shows whether it ran after seeding."""
    import random

    import torch

    WORKER["id"] = worker_id
    torch.rand(worker_id + 1)
    random.random()


def loader_dataset(case: dict) -> LoaderItems:
    """The dataset of ``case``."""
    sleep = {int(k): v for k, v in (case.get("sleep") or {}).items()}
    return LoaderItems(case["n"], sleep, case.get("fail"), case.get("error", "ValueError"))


def loader_kwargs(case: dict) -> dict:
    """The keywords a loader is built with for ``case`` (prefetch_factor only with workers, as
    DataLoader wants it)."""
    import torch

    kwargs = {k: case[k] for k in ("batch_size", "shuffle", "num_workers", "drop_last")
              if k in case}
    if case.get("num_workers") and "prefetch_factor" in case:
        kwargs["prefetch_factor"] = case["prefetch_factor"]
    if case.get("generator") is not None:
        kwargs["generator"] = torch.Generator().manual_seed(case["generator"])
    if case.get("init"):
        kwargs["worker_init_fn"] = worker_init
    return kwargs


def descendants() -> set[int]:
    """The processes alive below this one (Linux: read from /proc; elsewhere the children
    multiprocessing knows). Zombies, which have exited, are not alive."""
    import os

    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        import multiprocessing

        return {p.pid for p in multiprocessing.active_children()}
    parent = {}
    for name in names:
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[0] not in ("Z", "X"):
            parent[int(name)] = int(fields[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def reap(before: set[int], grace: float = LOADER_GRACE) -> int:
    """Wait up to ``grace`` seconds for the processes started below this one since ``before``
    to exit (collecting garbage once, if they have not after 50 ms); kill those still alive,
    and return how many there were."""
    import gc
    import os
    import signal
    import time

    start = time.monotonic()
    collected = False
    while (left := descendants() - before) and time.monotonic() < start + grace:
        if not collected and time.monotonic() > start + 0.05:
            gc.collect()  # (an iterator left in a reference cycle; ~50 ms, so only then)
            collected = True
        time.sleep(0.01)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    for pid in left:
        try:
            os.waitpid(pid, 0)
        except OSError:  # (not this process's child: its own parent reaps it)
            pass
    return len(left)


class LoaderStuck(BaseException):
    """A loader case ran past :data:`LOADER_DEADLINE` (a BaseException, so that an answer's
    ``except Exception`` does not take it for a dataset's error)."""


class Deadline:
    """Raise LoaderStuck in this thread after ``seconds`` (where signals can: the main
    thread)."""

    def __init__(self, seconds: float):
        import signal
        import threading

        self.seconds, self.before = seconds, None
        self.armed = threading.current_thread() is threading.main_thread() and hasattr(
            signal, "setitimer")

    def __enter__(self):
        import signal

        if self.armed:
            self.before = signal.signal(signal.SIGALRM, self._stuck)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc) -> None:
        import signal

        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.before)

    @staticmethod
    def _stuck(signum, frame):
        raise LoaderStuck


def run_loader_case(make, case: dict) -> dict:
    """Build ``make(dataset, **keywords)`` for ``case`` with torch's and Python's generators
    seeded from the case, take ``len()``, and iterate it for the case's epochs (dropping the
    iterator after ``abandon`` batches, or where it raised). Returns ``{"len", "epochs":
    [{"batches", "raised": a record of what it raised, or None}], "leftover": how many
    processes it started were still alive after the loader and its iterators were dropped
    (killed since), "stuck": whether it ran past the deadline}``. The generators are given
    back as they were."""
    import random
    import warnings

    import torch

    from grader.checks import raised

    python_rng = random.getstate()
    before = descendants()
    WORKER["id"] = -1
    out: dict = {"len": None, "epochs": [], "leftover": 0, "stuck": False}
    try:
        with Deadline(LOADER_DEADLINE), torch.random.fork_rng(devices=[]), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(case["seed"])
            random.seed(case["seed"])
            loader = make(loader_dataset(case), **loader_kwargs(case))
            out["len"] = len(loader)
            for _ in range(case.get("epochs", 1)):
                epoch: dict = {"batches": [], "raised": None}
                out["epochs"].append(epoch)
                try:
                    it = iter(loader)
                    for batch in it:
                        epoch["batches"].append(batch)
                        if len(epoch["batches"]) == case.get("abandon"):
                            break
                except NotImplementedError:
                    raise
                except Exception as exc:  # noqa: BLE001  (what the judge compares)
                    epoch["raised"] = raised(exc)
                    # (its traceback holds the iterator in a cycle of frames: dropped, the
                    # iterator goes now, while its queues still work, not in a later
                    # gc.collect() that finalizes the queues first)
                    exc.__traceback__ = None
                it = None
                if epoch["raised"] or case.get("abandon"):
                    break
            loader = None
    except LoaderStuck:
        out["stuck"] = True
    finally:
        random.setstate(python_rng)
        out["leftover"] = reap(before)
    return out


@probe
def loader_runs(MiniLoader, cases: list) -> list:
    """For each case, what :func:`run_loader_case` saw of the answer's loader."""
    return [run_loader_case(MiniLoader, case) for case in cases]


# ================================================================ modules.fx-pass
#: a model for fold_batchnorm, as plain data: ``["seq", [layer, ...]]`` (an ``nn.Sequential``;
#: a layer may itself be a ``["seq", [...]]``) or ``["graph", {name: layer}, steps]`` (a module
#: whose forward runs ``steps``, each ``[out, what, *ins]``: ``what`` is a layer's name, ``"add"``
#: or ``"relu"`` (``torch.relu``), applied to the values named ``ins`` (``"x"`` is the input);
#: it returns the last step's value). A layer: ``["conv1d" | "conv2d", in, out, kernel, bias]``
#: (padding 1), ``["linear", in, out, bias]``, ``["bn1d" | "bn2d", features, eps, affine]``,
#: ``["relu"]`` or ``["flatten"]``.


def fold_layer(spec: list):
    """The ``nn`` module of one layer spec (see above)."""
    from torch import nn

    kind = spec[0]
    if kind in ("conv1d", "conv2d"):
        conv = nn.Conv1d if kind == "conv1d" else nn.Conv2d
        return conv(spec[1], spec[2], spec[3], padding=1, bias=spec[4])
    if kind == "linear":
        return nn.Linear(spec[1], spec[2], bias=spec[3])
    if kind in ("bn1d", "bn2d"):
        bn = nn.BatchNorm1d if kind == "bn1d" else nn.BatchNorm2d
        return bn(spec[1], eps=spec[2], affine=spec[3])
    if kind == "relu":
        return nn.ReLU()
    if kind == "flatten":
        return nn.Flatten()
    if kind == "seq":
        return nn.Sequential(*[fold_layer(s) for s in spec[1]])
    raise ValueError(f"no fold_batchnorm layer {kind!r}")


@functools.lru_cache(maxsize=None)
def _steps_class() -> type:
    import torch
    from torch import nn

    class Steps(nn.Module):
        """Named layers and a forward that runs ``steps`` (see ``fold_model``)."""

        def __init__(self, layers: dict, steps: list):
            super().__init__()
            for name, spec in layers.items():
                setattr(self, name, fold_layer(spec))
            self.steps = [list(s) for s in steps]  # a plain attribute

        def forward(self, x):
            values = {"x": x}
            for out, what, *ins in self.steps:
                if what == "add":
                    values[out] = values[ins[0]] + values[ins[1]]
                elif what == "relu":
                    values[out] = torch.relu(values[ins[0]])
                else:
                    values[out] = getattr(self, what)(values[ins[0]])
            return values[self.steps[-1][0]]

    return Steps


def fold_model(spec: list, state: dict | None = None):
    """The model of ``spec`` (see above) in eval mode, with ``state`` loaded when given."""
    model = fold_layer(spec) if spec[0] == "seq" else _steps_class()(spec[1], spec[2])
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def fold_statistics(model, g) -> dict:
    """Give each BatchNorm of ``model`` running statistics and affine parameters drawn from
    the generator ``g`` (variances from 0.2 to 2.7), and return the model's state dict."""
    import torch
    from torch import nn

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(n, generator=g) * 2.5 + 0.2)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(n, generator=g) * 0.5)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def fx_nodes(graph) -> list:
    """Each node of an FX ``graph`` as ``[op, target]`` (a function target by its qualified
    name, ``torch.fx.node._get_qualified_name``)."""
    from torch.fx.node import _get_qualified_name

    return [[n.op, _get_qualified_name(n.target) if callable(n.target) else str(n.target)]
            for n in graph.nodes]


def batchnorm_targets(gm) -> list:
    """The targets of ``gm``'s call_module nodes that call a BatchNorm."""
    from torch import nn

    modules = dict(gm.named_modules())
    return [n.target for n in gm.graph.nodes if n.op == "call_module"
            and isinstance(modules.get(n.target), nn.modules.batchnorm._BatchNorm)]


def _fx_error(exc: BaseException) -> dict:
    """``{"ename", "text"}`` of an exception torch or the answer raised."""
    return {"ename": type(exc).__name__, "text": str(exc).strip()[:1500]}


def _fx_quiet():
    """stderr kept from the learner's output: a GraphModule that raises prints its generated
    code there (torch/fx/graph_module.py: _WrappedCall), and the judge says what went wrong."""
    import contextlib
    import io

    return contextlib.redirect_stderr(io.StringIO())


@probe
def folded(fold_batchnorm, spec: list, state: dict, xs: list) -> dict:
    """``fold_batchnorm(gm)`` on ``gm = torch.fx.symbolic_trace(fold_model(spec, state))``.
    Returns ``{"type": the returned object's class name, "graph_module": whether it is a
    GraphModule, "passed_in": {"changed": state entries of gm that changed, "graph": whether
    gm's nodes changed}}`` and, for a GraphModule, ``"lint"`` (None or ``{"ename", "text"}``),
    ``"batchnorms"`` (the BatchNorms its nodes call), ``"held"`` (every BatchNorm submodule it
    holds, in named_modules order), ``"stale"`` (its code is not its graph's),
    ``"layers"`` ({target: {"type", "weight", "bias" or None}} of the Conv and Linear modules
    its nodes call) and ``"outputs"`` (its output on each x, or ``{"error"}``)."""
    import torch
    from torch import nn

    gm = torch.fx.symbolic_trace(fold_model(spec, state))
    before = {k: v.detach().clone() for k, v in gm.state_dict().items()}
    nodes = fx_nodes(gm.graph)
    got = fold_batchnorm(gm)
    after = gm.state_dict()
    changed = sorted(k for k in set(before) | set(after) if k not in before or k not in after
                     or not torch.equal(before[k], after[k]))
    out = {"type": type(got).__name__, "graph_module": isinstance(got, torch.fx.GraphModule),
           "passed_in": {"changed": changed, "graph": fx_nodes(gm.graph) != nodes}}
    if not out["graph_module"]:
        return out
    try:
        got.graph.lint()
        out["lint"] = None
    except Exception as exc:  # noqa: BLE001  (lint's message says what is broken)
        out["lint"] = _fx_error(exc)
        return out
    modules = dict(got.named_modules())
    out.update(batchnorms=batchnorm_targets(got),
               held=[k for k, m in modules.items()
                     if isinstance(m, nn.modules.batchnorm._BatchNorm)],
               stale=got.code != got.graph.python_code("self").src, layers={}, outputs=[])
    for n in got.graph.nodes:
        m = modules.get(n.target) if n.op == "call_module" else None
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear)):
            bias = getattr(m, "bias", None)
            out["layers"][n.target] = {
                "type": type(m).__name__, "weight": m.weight.detach().clone(),
                "bias": bias.detach().clone() if isinstance(bias, torch.Tensor) else None}
    with torch.no_grad(), _fx_quiet():
        for x in xs:
            try:
                y = got(x)
                out["outputs"].append(y.detach() if type(y) is torch.Tensor
                                      else {"type": type(y).__name__})
            except Exception as exc:  # noqa: BLE001  (the judge says what was wrong)
                out["outputs"].append({"error": _fx_error(exc)})
    return out


# ================================================================ modules.mini-tracer
#: the steps a model to trace is made of, each changing ``h`` (batch, width) into a value of
#: the same shape, and the Python each runs (``s<i>`` is step i's own submodule)
TRACE_STEPS = {
    "linear": "h = self.s<i>(h)  # nn.Linear",
    "sequential": "h = self.s<i>(h)  # nn.Sequential(nn.Linear, nn.ReLU)",
    "nested": "h = self.s<i>(h)  # nn.Sequential(nn.Sequential(nn.Linear, nn.Tanh), "
              "nn.LayerNorm)",
    "block": "h = self.s<i>(h)  # Gate: self.fc(h) * self.gate + h",
    "scale": "h = h * self.scale",
    "shift": "h = h - self.shift  # a buffer",
    "relu": "h = torch.relu(h)",
    "gelu": "h = F.gelu(h)",
    "softmax": "h = F.softmax(h, dim=-1)",
    "center": "h = h - h.mean(-1, keepdim=True)",
    "tanh": "h = h.tanh()",
    "rsub": "h = 1.0 - h",
    "rmul": "h = 2 * h",
    "neg": "h = -h",
    "matmul": "h = h @ self.mix",
    "halves": "h = torch.cat([h[:, :2], h[:, 2:] * 0.5], dim=1)",
    "flinear": "h = F.linear(h, self.mix, self.scale)",
    "transpose": "h = h.t().contiguous().t()",
}


@functools.lru_cache(maxsize=None)
def _tracer_classes() -> tuple:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Gate(nn.Module):
        """A module of no torch.nn namespace: symbolic_trace traces through it."""

        def __init__(self, width: int):
            super().__init__()
            self.fc = nn.Linear(width, width)
            self.gate = nn.Parameter(torch.ones(width))

        def forward(self, h):
            return self.fc(h) * self.gate + h

    class Steps(nn.Module):
        """``forward(x, y)`` (``h = x + y`` when ``two_inputs``, else ``h = x``) runs
        ``steps`` (names of TRACE_STEPS) on ``h`` and returns it."""

        def __init__(self, width: int, steps: list, two_inputs: bool):
            super().__init__()
            self.steps, self.two_inputs = list(steps), two_inputs
            self.scale = nn.Parameter(torch.ones(width))
            self.mix = nn.Parameter(torch.eye(width))
            self.register_buffer("shift", torch.zeros(width))
            for i, step in enumerate(self.steps):
                layer = {"linear": lambda: nn.Linear(width, width),
                         "sequential": lambda: nn.Sequential(nn.Linear(width, width), nn.ReLU()),
                         "nested": lambda: nn.Sequential(
                             nn.Sequential(nn.Linear(width, width), nn.Tanh()),
                             nn.LayerNorm(width)),
                         "block": lambda: Gate(width)}.get(step)
                if layer is not None:
                    setattr(self, f"s{i}", layer())

        def forward(self, x, y):
            h = x + y if self.two_inputs else x
            for i, step in enumerate(self.steps):
                if step in ("linear", "sequential", "nested", "block"):
                    h = getattr(self, f"s{i}")(h)
                elif step == "scale":
                    h = h * self.scale
                elif step == "shift":
                    h = h - self.shift
                elif step == "relu":
                    h = torch.relu(h)
                elif step == "gelu":
                    h = F.gelu(h)
                elif step == "softmax":
                    h = F.softmax(h, dim=-1)
                elif step == "center":
                    h = h - h.mean(-1, keepdim=True)
                elif step == "tanh":
                    h = h.tanh()
                elif step == "rsub":
                    h = 1.0 - h
                elif step == "rmul":
                    h = 2 * h
                elif step == "neg":
                    h = -h
                elif step == "matmul":
                    h = h @ self.mix
                elif step == "halves":
                    h = torch.cat([h[:, :2], h[:, 2:] * 0.5], dim=1)
                elif step == "flinear":
                    h = F.linear(h, self.mix, self.scale)
                elif step == "transpose":
                    h = h.t().contiguous().t()
                else:
                    raise ValueError(f"no step {step!r}")
            return h

    return Gate, Steps


def tracer_model(spec: list, state: dict | None = None):
    """The model of ``spec``: ``["steps", width, steps, two_inputs]`` (a module whose
    ``forward(x, y)`` runs TRACE_STEPS) or ``["sequential", width]`` (an ``nn.Sequential`` of
    Linear, Gate, ReLU and ``nn.Sequential(LayerNorm, Linear)``: the root itself a container),
    in eval mode, with ``state`` loaded when given (else torch's initialisation; the scale,
    mix and shift drawn from torch's RNG)."""
    import torch
    from torch import nn

    Gate, Steps = _tracer_classes()
    width = spec[1]
    if spec[0] == "steps":
        model = Steps(width, spec[2], spec[3])
        with torch.no_grad():
            model.scale.copy_(torch.rand(width) + 0.5)
            model.mix.add_(torch.randn(width, width) * 0.3)
            model.shift.copy_(torch.randn(width))
    elif spec[0] == "sequential":
        model = nn.Sequential(nn.Linear(width, width), Gate(width), nn.ReLU(),
                              nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width)))
    else:
        raise ValueError(f"no model to trace {spec[0]!r}")
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def _fx_arg(value, index: dict):
    """An FX node argument as plain data: a node as ``"%<its position>"``, a container
    item by item, a slice as ``{"slice": [start, stop, step]}``, anything else its repr."""
    import torch

    if isinstance(value, torch.fx.Node):
        return f"%{index.get(value, '?')}"
    if isinstance(value, (list, tuple)):
        return [_fx_arg(v, index) for v in value]
    if isinstance(value, dict):
        return {str(k): _fx_arg(v, index) for k, v in value.items()}
    if isinstance(value, slice):
        return {"slice": [_fx_arg(v, index) for v in (value.start, value.stop, value.step)]}
    return repr(value)[:200]


def fx_calls(graph) -> list:
    """Each node of an FX ``graph`` as ``[op, target, args, kwargs]``: fx_nodes' op and
    target, and the arguments as plain data (``_fx_arg``: nodes by position)."""
    index = {n: i for i, n in enumerate(graph.nodes)}
    return [[op, target, _fx_arg(list(n.args), index), _fx_arg(dict(n.kwargs), index)]
            for (op, target), n in zip(fx_nodes(graph), graph.nodes)]


@probe
def traced(trace, spec: list, state: dict, inputs: list) -> dict:
    """``graph = trace(model)`` on ``model = tracer_model(spec, state)``. Returns ``{"type":
    the returned object's class name, "graph": whether it is a torch.fx.Graph}`` and, for a
    Graph, ``"nodes"`` (fx_calls), ``"outputs"`` (``torch.fx.GraphModule(model, graph)``
    called on each argument list of ``inputs``: a tensor, ``{"type"}``, or ``{"error"}``, which
    also stands for the GraphModule that could not be built)."""
    import torch

    model = tracer_model(spec, state)
    graph = trace(model)
    out = {"type": type(graph).__name__, "graph": isinstance(graph, torch.fx.Graph)}
    if not out["graph"]:
        return out
    out.update(nodes=fx_calls(graph), outputs=[])
    try:
        gm = torch.fx.GraphModule(model, graph)
    except Exception as exc:  # noqa: BLE001  (the judge says what was wrong)
        out["outputs"] = [{"error": _fx_error(exc)} for _ in inputs]
        return out
    with torch.no_grad(), _fx_quiet():
        for args in inputs:
            try:
                y = gm(*args)
                out["outputs"].append(y.detach() if type(y) is torch.Tensor
                                      else {"type": type(y).__name__})
            except Exception as exc:  # noqa: BLE001
                out["outputs"].append({"error": _fx_error(exc)})
    return out


# ================================================================ modules.profile
@probe
def hottest(hot_op, traces: list) -> list:
    """``hot_op(text)`` for each trace text of ``traces``, in order; an entry ``{"raised":
    record}`` ends the list where the answer raised."""
    from grader.checks import raised

    out = []
    for text in traces:
        try:
            out.append(hot_op(text))
        except Exception as exc:  # noqa: BLE001  (the judge reports it)
            out.append({"raised": raised(exc)})
            break
    return out
