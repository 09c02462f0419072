"""labs/dispatcher/viz.py: every picture renders headless and shows what torch says; the explorers
react to their controls. The oracles are torch's own indexing (a view of ``arange`` reads its
storage indices as values) and the real dispatcher (a fresh operator whose kernels record their
key)."""

import functools
import io
import random
import re
import uuid

import pytest
import torch

from labs.dispatcher import viz
from labs.dispatcher.checks.key_priority import _tensor  # the tensors its checks use

C = torch._C


def _render(fig):
    fig.savefig(io.BytesIO(), format="png")
    return fig


def _texts(fig, prefix):
    """{gid suffix: text} of the figure's texts whose gid starts with ``prefix``."""
    return {
        t.get_gid()[len(prefix) :]: t.get_text()
        for ax in fig.axes
        for t in ax.texts
        if (t.get_gid() or "").startswith(prefix)
    }


# ----------------------------------------------------------------------------- storage picture
def _views():
    """Views of ``base = arange(24.)``: fixed ones, then seeded random ``as_strided`` ones that
    torch accepts. A view's values are then the storage indices it reads."""
    base = torch.arange(24.0)
    x = base.view(4, 6)
    fixed = [
        x,
        x.t(),
        x[1:, ::2],
        x[:, 3],
        x[2],
        x[0].expand(3, 6),
        x.unsqueeze(1),
        x.view(2, 12)[:, 1::5],
        x.diagonal(1),
        x.view(2, 3, 4).permute(2, 0, 1),
        x[1:3, 2:2],
        base[5],
    ]
    rng = random.Random(0)
    for _ in range(6):
        sizes = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
        strides = [rng.randint(0, 5) for _ in sizes]
        reach = sum((n - 1) * s for n, s in zip(sizes, strides))
        offset = rng.randint(0, 23 - reach) if reach <= 23 else None
        if offset is not None:
            fixed.append(base.as_strided(sizes, strides, offset))
    return fixed


@pytest.mark.parametrize("i", range(len(_views())))
def test_storage_picture_labels_each_element_with_the_storage_index_torch_reads(i):
    v = _views()[i]
    fig = viz.storage_picture(v)
    if i in (0, 9):  # (rendering takes 0.1 s: two prove that pictures draw)
        _render(fig)
    storage = v.untyped_storage().nbytes() // v.element_size()
    cells = [
        p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("storage-")
    ]
    assert len(cells) == storage
    assert _texts(fig, "storage-index-") == {str(k): str(k) for k in range(storage)}
    drawn = {
        tuple(int(i) for i in key.split(",") if i): int(text)
        for key, text in _texts(fig, "view-").items()
    }
    # torch's own indexing: each element of a view of arange is the storage index it reads
    expected = {idx: int(v[idx].item()) for idx in drawn} if v.numel() else {}
    assert drawn == expected and len(drawn) == v.numel()
    assert f"strides {v.stride()}" in _texts(fig, "title")[""]
    assert f"storage_offset {v.storage_offset()}" in _texts(fig, "title")[""]


def test_storage_indices_is_the_strided_address_arithmetic():
    v = torch.arange(12.0).view(3, 4).t()[1:, ::2]
    assert viz.storage_indices(v) == {idx: int(v[idx]) for idx in viz.storage_indices(v)}
    assert viz.storage_indices(torch.tensor(1.0)) == {(): 0}


def test_storage_picture_refuses_what_it_cannot_draw():
    with pytest.raises(ValueError, match="strided"):
        viz.storage_picture(torch.ones(3).to_sparse())
    with pytest.raises(ValueError, match="at most"):
        viz.storage_picture(torch.zeros(100)[:2])


# ----------------------------------------------------------------------------- dispatch keys
def _winner(fig):
    """(the key the bar says runs first or None, whether it says the call raises)."""
    notes = _texts(fig, "note-")
    won = [k for k, text in notes.items() if text in ("runs", "raises: no kernel")]
    assert len(won) <= 1, notes
    return (won[0] if won else None), any(t == "raises: no kernel" for t in notes.values())



_KEYS_ALWAYS = (
    "CPU",
    "Meta",
    "AutogradCPU",
    "AutogradMeta",
    "ADInplaceOrView",
    "BackendSelect",
    "AutocastCPU",
    "Python",
    "Functionalize",
    "Conjugate",
    "PythonTLSSnapshot",
)


