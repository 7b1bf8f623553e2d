"""proxy/clients/validate.py against the straightforward algorithm it replaced (kept here as the reference): on random
nested JSON values and random field tables, both accept and refuse the same bodies with the same error (message,
`param` path of the first offender, status, code). Hypothesis draws the values; bodies nested to exactly MAX_DEPTH
and MAX_DEPTH + 1 (deep inside lists and objects) are built on purpose, as are wrong types at every level of a table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from proxy.clients.chat import CHAT_FIELDS, COMPLETIONS_FIELDS
from proxy.clients.responses import RESPONSES_FIELDS
from proxy.clients.validate import (
    ARRAY,
    BOOLEAN,
    INTEGER,
    MAX_DEPTH,
    NULL,
    NUMBER,
    OBJECT,
    SMALL_BODY,
    STRING,
    FieldTable,
    TypeSpec,
    check_depth,
    check_types,
    compile_table,
    json_type,
)
from proxy.errors import ClientRequestError

# ------------------------------------------------------------------------------------------- the reference
# The algorithm of proxy/clients/validate.py before the single-pass checks (commit 30046fd): a recursive walk of the
# whole body for the depth, then a recursive walk of the compiled table for the types. tests/bench/micro_validate.py
# times it as "before".

_ARTICLE = {STRING: "a string", NUMBER: "a number", INTEGER: "an integer", BOOLEAN: "a boolean",
            OBJECT: "an object", ARRAY: "an array", NULL: "null"}


def _describe(spec: tuple[str, ...]) -> str:
    names = [_ARTICLE.get(s, s) for s in spec]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


_PY_TYPES: dict[str, tuple[type, ...]] = {
    STRING: (str,), NUMBER: (int, float), INTEGER: (int,), BOOLEAN: (bool,), OBJECT: (dict,), ARRAY: (list,),
    NULL: (type(None),),
}


class _Node:
    __slots__ = ("children", "float_ints", "items", "py_types", "spec")

    def __init__(self) -> None:
        self.spec: tuple[str, ...] | None = None
        self.py_types: frozenset[type] = frozenset()
        self.float_ints = False
        self.children: dict[str, _Node] = {}
        self.items: _Node | None = None


def ref_compile_table(table: FieldTable) -> _Node:
    root = _Node()
    for path, spec in table.items():
        node = root
        for part in path.split("."):
            name, brackets = part, 0
            while name.endswith("[]"):
                name, brackets = name[:-2], brackets + 1
            if name:
                node = node.children.setdefault(name, _Node())
            for _ in range(brackets):
                if node.items is None:
                    node.items = _Node()
                node = node.items
        node.spec = (spec,) if isinstance(spec, str) else tuple(spec)
        node.py_types = frozenset(t for s in node.spec for t in _PY_TYPES[s])
        node.float_ints = INTEGER in node.spec and NUMBER not in node.spec
    return root


class _Bad(Exception):
    def __init__(self, node: _Node, value: Any) -> None:
        self.node = node
        self.value = value
        self.parts: list[str] = []


def ref_check_types(body: Mapping[str, Any], table: _Node | FieldTable) -> None:
    root = table if isinstance(table, _Node) else ref_compile_table(table)
    try:
        _check_children(body, root)
    except _Bad as bad:
        path = "".join(reversed(bad.parts)).lstrip(".")
        value = bad.value
        shown = repr(value) if not isinstance(value, dict | list) else json_type(value)
        assert bad.node.spec is not None
        raise ClientRequestError(
            f"`{path}` must be {_describe(bad.node.spec)}, got {shown:.80}.", param=path, code="invalid_parameter"
        ) from None


def _check_children(obj: Mapping[str, Any], node: _Node) -> None:
    children = node.children
    for name, value in obj.items():
        child = children.get(name)
        if child is not None:
            try:
                _check(value, child)
            except _Bad as bad:
                bad.parts.append("." + name)
                raise


def _check(value: Any, node: _Node) -> None:
    kind = type(value)
    if node.spec is not None and kind not in node.py_types and not (
        node.float_ints and kind is float and value.is_integer()
    ):
        raise _Bad(node, value)
    if kind is dict:
        if node.children:
            _check_children(value, node)
    elif kind is list and node.items is not None:
        items = node.items
        for i, item in enumerate(value):
            try:
                _check(item, items)
            except _Bad as bad:
                bad.parts.append(f"[{i}]")
                raise


def ref_check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    if not _within(value, limit):
        raise ClientRequestError(
            f"The request body nests objects and arrays more than {limit} levels deep; the limit is {limit}.",
            code="invalid_json",
        )


def _within(value: Any, left: int) -> bool:
    if left <= 0:
        return False
    children = value.values() if type(value) is dict else value if type(value) is list else ()
    for child in children:
        kind = type(child)
        if (kind is dict or kind is list) and not _within(child, left - 1):
            return False
    return True


# ----------------------------------------------------------------------------------------------- the checks

def outcome(check: Any, *args: Any, **kw: Any) -> tuple[str, str | None, int, str] | None:
    """None when accepted, else what the client sees of the error."""
    try:
        check(*args, **kw)
    except ClientRequestError as err:
        return err.message, err.param, err.status, err.code
    return None


TYPES = [STRING, NUMBER, INTEGER, BOOLEAN, OBJECT, ARRAY, NULL]
NAMES = ["a", "b", "c"]
KEYS = st.sampled_from([*NAMES, "x"])  # "x" is in no table: passes through unchecked

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(), st.floats(allow_nan=False),
    st.integers(-5, 5).map(float),  # integral floats: an integer where INTEGER is allowed
    st.sampled_from([0, 1, 0.0, 1.0, 1.5, False, True]),  # equal (==) values of different types
    st.text(max_size=4),
)
json_values = st.recursive(
    _scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(KEYS, kids, max_size=4), max_leaves=24
)


@st.composite
def type_specs(draw: st.DrawFn) -> TypeSpec:
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True))
    return types[0] if len(types) == 1 and draw(st.booleans()) else tuple(types)


_segment = st.tuples(st.sampled_from(NAMES), st.integers(0, 2)).map(lambda s: s[0] + "[]" * s[1])
paths = st.lists(_segment, min_size=1, max_size=4).map(".".join)
tables = st.dictionaries(paths, type_specs(), min_size=2, max_size=14)


def _scalar_of(kind: str) -> st.SearchStrategy[Any]:
    return {STRING: st.text(max_size=4), NUMBER: st.integers(-3, 3) | st.floats(allow_nan=False),
            INTEGER: st.integers(-3, 3) | st.integers(-3, 3).map(float) | st.sampled_from([0, 1, 0.0, 1.0]),
            BOOLEAN: st.booleans(),
            NULL: st.none()}[kind]


@st.composite
def shaped(draw: st.DrawFn, node: _Node, depth: int = 0) -> Any:
    """A value that follows the compiled table below `node`, with any value instead (often of a wrong type) at
    about one place in four (mostly of a type that the place does not allow), at any level: several offenders,
    in a random order. The top level is an object."""
    if depth > 0 and (depth > 6 or draw(st.integers(0, 3)) == 0):
        wrong = [kind for kind in TYPES if node.spec is not None and kind not in node.spec]
        if wrong and draw(st.integers(0, 3)):
            kind = draw(st.sampled_from(wrong))
            return draw(st.dictionaries(KEYS, json_values, max_size=2) if kind == OBJECT else
                        st.lists(json_values, max_size=2) if kind == ARRAY else _scalar_of(kind))
        return draw(json_values)
    kind = draw(st.sampled_from(node.spec or (OBJECT, ARRAY))) if depth > 0 else OBJECT
    if kind == OBJECT:
        keys = draw(st.lists(st.sampled_from([*node.children, "x"]), unique=True, min_size=depth == 0, max_size=4))
        return {k: draw(shaped(node.children[k], depth + 1)) if k in node.children else draw(json_values)
                for k in keys}
    if kind == ARRAY:
        items = node.items
        return [draw(shaped(items, depth + 1)) if items is not None else draw(json_values)
                for _ in range(draw(st.integers(0, 3)))]
    return draw(_scalar_of(kind))


@st.composite
def table_and_body(draw: st.DrawFn) -> tuple[dict[str, TypeSpec], dict[str, Any]]:
    table = draw(tables)
    return table, draw(shaped(ref_compile_table(table)))


@settings(max_examples=1000, deadline=None, database=None)
@given(table_and_body())
def test_types_as_the_reference(case: tuple[dict[str, TypeSpec], dict[str, Any]]) -> None:
    table, body = case
    expected = outcome(ref_check_types, body, table)
    event("refused" if expected else "accepted")
    assert outcome(check_types, body, table) == expected
    assert outcome(check_types, body, compile_table(table)) == expected
    if expected is not None:
        event(f"offender {expected[1].count('.') + expected[1].count('[')} levels down")


@settings(max_examples=300, deadline=None, database=None)
@given(tables, st.dictionaries(KEYS, json_values, max_size=5))
def test_types_on_any_body_as_the_reference(table: dict[str, TypeSpec], body: dict[str, Any]) -> None:
    assert outcome(check_types, body, table) == outcome(ref_check_types, body, table)


@pytest.mark.parametrize("fields", [CHAT_FIELDS, COMPLETIONS_FIELDS, RESPONSES_FIELDS], ids=["chat", "completions",
                                                                                               "responses"])
@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data())
def test_types_on_the_spokes_tables_as_the_reference(fields: dict[str, TypeSpec], data: st.DataObject) -> None:
    body = data.draw(shaped(ref_compile_table(fields)))
    assert outcome(check_types, body, compile_table(fields)) == outcome(ref_check_types, body, fields)


def test_the_first_offender_is_the_first_in_the_body() -> None:
    table = {"a": ARRAY, "a[]": OBJECT, "a[].b": INTEGER, "c": STRING}
    same = {"b": "x"}
    body = {"a": [{"b": 1}, {"b": 2.0}, same, {"b": True}, same], "c": 3}
    assert outcome(check_types, body, table) == outcome(ref_check_types, body, table)
    assert outcome(check_types, body, table)[1] == "a[2].b"  # type: ignore[index]
    body = {"c": 3, "a": [{"b": "x"}]}
    assert outcome(check_types, body, table)[1] == "c"  # type: ignore[index]
    table = {"n": ARRAY, "n[]": INTEGER}
    body = {"n": [1, 1.0, True, 1]}  # True == 1 == 1.0: the offender's place is found by identity
    assert outcome(check_types, body, table) == outcome(ref_check_types, body, table)
    assert outcome(check_types, body, table)[1] == "n[2]"  # type: ignore[index]


# -------------------------------------------------------------------------------------------------- depth

SIZES = [None, 0, SMALL_BODY, SMALL_BODY + 1, 10**6]  # the walk, and orjson's pass (None: size unknown)


def check_depth_every_way(value: Any, limit: int = MAX_DEPTH) -> Any:
    """check_depth's outcome, the same whichever way it takes (walk or orjson), on the value and on its JSON."""
    outcomes = {outcome(check_depth, value, limit, size=size) for size in SIZES}
    assert len(outcomes) == 1, outcomes
    return outcomes.pop()


