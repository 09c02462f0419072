"""Pictures for lab 9 (production), each one call from a cell.

Pictures return a ``matplotlib.figure.Figure`` built without pyplot; importing
:mod:`grader.kernel.display` registers the PNG formatter that shows it in JupyterLab. What they
draw comes from case runs (:func:`labs.production.probes.run`): a script's loss curve, its
memory readings, its step times.

- :func:`loss_curves`: loss per step of several runs (before and after a fix), a non-finite
  loss marked where it first appears;
- :func:`memory_timeline`: memory per step of several runs (a leak and its fix).
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure

import grader.kernel.display  # noqa: F401  (registers the PNG formatter for figures)

#: line colours, in the order runs are given
COLOURS = ("#d95f02", "#1b9e77", "#7570b3", "#e7298a")


def loss_curves(runs: dict, title: str = "Loss per step") -> Figure:
    """One line per run: ``runs`` maps a label (``"before"``, ``"after the fix"``) to its loss
    per step (a list of floats; NaN or inf where the loss was not finite). A run's first
    non-finite step is marked with a cross on the x axis and named in the legend. Artists carry
    gids ``curve:<label>`` and ``nonfinite:<label>``. Raises ValueError for no runs."""
    if not runs:
        raise ValueError("loss_curves needs at least one run")
    fig = Figure(figsize=(8, 3.2))
    ax = fig.add_subplot()
    for (label, losses), colour in zip(runs.items(), COLOURS):
        losses = [float(v) for v in losses]
        bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        name = label if bad is None else f"{label} (not finite from step {bad})"
        ax.plot(range(len(losses)), losses, color=colour, label=name, gid=f"curve:{label}")
        if bad is not None:
            ax.plot(
                [bad],
                [0],
                "x",
                color=colour,
                markersize=10,
                clip_on=False,
                transform=ax.get_xaxis_transform(),
                gid=f"nonfinite:{label}",
            )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def memory_timeline(runs: dict, title: str = "Memory per step", unit: str = "MiB") -> Figure:
    """One line per run: ``runs`` maps a label to its memory reading per step, in bytes (a
    list of ints), drawn in ``unit`` (``"KiB"``, ``"MiB"``); the legend gives each run's growth
    from its first to its last step. Artists carry gids ``memory:<label>``. Raises ValueError
    for no runs or an unknown unit."""
    scale = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}.get(unit)
    if not runs or scale is None:
        raise ValueError("memory_timeline needs runs and a unit of KiB, MiB or GiB")
    fig = Figure(figsize=(8, 3.2))
    ax = fig.add_subplot()
    for (label, readings), colour in zip(runs.items(), COLOURS):
        values = [v / scale for v in readings]
        growth = values[-1] - values[0] if values else 0.0
        ax.plot(
            range(len(values)),
            values,
            color=colour,
            gid=f"memory:{label}",
            label=f"{label}: {growth:+.1f} {unit} over {len(values)} steps",
        )
    ax.set_xlabel("step")
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ================================================================ the cheatsheet, measured
#: the performance cheatsheet's rows: what the faster way is, the baseline it replaces, and why
#: it can win (the mechanism) and why a CPU may not show it. Each row is measured by
#: :func:`measure_row` as a pair of torch.utils.benchmark timings on the same inputs.
ROWS = (
    {
        "row": "channels_last",
        "claim": "a conv on NHWC (channels_last) tensors instead of NCHW",
        "why": "cuDNN's and oneDNN's convolutions are written for NHWC; an NCHW input is "
        "converted on every call (aten/src/ATen/native/mkldnn/Conv.cpp, "
        "aten/src/ATen/native/cudnn/ConvShared.cpp)",
        "cpu": "oneDNN wins on NHWC too, by less than tensor cores do; a tiny conv shows little",
    },
    {
        "row": "foreach optimizer",
        "claim": "AdamW(foreach=True) instead of foreach=False, over 200 small parameters",
        "why": "one _foreach_* kernel per list instead of one kernel per parameter "
        "(torch/optim/adam.py: _multi_tensor_adam): fewer dispatches and launches",
        "cpu": "holds on CPU: the dispatcher's per-op cost is paid per tensor without it",
    },
    {
        "row": "zero_grad(set_to_none)",
        "claim": "zero_grad(set_to_none=True) instead of filling gradients with zeros",
        "why": "no fill kernel per parameter, and backward assigns the first gradient instead "
        "of adding it (torch/optim/optimizer.py: Optimizer.zero_grad)",
        "cpu": "holds on CPU: the saving is a call per parameter, not memory bandwidth",
    },
    {
        "row": "inference_mode",
        "claim": "torch.inference_mode() instead of torch.no_grad() for a forward",
        "why": "tensors made under it skip version counters and view tracking "
        "(c10/core/InferenceMode.h: InferenceMode)",
        "cpu": "a per-op saving: visible only where ops are small",
    },
    {
        "row": "torch.compile (warm)",
        "claim": "a compiled chain of five pointwise ops instead of eager",
        "why": "Inductor fuses the chain into one loop: one read and one write of memory "
        "instead of five (torch/_inductor/scheduler.py: Scheduler.fuse_nodes)",
        "cpu": "holds on CPU for memory-bound chains; the cold compile (below) costs seconds",
    },
    {
        "row": "torch.compile (cold)",
        "claim": "a warm call of a compiled function, against its first call after "
        "torch._dynamo.reset()",
        "why": "the first call traces with Dynamo, lowers and compiles, then installs guards "
        "(torch/_dynamo/convert_frame.py: convert_frame); later calls only check the guards",
        "cpu": "a process that compiled before finds the code in Inductor's on-disk cache "
        "(torch/_inductor/codecache.py: FxGraphCache): its cold start costs tracing only",
    },
    {
        "row": "bf16 autocast matmul",
        "claim": "a matmul under autocast(bfloat16) instead of float32",
        "why": "tensor cores (and AMX on recent Xeons) run bf16 matmuls at several times "
        "fp32's rate (torch/amp/autocast_mode.py: autocast)",
        "cpu": "without AMX or AVX512-BF16, a CPU converts to fp32 and back: often slower",
    },
    {
        "row": "pin_memory",
        "claim": "host-to-device copies from pinned (page-locked) memory, non_blocking",
        "why": "the copy engine reads pinned pages directly and overlaps with compute "
        "(aten/src/ATen/native/Memory.cpp: pin_memory)",
        "cpu": "needs an accelerator: pinning asks the device's host allocator",
    },
)


def _timers(row: str, device: str):
    """``(baseline, faster)`` as ``(stmt, globals)`` pairs for torch.utils.benchmark.Timer, or
    None where the row cannot run on ``device``."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    if row == "channels_last":
        conv = torch.nn.Conv2d(32, 32, 3, padding=1).to(device).eval()
        x = torch.randn(8, 32, 32, 32, generator=g).to(device)
        fast = torch.nn.Conv2d(32, 32, 3, padding=1).to(device, memory_format=torch.channels_last)
        fast.load_state_dict(conv.state_dict())
        xl = x.to(memory_format=torch.channels_last)
        stmt = "with torch.no_grad(): conv(x)"
        return (
            (stmt, {"conv": conv, "x": x, "torch": torch}),
            (stmt, {"conv": fast.eval(), "x": xl, "torch": torch}),
        )
    if row == "foreach optimizer":
        pairs = []
        for foreach in (False, True):
            params = [torch.zeros(16, device=device, requires_grad=True) for _ in range(200)]
            for p in params:
                p.grad = torch.randn(16, generator=g).to(device)
            opt = torch.optim.AdamW(params, foreach=foreach)
            pairs.append(("opt.step()", {"opt": opt}))
        return tuple(pairs)
    if row == "zero_grad(set_to_none)":
        params = [torch.zeros(64, device=device, requires_grad=True) for _ in range(200)]
        opt = torch.optim.SGD(params, lr=0.1)
        grads = [torch.randn(64, generator=g).to(device) for _ in params]
        stmt = (
            "opt.zero_grad(set_to_none={})\n"
            "for p, d in zip(params, grads):\n"
            "    p.grad = d if p.grad is None else p.grad.add_(d)"
        )
        names = {"opt": opt, "params": params, "grads": grads}
        return (stmt.format(False), names), (stmt.format(True), names)
    if row == "inference_mode":
        mlp = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(8)]).to(device)
        x = torch.randn(4, 16, generator=g).to(device)
        names = {"mlp": mlp, "x": x, "torch": torch}
        return (
            ("with torch.no_grad(): mlp(x)", names),
            ("with torch.inference_mode(): mlp(x)", names),
        )
    if row.startswith("torch.compile"):
        x = torch.randn(1 << 20, generator=g).to(device)

        def chain(t):
            return (t.sin() * 2 + 1).cos().exp()

        compiled = torch.compile(chain)
        compiled(x)  # (warm: compiled once, here)
        if row == "torch.compile (warm)":
            return ("chain(x)", {"chain": chain, "x": x}), ("f(x)", {"f": compiled, "x": x})
        cold = (
            "torch._dynamo.reset(); torch.compile(chain)(x)",
            {"torch": torch, "chain": chain, "x": x},
        )
        return ("f(x)", {"f": compiled, "x": x}), cold
    if row == "bf16 autocast matmul":
        a, b = (torch.randn(256, 256, generator=g).to(device) for _ in range(2))
        names = {"a": a, "b": b, "torch": torch, "kind": torch.device(device).type}
        return (
            ("a @ b", names),
            ("with torch.autocast(kind, dtype=torch.bfloat16): a @ b", names),
        )
    if row == "pin_memory":
        if device == "cpu" or not torch.cuda.is_available():
            return None
        host = torch.randn(1 << 22, generator=g)
        names = {"host": host, "pinned": host.pin_memory(), "device": device}
        return (
            ("host.to(device, non_blocking=True)", names),
            ("pinned.to(device, non_blocking=True)", names),
        )
    raise ValueError(f"no cheatsheet row {row!r}")


