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


def _accepts(spec: tuple[str, ...], value: Any) -> bool:
    kind = json_type(value)
    return kind in spec or (kind == INTEGER and NUMBER in spec)


_ARTICLE = {STRING: "a string", NUMBER: "a number", INTEGER: "an integer", BOOLEAN: "a boolean",
            OBJECT: "an object", ARRAY: "an array", NULL: "null"}


def _describe(spec: tuple[str, ...]) -> str:
    names = [_ARTICLE.get(s, s) for s in spec]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


class _Node:
    """One level of the compiled table: the types allowed here, and the checks below."""

    __slots__ = ("children", "items", "spec")

    def __init__(self) -> None:
        self.spec: tuple[str, ...] | None = None
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
    return root


def check_types(body: Mapping[str, Any], table: _Node | FieldTable) -> None:
    """Raise a 400 naming the first field of `body` whose type the table does not allow."""
    root = table if isinstance(table, _Node) else compile_table(table)
    _check_children(body, root, "")


def _check_children(obj: Mapping[str, Any], node: _Node, prefix: str) -> None:
    for name, child in node.children.items():
        if name in obj:
            _check(obj[name], child, f"{prefix}.{name}" if prefix else name)


def _check(value: Any, node: _Node, path: str) -> None:
    if node.spec is not None and not _accepts(node.spec, value):
        shown = repr(value) if not isinstance(value, dict | list) else json_type(value)
        raise ClientRequestError(
            f"`{path}` must be {_describe(node.spec)}, got {shown:.80}.", param=path, code="invalid_parameter"
        )
    if node.children and isinstance(value, dict):
        _check_children(value, node, path)
    elif node.items is not None and isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, node.items, f"{path}[{i}]")


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise a 400 when objects and arrays nest deeper than `limit` (iterative: no recursion limit to hit)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            raise ClientRequestError(
                f"The request body nests objects and arrays {limit + 1} or more levels deep; the limit is {limit}.",
                code="invalid_json",
            )
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
