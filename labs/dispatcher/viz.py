"""Pictures and explorers for lab 1 (the dispatcher), each one call from a notebook cell.

Pictures return a ``matplotlib.figure.Figure`` built without pyplot (no global state); importing
:mod:`grader.kernel.display` registers the formatter that shows it in JupyterLab. Explorers return
an ``ipywidgets.VBox`` whose result is an ``ipywidgets.HTML`` (its ``.value`` is readable without a
kernel). Everything is computed from the installed torch: strides and offsets from the tensor
itself, key sets from ``torch._C._dispatch_keys`` and the thread-local sets, kernels and
fallthroughs from the operator's computed dispatch table.

- :func:`storage_indices`, :func:`storage_picture`: which storage element each element of a view
  reads (``c10/core/TensorImpl.h: struct TensorImpl``, fields ``sizes_and_strides_`` and
  ``storage_offset_``);
- :func:`dispatch_state`, :func:`dispatch_key_bar`, :func:`probe_dispatch`: which key's kernel
  the dispatcher runs first (``aten/src/ATen/core/dispatch/DispatchKeyExtractor.h``,
  ``c10/core/DispatchKeySet.h: DispatchKeySet::highestPriorityTypeId``);
- :func:`view_explorer`, :func:`tls_explorer`: widgets over the two.
"""

from __future__ import annotations

import contextlib
import html
import itertools
import re
from dataclasses import dataclass

import torch
from matplotlib import colormaps
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import grader.kernel.display  # noqa: F401  (registers the PNG formatter for figures)
from grader.kernel.display import figure_html, strip_paths, table

C = torch._C
#: the most storage elements (and view elements) a storage picture draws
MAX_CELLS = 64
#: colours of the storage cells a view reads (matplotlib's "Set3", 12 colours)
_PALETTE = colormaps["Set3"].colors


# ----------------------------------------------------------------------------- storage picture
def storage_indices(t: torch.Tensor) -> dict[tuple[int, ...], int]:
    """For each index tuple of ``t`` (row-major order), the storage element it reads:
    ``storage_offset() + sum(i_k * stride(k))``, in elements of ``t``'s dtype.

    This is the address arithmetic of ``c10/core/TensorImpl.h: struct TensorImpl`` (sizes,
    strides and ``storage_offset_``); a 0-d tensor has the one index ``()``."""
    offset, strides = t.storage_offset(), t.stride()
    return {
        idx: offset + sum(i * s for i, s in zip(idx, strides))
        for idx in itertools.product(*(range(n) for n in t.shape))
    }


