"""proxy/validate.py against the straightforward algorithm it replaced (kept here as the reference): on random
nested JSON values and random field tables, both accept and refuse the same bodies with the same error (message,
`param` path of the first offender, status, code). Hypothesis draws the values; bodies nested to exactly MAX_DEPTH
and MAX_DEPTH + 1 (deep inside lists and objects) are built on purpose, as are wrong types at every level of a table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.errors import ClientRequestError
from proxy.validate import (
    ARRAY,
    BOOLEAN,
    INTEGER,
    MAX_DEPTH,
    NULL,
    NUMBER,
    OBJECT,
    STRING,
    FieldTable,
    json_type,
)

# ------------------------------------------------------------------------------------------- the reference
# The algorithm of proxy/validate.py before the single-pass checks (commit 30046fd): a recursive walk of the whole
# body for the depth, then a recursive walk of the compiled table for the types. tests/bench/micro_validate.py
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
