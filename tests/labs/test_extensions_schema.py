"""extensions.schema: plausible wrong parse_schema answers fail, called directly through
run_checks. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
from tests.conftest import assert_rejected, load_answer

EX = "extensions.schema"


def _wrong(**changes):
    """The reference parse_schema with the fields of ``changes`` recomputed wrongly."""
    parse = load_answer(EX)

    def parse_schema(text):
        found = parse(text)
        for field, fn in changes.items():
            found[field] = fn(text, found)
        return found
    return parse_schema


def test_every_written_argument_does_not_make_an_in_place_schema():
    # add.out's `out` is written: kind out, not inplace
    answer = _wrong(kind=lambda text, found: "inplace" if found["mutated"] else "functional")
    assert_rejected(EX, answer, "['kind'] is 'inplace'; expected 'out'")


def test_keyword_only_arguments_are_those_after_the_star():
    answer = _wrong(positional=lambda t, f: f["positional"] + f["kwarg_only"],
                    kwarg_only=lambda t, f: [])
    assert_rejected(EX, answer, "a lone '*'")


def test_a_mutable_self_without_an_underscore_is_functional():
    # torchgen looks at the positional arguments after self only (set_data mutates self)
    answer = _wrong(kind=lambda t, f: "mutable" if f["kind"] == "functional" and f["mutated"]
                    else f["kind"])
    assert_rejected(EX, answer, "set_data")


def test_a_return_alias_is_found_by_alias_set_not_by_position():
    answer = _wrong(returns_alias=lambda t, f: [f["positional"][0] if "(" in r else None
                                                 for r in t.split(" -> ")[1].split(",")])
    assert_rejected(EX, answer, "returns_alias")