def _storage_size(t: torch.Tensor) -> int:
    """The number of elements of ``t``'s dtype that its storage holds."""
    return t.untyped_storage().nbytes() // t.element_size()


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def storage_picture(t: torch.Tensor, title: str = "") -> Figure:
    """A picture of strided tensor ``t`` (at most 64 elements, storage of at most 64 elements):
    top, its storage as a row of cells (index above, value inside, for CPU tensors); below, the
    elements of ``t`` as a grid (the last dim across; leading dims one row each, labelled), each
    cell naming the storage index it reads, ``storage_offset + sum(i_k * stride_k)``
    (:func:`storage_indices`), in that storage cell's colour. Storage cells no element reads stay
    white; the cell at ``storage_offset`` is marked. The title gives sizes, strides and offset.

    Computed from ``t.stride()``, ``t.storage_offset()`` and ``t.untyped_storage()``
    (``c10/core/TensorImpl.h: struct TensorImpl``, ``c10/core/StorageImpl.h: struct
    StorageImpl``). Raises ValueError for a non-strided tensor or one too large to draw."""
    if t.layout != torch.strided:
        raise ValueError(f"a storage picture needs a strided tensor, not {t.layout}")
    n_storage, reads = _storage_size(t), storage_indices(t)
    if n_storage > MAX_CELLS or len(reads) > MAX_CELLS:
        raise ValueError(
            f"a storage picture draws at most {MAX_CELLS} storage and view elements; "
            f"this tensor has {len(reads)} on a storage of {n_storage}"
        )
    values = None
    if t.device.type == "cpu" and n_storage:
        values = t.detach().as_strided((n_storage,), (1,), 0).tolist()  # the whole storage
    shape = tuple(t.shape)
    cols = shape[-1] if shape else 1
    rows = list(itertools.product(*(range(n) for n in shape[:-1]))) if shape else [()]
    # one axes in cell units, y downwards: title, storage row (y 2.4-3.4), view grid (y 5.2-)
    grid_x, grid_y = 2.6, 5.2
    width, height = max(n_storage, grid_x + cols, 9) + 0.4, grid_y + len(rows) + 0.2
    fig = Figure(figsize=(0.45 * width, 0.45 * height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-0.2, width - 0.2)
    ax.set_ylim(height, 0)
    ax.set_axis_off()
    colour = {k: _PALETTE[k % len(_PALETTE)] for k in set(reads.values())}
    ax.text(
        0,
        1.6,
        f"storage: {n_storage} element{'s' * (n_storage != 1)} of {t.dtype}".replace("torch.", ""),
        fontsize=8,
    )
    for k in range(n_storage):
        ax.add_patch(
            Rectangle(
                (k, 2.4),
                1,
                1,
                facecolor=colour.get(k, "white"),
                edgecolor="#555",
                gid=f"storage-{k}",
            )
        )
        ax.text(
            k + 0.5, 2.25, str(k), ha="center", fontsize=7, color="#555", gid=f"storage-index-{k}"
        )
        if values is not None:
            ax.text(
                k + 0.5,
                2.9,
                _value(values[k]),
                ha="center",
                va="center",
                fontsize=8,
                color="black" if k in colour else "#999",
            )
    if n_storage:
        off = t.storage_offset()
        ax.annotate(
            "offset",
            (off + 0.5, 3.4),
            (off + 0.5, 4.2),
            ha="center",
            fontsize=7,
            arrowprops={"arrowstyle": "->", "color": "#333"},
        )
    ax.text(
        0, grid_y - 0.3, "the view: each element names the storage element it reads", fontsize=8
    )
    for r, lead in enumerate(rows):
        label = "[" + ", ".join([*map(str, lead), ":"]) + "]" if shape else "[]"
        ax.text(grid_x - 0.2, grid_y + r + 0.5, label, ha="right", va="center", fontsize=8)
        for c in range(cols):
            idx = (*lead, c) if shape else ()
            if idx not in reads:
                continue
            k = reads[idx]
            ax.add_patch(
                Rectangle((grid_x + c, grid_y + r), 1, 1, facecolor=colour[k], edgecolor="#555")
            )
            ax.text(
                grid_x + c + 0.5,
                grid_y + r + 0.5,
                str(k),
                ha="center",
                va="center",
                fontsize=9,
                weight="bold",
                gid="view-" + ",".join(map(str, idx)),
            )
    if not reads:
        ax.text(grid_x, grid_y + 0.5, "(no elements)", va="center", fontsize=9)
    ax.text(
        0,
        0.15,
        f"{title or 'a view'}: sizes {shape}, strides {t.stride()}, storage_offset "
        f"{t.storage_offset()}\nelement [i, j, ...] reads storage[offset + i*stride0 + "
        "j*stride1 + ...]",
        fontsize=9,
        va="top",
        gid="title",
    )
    return fig


# ----------------------------------------------------------------------------- dispatch keys
def _names(keyset) -> list[str]:
    """The runtime keys a DispatchKeySet holds, lowest priority first (as torch prints them)."""
    text = repr(keyset)
    return [k for k in text[text.index("(") + 1 : text.rindex(")")].split(", ") if k]


def _keyset(keys):
    """A DispatchKeySet from a DispatchKeySet or an iterable of runtime key names."""
    if isinstance(keys, C.DispatchKeySet):
        return keys
    out = C.DispatchKeySet(C.DispatchKey.Undefined)
    for name in keys:
        key = C._parse_dispatch_key(name)
        if key is None:
            raise ValueError(f"{name!r} is not a dispatch key name")
        out = out | C.DispatchKeySet(key)
    return out


def _qualname(op) -> str:
    """'aten::add.Tensor' from an OpOverload or a qualified name."""
    return op if isinstance(op, str) else op.name()


def dispatch_table(op) -> dict[str, str]:
    """The computed dispatch table of ``op`` (an ``OpOverload`` or a name such as
    ``"aten::add.Tensor"``): ``{runtime key: "kernel" | "fallthrough"}``, keys without an entry
    left out. Read from ``torch._C._dispatch_dump_table``
    (``aten/src/ATen/core/dispatch/OperatorEntry.h: OperatorEntry::dumpComputedTable``)."""
    out = {}
    for line in C._dispatch_dump_table(_qualname(op)).splitlines():
        if m := re.match(r"^(\w+): (fallthrough )?registered at", line):
            out[m.group(1)] = "fallthrough" if m.group(2) else "kernel"
    return out


@dataclass
class KeyRow:
    """One runtime key of a call: where it came from and what happened to it."""

    name: str
    from_tensor: bool
    from_include: bool
    excluded: bool = False  # removed by the TLS exclude set
    fallthrough: bool = False  # masked by the operator's fallthrough
    kernel: str | None = None  # "kernel" / "fallthrough" / None (no entry), with an op


@dataclass
class DispatchState:
    """What :func:`dispatch_state` found: ``rows`` lowest priority first, the key whose kernel runs
    first (``winner``, None when none is left) and whether that key has a kernel (``raises``: the
    call fails with "Could not run ..." instead)."""

    rows: list[KeyRow]
    winner: str | None
    raises: bool
    op: str | None = None
    keyset: str = ""

    def table(self):
        """The rows as a :func:`grader.kernel.display.table` (HTML in JupyterLab, text
        elsewhere)."""

        def yes(b):
            return "yes" if b else ""

        rows = [
            [
                r.name,
                yes(r.from_tensor),
                yes(r.from_include),
                yes(r.excluded),
                yes(r.fallthrough),
                "" if r.kernel is None and not self.op else r.kernel or "none",
                _outcome(r, self),
            ]
            for r in self.rows
        ]
        return table(
            rows,
            ["key", "tensor", "TLS include", "excluded", "fallthrough", "table entry", "outcome"],
            caption=self.keyset,
        )


def _outcome(row: KeyRow, state: DispatchState) -> str:
    """The table's last column: "runs" for the key whose kernel runs first ("raises: no kernel"
    when the table has no kernel there), empty for the other keys."""
    if row.name != state.winner:
        return ""
    return "raises: no kernel" if state.raises else "runs"


def dispatch_state(*tensors: torch.Tensor, op=None, include=None, exclude=None) -> DispatchState:
    """Which kernel the dispatcher runs first for a call of ``op`` on ``tensors``.

    ``include`` / ``exclude`` stand for the thread-local include / exclude sets: ``None`` reads the
    current thread's (``torch._C._dispatch_tls_local_include_set()``, ``..._exclude_set()``), a
    DispatchKeySet or an iterable of runtime key names replaces them. ``op`` (an ``OpOverload``
    or ``"ns::name.overload"``) adds its fallthrough mask and table; without it the winner is the
    highest key of the key set. Models, with torch's own DispatchKeySet arithmetic:
    ``aten/src/ATen/core/dispatch/DispatchKeyExtractor.h:
    DispatchKeyExtractor::getDispatchKeySetUnboxed`` (the key set is
    ``((tensor keys | include) - exclude) & nonFallthroughKeys``; a fallthrough of a per-backend
    key counts for the call's highest backend only), ``c10/core/DispatchKeySet.h:
    DispatchKeySet::highestPriorityTypeId`` and ``aten/src/ATen/core/dispatch/OperatorEntry.h:
    OperatorEntry::lookup`` (no kernel for that key: the call raises). Raises ValueError for an
    unknown key name, RuntimeError (torch's) for an unknown operator."""
    tensor_ks = C.DispatchKeySet(C.DispatchKey.Undefined)
    for t in tensors:
        tensor_ks = tensor_ks | C._dispatch_keys(t)
    inc = C._dispatch_tls_local_include_set() if include is None else _keyset(include)
    exc = C._dispatch_tls_local_exclude_set() if exclude is None else _keyset(exclude)
    candidates = tensor_ks | inc
    effective = candidates - exc
    table_ = dispatch_table(op) if op is not None else {}
    masked = effective
    if op is not None:
        backend_mask = (1 << C._dispatch_num_backends()) - 1
        call_backend = effective.raw_repr() & backend_mask
        call_backend = 1 << (call_backend.bit_length() - 1) if call_backend else 0
        for name in _names(effective):
            if table_.get(name) != "fallthrough":
                continue
            key_backend = C.DispatchKeySet(C._parse_dispatch_key(name)).raw_repr() & backend_mask
            if key_backend in (0, call_backend):  # per backend: the call's backend decides
                masked = masked - C.DispatchKeySet(C._parse_dispatch_key(name))
    top = masked.highestPriorityTypeId()
    winner = None if top == C.DispatchKey.Undefined else C._dispatch_key_name(top)
    in_tensor, in_include = set(_names(tensor_ks)), set(_names(inc))
    in_effective, in_masked = set(_names(effective)), set(_names(masked))
    rows = [
        KeyRow(
            name,
            name in in_tensor,
            name in in_include,
            excluded=name not in in_effective,
            fallthrough=name in in_effective and name not in in_masked,
            kernel=table_.get(name),
        )
        for name in _names(candidates)
    ]
    raises = op is not None and (winner is None or table_.get(winner) != "kernel")
    return DispatchState(
        rows,
        winner,
        raises,
        None if op is None else _qualname(op),
        f"key set of the call: {masked}",
    )


def _faded(colour: str) -> tuple:
    """``colour`` mixed half and half with white."""
    return tuple(0.5 + c / 2 for c in to_rgb(colour))


def _note(row: KeyRow, state: DispatchState) -> str:
    """What the key bar writes under a key."""
    if row.excluded:
        return "excluded"
    if row.fallthrough:
        return "fallthrough"
    if row.name == state.winner:
        return "raises: no kernel" if state.raises else "runs"
    return "no kernel" if state.op and row.kernel is None else ""


_SOURCE_COLOURS = {(True, False): "#9ecae1", (False, True): "#a1d99b", (True, True): "#8fd3c8"}


def dispatch_key_bar(
    *tensors: torch.Tensor, op=None, include=None, exclude=None, title: str = ""
) -> Figure:
    """A bar of the runtime keys of a call, lowest priority on the left: every key of
    ``tensors`` (blue) or of the TLS include set (green; both: teal), hatched when the TLS
    exclude set removes it, dashed and grey when it is a fallthrough of ``op``, and the key whose
    kernel runs first framed in gold (red, "raises", when the table has no kernel there).

    Arguments as for :func:`dispatch_state`, which computes it (``c10/core/DispatchKeySet.h:
    DispatchKeySet::highestPriorityTypeId``, ``aten/src/ATen/core/dispatch/
    DispatchKeyExtractor.h: DispatchKeyExtractor::getDispatchKeySetUnboxed``)."""
    state = dispatch_state(*tensors, op=op, include=include, exclude=exclude)
    n = max(len(state.rows), 1)
    box = max([len(r.name) for r in state.rows] + [10]) * 0.075 + 0.3
    fig = Figure(figsize=(box * n + 1.0, 2.3))
    ax = fig.add_subplot()
    ax.set_xlim(-0.2, box * n + 0.2)
    ax.set_ylim(-1.5, 1.6)
    ax.set_axis_off()
    for i, r in enumerate(state.rows):
        x, won = i * box, r.name == state.winner
        dropped = r.excluded or r.fallthrough
        edge = ("#cf222e" if state.raises else "#d4a017") if won else "#555"
        face = _SOURCE_COLOURS[(r.from_tensor, r.from_include)]
        ax.add_patch(
            Rectangle(
                (x + 0.04, 0),
                box - 0.08,
                1,
                facecolor=_faded(face) if dropped else face,
                edgecolor="#999" if dropped else edge,
                linewidth=3 if won else 1,
                linestyle="--" if r.fallthrough else "-",
                hatch="//" if r.excluded else None,
                gid=f"key-{r.name}",
            )
        )
        label_box = {"facecolor": _faded(face), "edgecolor": "none", "pad": 1}
        ax.text(
            x + box / 2,
            0.5,
            r.name,
            ha="center",
            va="center",
            fontsize=8,
            color="#666" if dropped else "black",
            gid=f"key-label-{r.name}",
            bbox=label_box if r.excluded else None,
        )
        ax.text(
            x + box / 2,
            -0.3,
            _note(r, state),
            ha="center",
            va="center",
            fontsize=7.5,
            color=edge if won else "#666",
            weight="bold" if won else "normal",
            gid=f"note-{r.name}",
        )
    ax.annotate("", (box * n, 1.35), (0, 1.35), arrowprops={"arrowstyle": "->", "color": "#666"})
    ax.text(
        box * n / 2,
        1.42,
        "priority (torch._C._dispatch_keyset_full() order)",
        ha="center",
        va="bottom",
        fontsize=7.5,
        color="#666",
    )
    ax.text(
        0,
        -1.0,
        "blue: from the tensor  green: from the TLS include set  teal: both  "
        "hatched: TLS exclude  dashed: fallthrough",
        fontsize=7,
        color="#444",
    )
    what = state.op or "a call"
    ran = state.winner or "nothing (no key left)"
    fig.suptitle(
        f"{title or what}: the first kernel to run is {ran}"
        + (" (no kernel there: the call raises)" if state.raises and state.winner else ""),
        fontsize=9,
    )
    return fig


_probe_counter = itertools.count()


def _recorder(ran: list, key: str):
    """A kernel for ``probe(Tensor x) -> ()`` that appends ``key`` to ``ran``."""

    def kernel(x):
        ran.append(key)

    return kernel


def probe_dispatch(t: torch.Tensor, op) -> str | None:
    """Ask the real dispatcher which key runs first for ``op``'s table and tensor ``t``, in the
    current thread-local state: define a fresh operator ``probe(Tensor x) -> ()`` with
    ``torch.library.Library``, give it, on every key of the call where ``op``'s computed table
    has an entry, a Python kernel that records its key (or a fallthrough where ``op`` has one),
    call it on ``t`` and return the key that ran, or None when the call raised
    NotImplementedError (no kernel). The Library is destroyed before returning."""
    ns = f"lab1_viz_probe_{next(_probe_counter)}"
    lib = torch.library.Library(ns, "DEF")
    ran: list[str] = []
    try:
        lib.define("probe(Tensor x) -> ()")
        keys = _names(C._dispatch_keys(t) | C._dispatch_tls_local_include_set())
        for key, how in dispatch_table(op).items():
            if key not in keys:
                continue
            if how == "fallthrough":
                lib.impl("probe", torch.library.fallthrough_kernel, key)
            else:
                lib.impl("probe", _recorder(ran, key), key)
        try:
            getattr(torch.ops, ns).probe.default(t)
        except NotImplementedError:
            return None
        return ran[0] if ran else None
    finally:
        lib._destroy()


# ----------------------------------------------------------------------------- explorers
#: what a Dropdown holds for the choice None: ipywidgets reads a value of None as "nothing
#: selected" and shows a blank box, so None is stored as this string and read back by _value_of
NONE = "None"


def _choices(values):
    """Dropdown options ``(label, value)`` for ``values``, None stored as :data:`NONE`."""
    return [(str(v), NONE if v is None else v) for v in values]


def _value_of(choice):
    """The argument a Dropdown's value stands for (:data:`NONE` -> None)."""
    return None if choice == NONE else choice


def _dropdown_width(description: str, labels) -> str:
    """A Dropdown width (CSS) that shows ``description`` and the longest of ``labels`` whole:
    about 8 px per character of each, plus the arrow and margins."""
    return f"{8 * (len(description) + max(len(str(v)) for v in labels)) + 50}px"


#: the view explorer's operations: (arguments and their choices, function, expression)
VIEW_OPS = {
    "transpose": (
        {"d0": [0, 1, -1], "d1": [1, 0, -1]},
        lambda x, d0, d1: x.transpose(d0, d1),
        "x.transpose({d0}, {d1})",
    ),
    "slice": (
        {"dim": [0, 1], "start": [None, 0, 1, 2, -1], "stop": [None, 3, 2, -1], "step": [1, 2, 3]},
        lambda x, dim, start, stop, step: x[(slice(None),) * dim + (slice(start, stop, step),)],
        "x[{colons}{start}:{stop}:{step}]",
    ),
    "select": (
        {"dim": [0, 1, -1], "index": [0, 1, 2, -1]},
        lambda x, dim, index: x.select(dim, index),
        "x.select({dim}, {index})",
    ),
    "expand": (
        {"row": [0, 1, 2], "n": [1, 2, 3]},
        lambda x, row, n: x[row].expand(n, 4),
        "x[{row}].expand({n}, 4)",
    ),
    "unsqueeze": ({"dim": [0, 1, 2, -1]}, lambda x, dim: x.unsqueeze(dim), "x.unsqueeze({dim})"),
    "view": (
        {"rows": [1, 2, 3, 4, 6, 12]},
        lambda x, rows: x.view(rows, -1),
        "x.view({rows}, -1)",
    ),
    "view or reshape of x.t()": (
        {"method": ["view", "reshape"], "rows": [4, 2, 6, 12]},
        lambda x, method, rows: getattr(x.t(), method)(rows, -1),
        "x.t().{method}({rows}, -1)",
    ),
    "permute": (
        {"dims": list(itertools.permutations(range(3)))},
        lambda x, dims: x.view(2, 2, 3).permute(dims),
        "x.view(2, 2, 3).permute({dims})",
    ),
    "diagonal": (
        {"offset": [0, 1, 2, -1]},
        lambda x, offset: x.diagonal(offset),
        "x.diagonal({offset})",
    ),
    "as_strided": (
        {
            "rows": [1, 2, 3],
            "cols": [1, 2, 3, 4],
            "s0": [0, 1, 2, 3, 4, 5],
            "s1": [0, 1, 2, 3],
            "offset": [0, 1, 2, 3, 4],
        },
        lambda x, rows, cols, s0, s1, offset: x.as_strided((rows, cols), (s0, s1), offset),
        "x.as_strided(({rows}, {cols}), ({s0}, {s1}), {offset})",
    ),
}


def geometry_table(views: dict, base: torch.Tensor):
    """A table of the geometry of each tensor in ``views`` (``{name: tensor}``): sizes, strides,
    storage_offset, is_contiguous(), whether it shares ``base``'s storage and whether its
    ``_base`` is ``base`` (``c10/core/TensorImpl.h: struct TensorImpl``)."""
    ptr = base.untyped_storage().data_ptr()
    rows = [
        [
            name,
            tuple(v.shape),
            v.stride(),
            v.storage_offset(),
            v.is_contiguous(),
            v.untyped_storage().data_ptr() == ptr,
            v._base is base,
        ]
        for name, v in views.items()
    ]
    return table(
        rows, ["tensor", "sizes", "strides", "offset", "contiguous", "same storage", "_base is x"]
    )


def _html_of(obj) -> str:
    return obj._repr_html_()


def view_explorer(shape=(3, 4)):
    """A widget: pick a view operation and its arguments, applied to ``x = torch.arange(12.)
    .reshape(shape).clone()`` (a tensor that owns its storage, so ``v._base is x`` for its views;
    12 elements: ``shape`` must be (3, 4) for every operation to apply), and
    see the expression, the result's geometry table (:func:`geometry_table`) and its
    :func:`storage_picture`, or the error torch raises for arguments it rejects. Returns an
    ``ipywidgets.VBox`` of (operation Dropdown, HBox of argument Dropdowns, result HTML)."""
    import ipywidgets as w

    x = torch.arange(12.0).reshape(shape).clone()  # owns its storage: x._base is None
    op = w.Dropdown(
        options=list(VIEW_OPS),
        value="slice",
        description="operation",
        style={"description_width": "initial"},
        layout=w.Layout(width=_dropdown_width("operation", VIEW_OPS)),
    )
    args = w.HBox(layout=w.Layout(flex_flow="row wrap"))
    out = w.HTML()

    def render(_=None):
        _, fn, expr = VIEW_OPS[op.value]
        values = {d.description: _value_of(d.value) for d in args.children}
        shown = expr.format(colons=":, " * values.get("dim", 0), **values)
        shown = shown.replace("None", "")
        try:
            v = fn(x, **values)
        except (RuntimeError, IndexError) as err:
            message = strip_paths(str(err).splitlines()[0])
            out.value = (
                f"<p><code>{html.escape(shown)}</code>: torch raised "
                f"{type(err).__name__}: {html.escape(message)}</p>"
            )
            return
        out.value = (
            f"<p><code>{html.escape(shown)}</code> on x = torch.arange(12.).reshape"
            f"{tuple(shape)}.clone()</p>"
            + _html_of(geometry_table({shown: v}, x))
            + figure_html(storage_picture(v, title=shown))
        )

    def rebuild(_=None):
        controls = []
        for name, options in VIEW_OPS[op.value][0].items():
            choices = _choices(options)
            d = w.Dropdown(
                options=choices,
                value=choices[0][1],
                description=name,
                style={"description_width": "initial"},
                layout=w.Layout(width=_dropdown_width(name, [label for label, _ in choices])),
            )
            d.observe(render, names="value")
            controls.append(d)
        args.children = controls
        render()

    op.observe(rebuild, names="value")
    rebuild()
    return w.VBox([op, args, out])


class _Wrapper(torch.Tensor):
    """A wrapper subclass with ``__torch_dispatch__``: it carries the Python keys (only its keys
    are looked at here, no operator is run on it)."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"{cls.__name__} only shows its dispatch keys")


def _tensors():
    with torch.inference_mode():
        inference = torch.ones(2)
    return {
        "CPU tensor": lambda: torch.ones(2),
        "CPU tensor, requires_grad": lambda: torch.ones(2, requires_grad=True),
        "inference tensor": lambda: inference,
        "meta tensor": lambda: torch.empty(2, device="meta"),
        "complex, conj()": lambda: torch.ones(2, dtype=torch.complex64).conj(),
        "wrapper subclass (__torch_dispatch__)": lambda: _Wrapper(torch.ones(2)),
    }


#: the TLS explorer's contexts, each a function returning a context manager
CONTEXTS = {
    "none": contextlib.nullcontext,
    "torch.no_grad()": torch.no_grad,
    "torch.inference_mode()": torch.inference_mode,
    "torch.autocast('cpu')": lambda: torch.autocast("cpu"),
    "torch._C._AutoDispatchBelowAutograd()": C._AutoDispatchBelowAutograd,
    "torch._C._AutoDispatchBelowADInplaceOrView()": C._AutoDispatchBelowADInplaceOrView,
}
INCLUDABLE = ("Python", "Functionalize", "AutocastCPU")
EXCLUDABLE = ("AutogradCPU", "ADInplaceOrView", "Python")
OPS = (
    "aten::add.Tensor",
    "aten::add_.Tensor",
    "aten::mm",
    "aten::transpose.int",
    "(no operator: the key set only)",
)


@contextlib.contextmanager
def tls_state(context="none", include=(), exclude=()):
    """Enter one of :data:`CONTEXTS` by name, then ``torch._C._IncludeDispatchKeyGuard`` for each
    key name in ``include`` and one ``torch._C._ExcludeDispatchKeyGuard`` for the keys in
    ``exclude`` (``c10/core/impl/LocalDispatchKeySet.h: IncludeDispatchKeyGuard``,
    ``ExcludeDispatchKeyGuard``): the real thread-local state, restored on exit."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(CONTEXTS[context]())
        for name in include:
            stack.enter_context(C._IncludeDispatchKeyGuard(C._parse_dispatch_key(name)))
        if exclude:
            stack.enter_context(C._ExcludeDispatchKeyGuard(_keyset(exclude)))
        yield


def _row_label(w, text: str):
    """A Label at the head of a row of controls, as wide as its text: not shrunk (ipywidgets
    cuts a Label that a full row squeezes)."""
    return w.Label(text, layout=w.Layout(width="auto", min_width=f"{8 * len(text) + 10}px"))


def _checkbox(w, key: str):
    """An unticked Checkbox for ``key``, only as wide as its box and name (the default is the
    300 px of every inline widget)."""
    return w.Checkbox(
        description=key,
        value=False,
        indent=False,
        style={"description_width": "initial"},
        layout=w.Layout(width="auto", min_width=f"{8 * len(key) + 40}px"),
    )


def tls_explorer():
    """A widget: pick a tensor, an operator and a context (``no_grad``, ``inference_mode``,
    ``autocast``, ...), tick keys to add to the thread-local include or exclude set, and see the
    thread-local sets, the :func:`dispatch_key_bar` and :meth:`DispatchState.table` of the call,
    and the key the real dispatcher ran first for a probe operator with the same table
    (:func:`probe_dispatch`). Returns an ``ipywidgets.VBox`` of (HBox of the tensor, operator and
    context Dropdowns, HBox of include Checkboxes, HBox of exclude Checkboxes, result HTML)."""
    import ipywidgets as w

    tensors = _tensors()

    def dropdown(options, value, description):
        return w.Dropdown(
            options=list(options),
            value=value,
            description=description,
            style={"description_width": "initial"},
            layout=w.Layout(width=_dropdown_width(description, options)),
        )

    tensor = dropdown(tensors, "CPU tensor, requires_grad", "tensor")
    op = dropdown(OPS, "aten::add.Tensor", "operator")
    context = dropdown(CONTEXTS, "none", "context")
    include = [_checkbox(w, k) for k in INCLUDABLE]
    exclude = [_checkbox(w, k) for k in EXCLUDABLE]
    out = w.HTML()

    def render(_=None):
        t = tensors[tensor.value]()
        name = None if op.value.startswith("(") else op.value
        inc = [c.description for c in include if c.value]
        exc = [c.description for c in exclude if c.value]
        with tls_state(context.value, inc, exc):
            tls = (C._dispatch_tls_local_include_set(), C._dispatch_tls_local_exclude_set())
            state = dispatch_state(t, op=name)
            fig = dispatch_key_bar(t, op=name)
            ran = probe_dispatch(t, name) if name else None
        lines = [
            f"TLS include: {tls[0]}",
            f"TLS exclude: {tls[1]}",
            f"tensor keys: {C._dispatch_keys(t)}",
        ]
        if name:
            verdict = "raises (no kernel)" if state.raises else state.winner
            lines.append(
                f"model: {verdict} | the dispatcher ran, for a probe with {name}'s "
                f"table: {ran or 'nothing (NotImplementedError)'}"
            )
        else:
            lines.append(f"highest priority key: {state.winner}")
        text = "".join(f"<div><code>{html.escape(s)}</code></div>" for s in lines)
        out.value = text + figure_html(fig) + _html_of(state.table())

    for control in (tensor, op, context, *include, *exclude):
        control.observe(render, names="value")
    render()
    return w.VBox(
        [
            w.HBox([tensor, op, context], layout=w.Layout(flex_flow="row wrap")),
            w.HBox([_row_label(w, "TLS include +"), *include]),
            w.HBox([_row_label(w, "TLS exclude +"), *exclude]),
            out,
        ]
    )
