"""Types of a client's request, checked once at the edge: a wrong type is a 400 naming the parameter, never a 500
from deep inside a dialect spoke.

A client spoke declares a table of the fields it knows (dotted paths, `[]` for "each item of the list") and the
JSON types each may have; `check_types(body, table)` walks the body along the table and raises `ClientRequestError`
with `param` set to the concrete path of the first offender (`messages[3].role`, `stream_options.include_usage`):

    CHAT_FIELDS = {
        "model": STRING,
        "stream": (BOOLEAN, NULL),
        "stream_options": (OBJECT, NULL),
        "stream_options.include_usage": (BOOLEAN, NULL),
        "messages": ARRAY,
        "messages[]": OBJECT,
        "messages[].role": STRING,
        ...
    }

Fields the table does not name pass through unchecked (an OpenAI upstream may know them); a path under a value of
another type is not checked (its parent's own entry decides). `check_depth` bounds JSON nesting before anything
serialises the body (orjson parses 1024 levels but serialises only 254).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ClientRequestError

STRING = "string"
NUMBER = "number"
INTEGER = "integer"
BOOLEAN = "boolean"
OBJECT = "object"
ARRAY = "array"
NULL = "null"

TypeSpec = str | tuple[str, ...]
FieldTable = Mapping[str, TypeSpec]

# Deep enough for any real request (a tool's JSON schema nests a few levels per property), far below the 254 levels
# that orjson can serialise.
MAX_DEPTH = 64


def json_type(value: Any) -> str:
    """The JSON type name of a parsed value (bool is not a number; an integral float such as 2.0 is an integer)."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, int):
        return INTEGER
    if isinstance(value, float):
        return INTEGER if value.is_integer() else NUMBER
    if isinstance(value, str):
        return STRING
    if isinstance(value, list):
        return ARRAY
    if isinstance(value, dict):
        return OBJECT
    return type(value).__name__


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
    """One level of the compiled table: the types allowed here, and the checks below."""

    __slots__ = ("children", "float_ints", "items", "py_types", "spec")

    def __init__(self) -> None:
        self.spec: tuple[str, ...] | None = None
        self.py_types: frozenset[type] = frozenset()  # exact Python types accepted (bool is not an int here)
        self.float_ints = False  # an integral float (2.0) counts as an integer
        self.children: dict[str, _Node] = {}
        self.items: _Node | None = None


def compile_table(table: FieldTable) -> _Node:
    """A field table -> a tree that `check_types` walks (compile once per spoke, at import)."""
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
    """A wrong type, on its way up: each level adds its segment of the path (built only when there is an error)."""

    def __init__(self, node: _Node, value: Any) -> None:
        self.node = node
        self.value = value
        self.parts: list[str] = []


def check_types(body: Mapping[str, Any], table: _Node | FieldTable) -> None:
    """Raise a 400 naming the first field of `body` whose type the table does not allow."""
    root = table if isinstance(table, _Node) else compile_table(table)
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


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise a 400 when objects and arrays nest deeper than `limit` (recursion at most `limit` deep)."""
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