@st.composite
def chains(draw: st.DrawFn, levels: st.SearchStrategy[int]) -> Any:
    """`levels` objects and arrays, each inside the one before, with random siblings at every level; innermost a
    random value (a scalar or an empty or full object or array: one more level)."""
    value = draw(st.one_of(_scalars, st.just([]), st.just({}), st.lists(_scalars, min_size=1, max_size=2)))
    for _ in range(draw(levels)):
        before = draw(st.lists(_siblings, max_size=2))
        after = draw(st.lists(_siblings, max_size=2))
        if draw(st.booleans()):
            value = [*before, value, *after]
        else:
            value = {f"k{i}": v for i, v in enumerate([*before, value, *after])}
    return value


_siblings = st.one_of(_scalars, st.lists(_scalars, max_size=2), st.dictionaries(KEYS, _scalars, max_size=2))


def nesting(value: Any) -> int:
    if isinstance(value, dict | list):
        return 1 + max(map(nesting, value.values() if isinstance(value, dict) else value), default=0)
    return 0


@settings(max_examples=200, deadline=None, database=None)
@given(chains(st.integers(MAX_DEPTH - 3, MAX_DEPTH + 2)), st.sampled_from([False, True]))
def test_depth_around_the_limit_as_the_reference(value: Any, parsed: bool) -> None:
    if parsed:  # as the proxy has it: what orjson parsed (integers beyond 64 bits are not JSON it serialises)
        value = orjson.loads(orjson.dumps(value)) if all_ints_fit(value) else value
    expected = outcome(ref_check_depth, value)
    assert (expected is None) == (nesting(value) <= MAX_DEPTH)
    assert check_depth_every_way(value) == expected


