"""extensions.codegen: plausible wrong kernels_for answers fail, and the reference agrees with
the dispatcher on every entry of the shipped native_functions.yaml."""
from labs.extensions.checks import codegen
from tests.conftest import assert_rejected, load_answer

EX = "extensions.codegen"


def test_the_reference_matches_the_dispatcher_on_every_entry_of_the_yaml():
    kernels_for = load_answer(EX)
    wrong = [codegen.name_of(e) for e in codegen.entries()
             if kernels_for(e) != codegen.real(codegen.name_of(e))]
    assert len(codegen.entries()) > 2500 and wrong == []


def test_without_the_in_place_meta_rule():
    reference = load_answer(EX)

    def kernels_for(entry):  # forgets torchgen's inplace_meta (relu_ has a Meta kernel)
        found = reference(entry)
        if "Meta" in found and not entry.get("structured") and not entry.get(
                "structured_delegate") and "Meta" not in str(entry.get("dispatch")):
            found.remove("Meta")
        return found
    assert_rejected(EX, kernels_for, "(missing: Meta)")


def test_an_empty_dispatch_is_not_composite_implicit():
    reference = load_answer(EX)

    def kernels_for(entry):  # `dispatch: {}` read as no dispatch at all
        if not entry.get("dispatch") and not entry.get("structured_delegate"):
            return sorted(set(reference(entry)) | {"CompositeImplicitAutograd"})
        return reference(entry)
    assert_rejected(EX, kernels_for, "not registered: CompositeImplicitAutograd")