def measure_row(row: str, device: str = "cpu", min_run_time: float = 0.05) -> dict:
    """Time one cheatsheet row (:data:`ROWS`) on ``device`` with torch.utils.benchmark:
    ``{"row", "baseline_s", "faster_s", "ratio" (baseline / faster: above 1 where the claim
    holds here), "threads", "device"}``, median seconds per run; ``ratio`` None (and the
    times None) where the row cannot run on ``device`` (pin_memory without an accelerator). A
    cold compile is timed once (``timeit(1)``): it cannot be repeated warm. Raises ValueError
    for an unknown row."""
    import torch
    from torch.utils import benchmark

    pair = _timers(row, device)
    out = {
        "row": row,
        "baseline_s": None,
        "faster_s": None,
        "ratio": None,
        "threads": torch.get_num_threads(),
        "device": device,
    }
    if pair is None:
        return out
    times = []
    for stmt, names in pair:
        timer = benchmark.Timer(stmt=stmt, globals=names, num_threads=out["threads"])
        if "torch._dynamo.reset()" in stmt:
            times.append(timer.timeit(1).median)
        else:
            times.append(timer.blocked_autorange(min_run_time=min_run_time).median)
    if row == "torch.compile (cold)":
        times.reverse()  # (the claim's "faster" is the warm call, its baseline the cold one)
    out["baseline_s"], out["faster_s"] = times
    out["ratio"] = times[0] / times[1]
    return out