@pytest.mark.parametrize("seed", range(30))
def test_key_bar_names_the_kernel_the_real_dispatcher_runs(seed):
    """A fresh operator with, on every key a call can reach, a kernel that records its key or a
    fallthrough (Fake left without any); the bar's winner is what runs."""
    rng = random.Random(seed)
    kind = rng.choice(["cpu", "cpu, requires_grad", "meta", "conj", "inference"])
    context = rng.choice(list(viz.CONTEXTS))
    include = rng.sample(["Python", "Functionalize", "AutocastCPU", "Fake"], rng.randint(0, 2))
    exclude = rng.sample(["AutogradCPU", "ADInplaceOrView", "Python", "CPU"], rng.randint(0, 2))
    ns = f"viz_test_{seed}_{uuid.uuid4().hex[:6]}"
    lib = torch.library.Library(ns, "DEF")
    ran = []

    def recorder(key):
        return lambda x: ran.append(key)

    try:
        lib.define("probe(Tensor x) -> ()")
        for key in _KEYS_ALWAYS:
            if rng.random() < 0.35:
                lib.impl("probe", torch.library.fallthrough_kernel, key)
            else:
                lib.impl("probe", recorder(key), key)
        t = _tensor(kind)
        with viz.tls_state(context, include, exclude):
            fig = viz.dispatch_key_bar(t, op=f"{ns}::probe")
            state = viz.dispatch_state(t, op=f"{ns}::probe")
            try:
                getattr(torch.ops, ns).probe.default(t)
                actual = ran[0]
            except (NotImplementedError, RuntimeError):
                actual = None
    finally:
        lib._destroy()
    if seed == 0:
        _render(fig)
    winner, raises = _winner(fig)
    assert (None if state.raises else state.winner) == actual, (kind, context, include, exclude)
    assert state.winner == winner and (winner is None or state.raises == raises)


@pytest.mark.parametrize("kind", ["cpu", "cpu, requires_grad", "meta", "inference"])
@pytest.mark.parametrize(
    "context",
    [
        "none",
        "torch.inference_mode()",
        "torch.autocast('cpu')",
        "torch._C._AutoDispatchBelowAutograd()",
    ],
)
def test_key_bar_on_aten_operators_agrees_with_a_probe(kind, context):
    t = _tensor(kind)
    for op in ("aten::add.Tensor", "aten::add_.Tensor", "aten::mm", "aten::transpose.int"):
        with viz.tls_state(context):
            state = viz.dispatch_state(t, op=op)
            ran = viz.probe_dispatch(t, op)
        assert (None if state.raises else state.winner) == ran, (kind, context, op)