@settings(max_examples=500, deadline=None, database=None)
@given(json_values, st.integers(-1, 6))
def test_depth_of_any_value_and_limit_as_the_reference(value: Any, limit: int) -> None:
    assert check_depth_every_way(value, limit) == outcome(ref_check_depth, value, limit)


def all_ints_fit(value: Any) -> bool:
    if isinstance(value, dict | list):
        return all(map(all_ints_fit, value.values() if isinstance(value, dict) else value))
    return not isinstance(value, int) or isinstance(value, bool) or -(2**63) <= value < 2**64


@pytest.mark.parametrize("levels", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1])
@pytest.mark.parametrize("inner", ["x", [], {}, [1], {"k": None}], ids=["scalar", "[]", "{}", "[1]", "{k}"])
@pytest.mark.parametrize("kind", ["arrays", "objects", "mixed"])
def test_depth_exactly_at_the_limit(levels: int, inner: Any, kind: str) -> None:
    """`levels` levels around `inner`, placed late in a large realistic body (the last tool's schema)."""
    value = inner
    for i in range(levels - 3):  # the body, "tools" and the tool are three levels
        as_list = kind == "arrays" or (kind == "mixed" and i % 2 == 0)
        value = ["s", 2, value] if as_list else {"type": "object", "a": value, "z": [1]}
    tools = [{"name": f"t{i}", "parameters": {"type": "object", "properties": {"p": {"type": "string"}}}}
             for i in range(40)]
    body = {"model": "m", "messages": [{"role": "user", "content": "hi " * 50}] * 10, "tools": [*tools, value]}
    assert len(orjson.dumps(body)) > SMALL_BODY
    expected = outcome(ref_check_depth, body)
    assert (expected is None) == (nesting(body) <= MAX_DEPTH)
    assert check_depth_every_way(body) == expected
