"""Priority classes as declared: the pure rules (core/base/classes.py), ``spec.classes`` in the spec
model, and the CRD generated from it admitting and refusing what the model does."""

from __future__ import annotations

import pytest

from judgequeue.core.base.classes import DEFAULT_CLASSES, JobClass, check_class_name, parse_class_list
from judgequeue.core.base.errors import InvalidClass
from judgequeue.core.spec import JudgeQueueSpec, parse_spec
from tests.support.kube_schema import admit, load_crd, schema_of
from tests.unit.test_crd import MINIMAL, with_spec


def test_the_cli_form_gives_shares_below_the_first() -> None:
    assert parse_class_list(["contest", "practice:10", "rejudge"]) == (
        JobClass("contest", 0), JobClass("practice", 10), JobClass("rejudge", 5)
    )
    assert parse_class_list(["only"]) == (JobClass("only"),)


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ([], "declare 1 to 16 classes, got 0"),
        ([f"c{i}" for i in range(17)], "declare 1 to 16 classes, got 17"),
        (["a", "B"], r"classes\[1\].name: 'B' is not a DNS label"),
        (["a", "b", "a"], r"classes\[2\].name: 'a' is declared twice"),
        (["a:3", "b"], r"classes\[0\].share: the first class goes first anyway"),
        (["a", "b:101"], r"classes\[1\].share: must be a whole percent 0-100, got 101"),
        (["a", "b:x"], r"classes\[1\]: share 'x' is not a whole percent"),
        (["a", "b:60", "c:50"], "the shares sum to 110%, over 100%"),
    ],
)
def test_invalid_classes_are_refused_naming_the_field(words: list[str], message: str) -> None:
    with pytest.raises(InvalidClass, match=message):
        parse_class_list(words)


def test_a_name_the_queue_does_not_declare_is_refused_with_the_list() -> None:
    check_class_name(None, DEFAULT_CLASSES, "q")
    check_class_name("default", DEFAULT_CLASSES, "q")
    with pytest.raises(InvalidClass, match=r"class 'contest' is not a class of queue 'q' \(one of default\)"):
        check_class_name("contest", DEFAULT_CLASSES, "q")


def _parsed(**sections: object) -> JudgeQueueSpec | list[str]:
    return parse_spec(with_spec(**sections)["spec"], name="judge")


def test_the_spec_defaults_to_one_class_and_reads_declared_ones() -> None:
    plain = parse_spec(MINIMAL["spec"], name="judge")
    assert isinstance(plain, JudgeQueueSpec) and plain.classes == DEFAULT_CLASSES
    spec = _parsed(classes=[{"name": "contest"}, {"name": "practice", "share": 20}, {"name": "rejudge"}])
    assert isinstance(spec, JudgeQueueSpec)
    assert spec.classes == (JobClass("contest"), JobClass("practice", 20), JobClass("rejudge", 5))


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        ("contest", "spec.classes: must be a list"),
        ([{"name": "a"}, {"name": "a"}], r"spec.classes\[1\].name: 'a' is declared twice"),
        ([{"name": "a", "weight": 3}], r"spec.classes\[0\].weight: unknown field"),
        ([{"name": "a"}, {"name": "b", "share": 70}, {"name": "c", "share": 40}], "sum to 110%"),
    ],
)
def test_a_bad_spec_names_the_field(classes: object, message: str) -> None:
    errors = _parsed(classes=classes)
    assert isinstance(errors, list) and any(__import__("re").search(message, e) for e in errors), errors


def test_the_crd_admits_classes_and_refuses_what_its_schema_can_see() -> None:
    _, errors = admit(with_spec(classes=[{"name": "contest"}, {"name": "rejudge", "share": 10}]))
    assert errors == []
    _, errors = admit(with_spec(classes=[{"name": "Contest"}]))
    assert errors and "classes" in errors[0]
    _, errors = admit(with_spec(classes=[{"name": "a", "share": 101}]))
    assert errors and "share" in errors[0]
    # An empty list: minItems, enforced by the API server (the model refuses it too, above).
    classes = schema_of(load_crd())["properties"]["spec"]["properties"]["classes"]
    assert (classes["minItems"], classes["maxItems"], classes["x-kubernetes-list-map-keys"]) == (1, 16, ["name"])
    assert isinstance(_parsed(classes=[]), list)