def test_key_bar_shows_autocast_where_it_casts():
    a, b = torch.randn(2, 2, requires_grad=True), torch.randn(2, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mm = _render(viz.dispatch_key_bar(a, b, op=torch.ops.aten.mm.default))
        add = _render(viz.dispatch_key_bar(a, b, op="aten::add.Tensor"))
        assert (a @ b).dtype == torch.bfloat16 and (a + b).dtype == torch.float32
    assert _winner(mm) == ("AutocastCPU", False)
    assert _winner(add) == ("AutogradCPU", False)
    assert _texts(add, "note-")["AutocastCPU"] == "fallthrough"
    assert _winner(_render(viz.dispatch_key_bar(a, b, op="aten::mm")))[0] == "AutogradCPU"
    assert _texts(mm, "note-")["BackendSelect"] == "fallthrough"


def test_key_bar_without_an_operator_and_with_explicit_sets():
    t = torch.ones(2)
    fig = _render(viz.dispatch_key_bar(t))
    assert _winner(fig) == ("AutogradCPU", False)  # AutocastCPU is excluded by default
    assert set(_texts(fig, "key-label-")) == {
        "CPU",
        "BackendSelect",
        "ADInplaceOrView",
        "AutogradCPU",
        "AutocastCPU",
    }
    state = viz.dispatch_state(t, include=["Python"], exclude=[])
    assert state.winner == "AutocastCPU" and not state.raises
    assert C._dispatch_key_name(C._dispatch_keys(t).highestPriorityTypeId()) == "AutocastCPU"
    assert "AutocastCPU" in repr(state.table())
    with pytest.raises(ValueError, match="not a dispatch key"):
        viz.dispatch_state(t, include=["NoSuchKey"])


# ----------------------------------------------------------------------------- explorers
def _select(box, **values):
    for control in box.children[1].children:
        if control.description in values:
            control.value = values[control.description]


def test_view_explorer_shows_the_geometry_torch_computes():
    box = viz.view_explorer()
    op, out = box.children[0], box.children[2]
    x = torch.arange(12.0).reshape(3, 4)
    first = out.value
    assert "<img" in first and "<code>x[::1]</code>" in first
    _select(box, step=2)
    assert out.value != first and "<code>x[::2]</code>" in out.value
    assert str(x[::2].stride()) in out.value and str(x.stride()) not in out.value
    assert "<td style=" in out.value  # the geometry table, as HTML
    op.value = "view or reshape of x.t()"
    assert [c.description for c in box.children[1].children] == ["method", "rows"]
    assert "x.t().view(4, -1)" in out.value and str(x.t().stride()) in out.value
    _select(box, rows=2)  # torch refuses: shown, not raised
    assert "torch raised RuntimeError" in out.value and "view size is not compatible" in out.value
    _select(box, method="reshape")  # a copy: strides of a fresh tensor
    assert "x.t().reshape(2, -1)" in out.value and "(6, 1)" in out.value
    # contiguous, same storage as x, _base is x
    assert re.findall(r">(True|False)</td>", out.value) == ["True", "False", "False"]
    _select(box, method="view", rows=4)  # a view of x: its _base is x, as in the notebook
    assert re.findall(r">(True|False)</td>", out.value) == ["False", "True", "True"]


def _px(width):
    assert width.endswith("px"), width
    return int(width[:-2])


def test_view_explorer_x_owns_its_storage_so_views_have_base_x():
    """The explorer's x is built like the notebook's (``.clone()``): every view's ``_base`` is x
    and the table says so; a view of a view of arange would say False."""
    box = viz.view_explorer()
    op, out = box.children[0], box.children[2]
    for name in ("slice", "transpose", "select", "expand", "unsqueeze", "diagonal", "as_strided"):
        op.value = name
        # the table's last two cells: same storage, _base is x
        assert re.findall(r">(True|False)</td>", out.value)[-2:] == ["True", "True"], name
    assert ".clone()" in out.value


def test_view_explorer_dropdowns_show_their_choices_whole():
    box = viz.view_explorer()
    op, args = box.children[0], box.children[1]
    start = next(d for d in args.children if d.description == "start")
    # ipywidgets shows a value of None as an empty box: the choice None must read "None"
    assert start.label == "None" and start.index == 0
    assert "<code>x[::1]</code>" in box.children[2].value
    start.value = 1
    assert "<code>x[1::1]</code>" in box.children[2].value
    start.index = 0
    assert "<code>x[::1]</code>" in box.children[2].value
    for name in viz.VIEW_OPS:
        op.value = name
        for d in [op, *args.children]:
            assert all(label != "" for label in d.options)
            assert d.label is not None and d.index is not None, (name, d.description)
            # wide enough for its description and its longest choice ("reshape" was cut)
            longest = max(len(label) for label in d.options)
            assert d.style.description_width == "initial"
            assert _px(d.layout.width) >= 7 * (len(d.description) + longest) + 40


@pytest.mark.parametrize("name", list(viz.VIEW_OPS))
def test_every_view_explorer_operation_applies_to_its_first_choices(name):
    spec, fn, _ = viz.VIEW_OPS[name]
    x = torch.arange(12.0).reshape(3, 4)
    v = fn(x, **{k: options[0] for k, options in spec.items()})
    assert v.untyped_storage().nbytes() == 48
    table = repr(viz.geometry_table({"v": v}, x))
    assert str(v.stride()) in table and str(tuple(v.shape)) in table


def _lines(html_value):
    return re.findall(r"<code>(.*?)</code>", html_value)


def test_tls_explorer_layout_does_not_cut_labels():
    box = viz.tls_explorer()
    for row in box.children[1:3]:
        label, *boxes = row.children
        assert label.value in ("TLS include +", "TLS exclude +")
        assert _px(label.layout.min_width) >= 7 * len(label.value)  # the row cannot squeeze it
        for c in boxes:
            assert c.layout.width == "auto" and _px(c.layout.min_width) >= 7 * len(c.description)
    for d in box.children[0].children:
        assert _px(d.layout.width) >= 7 * max(len(o) for o in d.options)
    out = box.children[3].value
    headers = re.findall(r"<th[^>]*>(.*?)</th>", out)
    assert len(headers) == 7 and all(headers), headers  # every column has a header
    assert headers[-1] == "outcome" and "runs</td>" in out


def test_state_table_marks_the_winner_and_a_raise():
    t = torch.ones(2)
    state = viz.dispatch_state(t, op="aten::add.Tensor")
    rows = [line.split() for line in repr(state.table()).splitlines()[3:]]  # caption, header
    assert [r[0] for r in rows if r[-1] == "runs"] == ["AutogradCPU"]
    ns = f"viz_test_outcome_{uuid.uuid4().hex[:6]}"
    lib = torch.library.Library(ns, "DEF")
    try:
        lib.define("probe(Tensor x) -> ()")
        lib.impl("probe", lambda x: None, "Meta")  # no CPU kernel: a CPU call below autograd
        state = viz.dispatch_state(t, op=f"{ns}::probe", exclude=["AutogradCPU"])
    finally:
        lib._destroy()
    assert state.winner == "CPU" and state.raises
    cpu_row = repr(state.table()).splitlines()[3].split()  # CPU: the lowest key, first row
    assert cpu_row[0] == "CPU" and cpu_row[-3:] == ["raises:", "no", "kernel"]


def test_tls_explorer_follows_its_controls():
    box = viz.tls_explorer()
    (tensor, op, context), include, exclude = (
        box.children[0].children,
        box.children[1].children[1:],
        box.children[2].children[1:],
    )
    out = box.children[3]

    def model():
        line = next(s for s in _lines(out.value) if s.startswith("model:"))
        predicted, ran = re.match(r"model: (.*) \| .*: (\S+)", line).groups()
        return predicted, ran

    assert model() == ("AutogradCPU", "AutogradCPU")
    next(c for c in exclude if c.description == "AutogradCPU").value = True
    assert model() == ("CPU", "CPU")
    next(c for c in include if c.description == "Python").value = True
    assert model() == ("Python", "Python")
    context.value = "torch.autocast('cpu')"
    op.value = "aten::mm"
    assert model() == ("AutocastCPU", "AutocastCPU")
    assert "AutocastCPU," not in _lines(out.value)[1]  # autocast un-excluded it
    context.value = "torch.inference_mode()"
    assert model() == ("Python", "Python")  # (no autocast, no autograd)
    tensor.value = "wrapper subclass (__torch_dispatch__)"
    assert model() == ("PythonTLSSnapshot", "PythonTLSSnapshot")
    op.value = "(no operator: the key set only)"
    assert "highest priority key: PythonTLSSnapshot" in _lines(out.value)
    assert C._dispatch_tls_local_include_set() == C.DispatchKeySet(
        C.DispatchKey.BackendSelect
    ) | C.DispatchKeySet(C.DispatchKey.ADInplaceOrView)  # the state was restored


@pytest.mark.parametrize("fallthrough", ["AutogradCPU", "AutogradMeta"])
def test_a_per_backend_fallthrough_counts_for_the_highest_backend_of_the_call(fallthrough):
    """A CPU and a meta tensor in one call: the fallthrough mask of the call's highest backend
    (Meta) decides, for every backend (``DispatchKeyExtractor::getDispatchKeySetUnboxed``)."""
    ns = f"viz_test_backend_{uuid.uuid4().hex[:6]}"
    lib = torch.library.Library(ns, "DEF")
    ran = []

    def record(key, x, y):
        ran.append(key)

    try:
        lib.define("probe(Tensor x, Tensor y) -> ()")
        for key in ("CPU", "Meta", "AutogradCPU", "AutogradMeta", "ADInplaceOrView"):
            if key == fallthrough:
                lib.impl("probe", torch.library.fallthrough_kernel, key)
            else:
                lib.impl("probe", functools.partial(record, key), key)
        x, y = torch.zeros(2), torch.empty(2, device="meta")
        state = viz.dispatch_state(x, y, op=f"{ns}::probe")
        getattr(torch.ops, ns).probe.default(x, y)
    finally:
        lib._destroy()
    assert (
        state.winner
        == ran[0]
        == {"AutogradCPU": "AutogradMeta", "AutogradMeta": "ADInplaceOrView"}[fallthrough]
    )