def cheatsheet(device: str = "cpu", min_run_time: float = 0.05) -> list[dict]:
    """Every row of :data:`ROWS` measured on ``device`` (:func:`measure_row`), each with its
    claim, mechanism and CPU note, and ``"holds"``: ``"yes"`` (faster by more than 10 %),
    ``"no"`` (slower by more than 10 %), ``"no difference"``, or ``"not measured"``."""
    rows = []
    for spec in ROWS:
        m = measure_row(spec["row"], device, min_run_time)
        r = m["ratio"]
        holds = (
            "not measured"
            if r is None
            else "yes"
            if r > 1.1
            else "no"
            if r < 0.9
            else "no difference"
        )
        rows.append({**spec, **m, "holds": holds})
    return rows


def cheatsheet_figure(rows: list[dict]) -> Figure:
    """The measured ratios of :func:`cheatsheet`'s rows as horizontal bars on a log scale,
    green where the claim holds here, red where it does not, grey where not measured (drawn at
    1). Bars carry gids ``ratio:<row>``."""
    fig = Figure(figsize=(8, 0.45 * len(rows) + 1.2))
    ax = fig.add_subplot()
    for i, r in enumerate(rows):
        ratio = r["ratio"] or 1.0
        colour = {"yes": "#1b9e77", "no": "#d95f02"}.get(r["holds"], "#bbbbbb")
        ax.barh(i, math.log10(ratio), color=colour, gid=f"ratio:{r['row']}")
        text = "not measured" if r["ratio"] is None else f"{ratio:.2f}x"
        ax.text(
            math.log10(ratio),
            i,
            f" {text} ",
            va="center",
            fontsize=8,
            ha="left" if ratio >= 1 else "right",
        )
    ax.set_yticks(range(len(rows)), [r["row"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("log10(baseline time / faster time): right of 0, the claim holds here")
    ax.set_title(
        f"The cheatsheet on this machine ({rows[0]['device']}, {rows[0]['threads']} threads)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
