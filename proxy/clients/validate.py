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

Both run on every request, on bodies of 100 KB and more from agent clients, so both are cheap without changing an
answer: the type walk visits only what the table names and checks scalars inline; the depth bound lets orjson's
own serialisation limit do the walk in C for a body above `SMALL_BODY` bytes (tests/test_validate_equivalence.py
holds them to the plain recursive algorithms; tests/bench/micro_validate.py times both).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Final

import orjson

from proxy.errors import ClientRequestError

STRING: Final = "string"
NUMBER: Final = "number"
INTEGER: Final = "integer"
BOOLEAN: Final = "boolean"
OBJECT: Final = "object"
ARRAY: Final = "array"
NULL: Final = "null"

TypeSpec = str | tuple[str, ...]
FieldTable = Mapping[str, TypeSpec]

# Deep enough for any real request (a tool's JSON schema nests a few levels per property), far below the 254 levels
# that orjson can serialise.
MAX_DEPTH: Final = 64
# Up to this many bytes of JSON text, `check_depth` walks the body: cheaper than orjson's pass (tests/bench/
# micro_validate.py).
SMALL_BODY: Final = 1024


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


_ARTICLE: Final = {STRING: "a string", NUMBER: "a number", INTEGER: "an integer", BOOLEAN: "a boolean",
                   OBJECT: "an object", ARRAY: "an array", NULL: "null"}


def _describe(spec: tuple[str, ...]) -> str:
    names = [_ARTICLE.get(s, s) for s in spec]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


_PY_TYPES: Final[dict[str, tuple[type, ...]]] = {
    STRING: (str,), NUMBER: (int, float), INTEGER: (int,), BOOLEAN: (bool,), OBJECT: (dict,), ARRAY: (list,),
    NULL: (type(None),),
}


class _Node:
    """One level of the compiled table: the types allowed here, and the checks below."""

    __slots__ = ("children", "float_ints", "inner", "items", "leaves", "py_types", "spec")

    def __init__(self) -> None:
        self.spec: tuple[str, ...] | None = None
        self.py_types: frozenset[type] = frozenset()  # exact Python types accepted (bool is not an int here)
        self.float_ints = False  # an integral float (2.0) counts as an integer
        self.children: dict[str, _Node] = {}
        self.items: _Node | None = None
        # the children split for the walk: a plain leaf needs only its types; the others the full check
        self.leaves: dict[str, frozenset[type]] = {}
        self.inner: dict[str, _Node] = {}


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
    _split(root)
    return root


def _split(node: _Node) -> None:
    for name, child in node.children.items():
        if child.spec is not None and not child.float_ints and not child.children and child.items is None:
            node.leaves[name] = child.py_types
        else:
            node.inner[name] = child
        _split(child)
    if node.items is not None:
        _split(node.items)


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


# The walk is depth first in the body's own order (so the first offender is the first in the body), one call per
# object or array that the table reaches (a scalar is checked inline by its parent); the path of an offender is
# built on the way up, from the loop variable that holds it when the error passes.

def _check_children(obj: Mapping[str, Any], node: _Node) -> None:
    leaves, inner = node.leaves, node.inner
    try:
        for name, value in obj.items():
            allowed = leaves.get(name)
            if allowed is not None:
                if type(value) in allowed:
                    continue
                raise _Bad(node.children[name], value)
            child = inner.get(name)
            if child is None:
                continue
            kind = type(value)
            if kind not in child.py_types and child.spec is not None and not (
                child.float_ints and kind is float and value.is_integer()
            ):
                raise _Bad(child, value)
            if kind is dict:
                if child.children:
                    _check_children(value, child)
            elif kind is list and child.items is not None:
                _check_items(value, child.items)
    except _Bad as bad:
        bad.parts.append("." + name)
        raise


def _check_items(items: list[Any], node: _Node) -> None:
    py_types, spec, children, below = node.py_types, node.spec, node.children, node.items
    try:
        for item in items:
            kind = type(item)
            if kind not in py_types and spec is not None and not (
                node.float_ints and kind is float and item.is_integer()
            ):
                raise _Bad(node, item)
            if kind is dict:
                if children:
                    _check_children(item, node)
            elif kind is list and below is not None:
                _check_items(item, below)
    except _Bad as bad:
        # the first place of the offending object: an earlier place holding the same object would have failed first
        bad.parts.append(f"[{next(i for i, other in enumerate(items) if other is item)}]")
        raise


def check_depth(value: Any, limit: int = MAX_DEPTH, *, size: int | None = None) -> None:
    """Raise a 400 when objects and arrays nest deeper than `limit` (`size`: the length of the JSON text, if known).

    Two exact ways, the cheaper one for the size: a walk in Python (recursion at most `limit` deep) for a body of
    at most `SMALL_BODY` bytes; for a larger (or unknown) one, orjson: it serialises at most `_ORJSON_DEPTH` levels
    (every object and array is one), so a value it serialises inside `_ORJSON_DEPTH - limit` more levels of arrays
    nests at most `limit` deep (one pass in C, several times cheaper than the walk on a large body). When it does
    not (too deep, or something orjson cannot serialise), the walk decides."""
    if (size is None or size > SMALL_BODY) and 0 < limit <= _ORJSON_DEPTH and _serialises_within(
        value, _ORJSON_DEPTH - limit
    ):
        return
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


def _orjson_depth() -> int:
    """How many levels of objects and arrays orjson serialises (254 in orjson 3), found by trying; 0 (no fast
    path in `check_depth`) unless objects and arrays count alike and the bound lies below 4096 levels."""

    def serialises(levels: int, kind: type) -> bool:
        value: Any = None
        for _ in range(levels):
            value = {"k": value} if kind is dict else [value]
        try:
            orjson.dumps(value)
        except orjson.JSONEncodeError:
            return False
        return True

    found = []
    for kind in (list, dict):
        fits, fails = 1, 4096  # invariant: `fits` levels serialise, `fails` levels do not
        if not serialises(fits, kind) or serialises(fails, kind):
            return 0
        while fails - fits > 1:
            mid = (fits + fails) // 2
            fits, fails = (mid, fails) if serialises(mid, kind) else (fits, mid)
        found.append(fits)
    return found[0] if found[0] == found[1] else 0


_ORJSON_DEPTH: Final = _orjson_depth()
_wrappers: Final = threading.local()  # per thread: the arrays around the value (orjson runs no Python code meanwhile)


def _serialises_within(value: Any, levels: int) -> bool:
    """Whether orjson serialises `value` inside `levels` more levels of arrays (0 levels: the value alone)."""
    if levels == 0:
        wrapped: Any = value
        inner: list[Any] | None = None
    else:
        chain = getattr(_wrappers, "chain", None)
        if chain is None or chain[2] != levels:  # `levels` arrays, each the only item of the one before
            outer = inner = [None]
            for _ in range(levels - 1):
                outer = [outer]
            chain = _wrappers.chain = (outer, inner, levels)
        wrapped, inner = chain[0], chain[1]
        inner[0] = value
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError:
        return False
    finally:
        if inner is not None:
            inner[0] = None
    return True
