"""compile.partitioner: plausible wrong answers fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
from functorch.compile import default_partition, min_cut_rematerialization_partition
from torch._functorch.partitioners import _extract_fwd_bwd_modules

import labs.compile.checks.partitioner  # noqa: F401  (registers the checks)
from tests.conftest import assert_rejected

EX = "compile.partitioner"


def _backward_reads(graph):
    """The forward nodes that backward nodes read directly (no recompute at all)."""
    backward, read = set(), []
    for node in graph.nodes:
        if node.op == "placeholder" and node.target.startswith("tangents"):
            backward.add(node)
        elif node.op != "output" and any(a in backward for a in node.all_input_nodes):
            backward.add(node)
            read += [a for a in node.all_input_nodes if a not in backward and a not in read]
    order = list(graph.nodes)
    return sorted(read, key=order.index)


def test_calling_default_partition_is_refused(reference):
    class Library(reference(EX)):
        def __call__(self, joint_module, joint_inputs, **kwargs):
            return default_partition(joint_module, joint_inputs, **kwargs)

    assert_rejected(EX, Library, "choose what to save yourself")


def test_calling_min_cut_is_refused(reference):
    class Library(reference(EX)):
        def __call__(self, joint_module, joint_inputs, **kwargs):
            return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)

    assert_rejected(EX, Library, "called min_cut_rematerialization_partition")


def test_saving_everything_backward_reads_is_not_fewer_bytes(reference):
    class SaveAll(reference(EX)):
        def __call__(self, joint_module, joint_inputs, *, num_fwd_outputs, **kwargs):
            saved = _backward_reads(joint_module.graph)
            return _extract_fwd_bwd_modules(joint_module, saved, saved_sym_nodes=[],
                                            num_fwd_outputs=num_fwd_outputs)

    assert_rejected(EX, SaveAll, "yours / default / min-cut")


def _greedy_saved(graph, recomputable):
    """The forward values a greedy walk back from what backward reads saves: a primal or a
    value that is not recomputable is saved, a recomputable one is recomputed from its inputs
    (the lab's first reference, which saved twice min-cut's bytes on some chains)."""
    reads, saved, seen = _backward_reads(graph), set(), set()

    def need(node):
        if node not in seen:
            seen.add(node)
            if node.op == "placeholder" or not recomputable(node):
                saved.add(node)
            else:
                for arg in node.all_input_nodes:
                    need(arg)

    for node in reads:
        need(node)
    return [n for n in graph.nodes if n in saved]


def test_a_greedy_walk_that_saves_more_than_min_cut_fails(reference):
    """At seed 1234 a hidden chain linear+add+add+tanh+cos: the greedy walk saves the linear's
    output and y (192 bytes, what default_partition saves), min-cut the add's output (128)."""
    class Greedy(reference(EX)):
        def __call__(self, joint_module, joint_inputs, *, num_fwd_outputs, **kwargs):
            saved = _greedy_saved(joint_module.graph, self.recomputable)
            return _extract_fwd_bwd_modules(joint_module, saved, saved_sym_nodes=[],
                                            num_fwd_outputs=num_fwd_outputs)

    v = assert_rejected(EX, Greedy, "A cheaper choice exists", seed=1234)
    assert "yours / default / min-cut: 192 / 192 / 128" in v.message, v.message


def test_recomputing_the_matmul_fails_however_few_bytes_it_saves(reference):
    """Saving only the primals (the inputs) saves fewer bytes than min-cut, by running the
    matmul again in backward."""
    class Primals(reference(EX)):
        def __call__(self, joint_module, joint_inputs, *, num_fwd_outputs, **kwargs):
            graph = joint_module.graph
            saved = [n for n in graph.nodes
                     if n.op == "placeholder" and n.target.startswith("primals")]
            return _extract_fwd_bwd_modules(joint_module, saved, saved_sym_nodes=[],
                                            num_fwd_outputs=num_fwd_outputs)

    assert_rejected(EX, Primals, "neither pointwise nor a view")


def test_saving_nothing_fails_and_says_save_more(reference):
    class SaveNothing(reference(EX)):
        def __call__(self, joint_module, joint_inputs, *, num_fwd_outputs, **kwargs):
            return _extract_fwd_bwd_modules(joint_module, [], saved_sym_nodes=[],
                                            num_fwd_outputs=num_fwd_outputs)

    assert_rejected(EX, SaveNothing, "was invalid, but is output")


def test_saved_that_includes_the_user_outputs_is_refused(reference):
    ref = reference(EX)

    class WithOutputs(ref):
        def saved(self, fn, *inputs):
            found = {}

            def partition(joint, joint_inputs, **kwargs):
                found["fw"], bw = self(joint, joint_inputs, **kwargs)
                return found["fw"], bw

            from functorch.compile import aot_function, nop

            aot_function(fn, nop, nop, partition_fn=partition)(*inputs)
            outs = next(iter(found["fw"].graph.find_nodes(op="output"))).args[0]
            return [(tuple(n.meta["val"].shape), n.meta["val"].dtype) for n in outs]

    assert_rejected(EX, WithOutputs, "after the first num_fwd_outputs")


def test_saved_that_always_uses_default_partition_is_refused(reference):
    ref = reference(EX)

    class DefaultSaved(ref):
        def saved(self, fn, *inputs):
            return ref.saved(default_partition_partitioner(), fn, *inputs)

    class default_partition_partitioner(ref):
        def __call__(self, joint_module, joint_inputs, **kwargs):
            return default_partition(joint_module, joint_inputs, **kwargs)

    assert_rejected(EX, DefaultSaved, "for your partitioner, saved(")


def test_saved_that_ignores_self_is_refused(reference):
    ref = reference(EX)

    class FreshSaved(ref):
        def saved(self, fn, *inputs):
            return ref.saved(ref(), fn, *inputs)  # not self: a subclass's partition is ignored

    v = assert_rejected(EX, FreshSaved, "a subclass whose __call__ is default_partition")
    assert v.message.startswith("hidden check 4/4")


def test_a_function_instead_of_a_class_is_refused():
    assert_rejected(EX, default_partition, "define it as a class")
