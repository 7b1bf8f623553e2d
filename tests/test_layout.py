"""The tree shows its parts (proxy/*/__init__.py, docs/development.md "Layout"): each part imports only the parts below
it, in the order ORDER writes down, and no part reaches itself again through others (no cycle, however long).

Imports under `if TYPE_CHECKING:` are types, not dependencies, and are not counted; an import inside a function is
(it runs). A new edge that breaks a rule is either a design change (then change the rule here, ORDER, the part's
`__init__` docstring and docs/development.md together) or a module in the wrong folder.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PROXY = Path(__file__).resolve().parent.parent / "proxy"

# The parts from the bottom up: a part may import, at run time, only parts before it here.
ORDER = ["settings", "state", "stream", "hub", "dialects", "gateway", "metrics", "clients", "probe", "endpoint",
         "mock", "server", "__main__"]
BASE = {"__init__", "errors", "build"}  # below every part: the package's version, the error classes, the build flag
# part -> the parts it may import at run time (a part is a folder of proxy/ or a top-level module)
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "build": set(),
    "settings": {"dialects", "metrics", "state"},  # UPWARD: names to validate against, read inside functions
    "state": {"settings"},
    "stream": set(),
    "hub": {"settings", "stream"},  # the pipeline names dialects' UpstreamSession as a type only
    "dialects": {"settings", "hub", "stream"},
    "clients": {"settings", "hub", "dialects"},
    "gateway": {"settings", "state"},  # state: the per-key limit counters (proxy/gateway/limits.py)
    "metrics": {"settings", "hub", "dialects"},  # dialects: the registry's names, the `dialect` label's values
    "endpoint": {"settings", "hub", "clients", "gateway"},
    "probe": {"dialects", "gateway", "hub"},
    "mock": set(),
}
TOP = {"__main__", "server"}  # may import anything below them
NARROW: dict[tuple[str, str], set[str]] = {}
# Edges that point up, each a known debt with its reason. Nothing else may point up, and the cycle checks leave
# these out (with them every cycle below would close).
UPWARD: dict[tuple[str, str], str] = {
    # Settings validates names against the registries above it, inside functions, at start-up only.
    ("settings", "dialects"): "the upstream dialects' names",
    ("settings", "state"): "the state store URL's parser",
    ("settings", "metrics"): "the OpenTelemetry configuration",
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_module(name: str) -> bool:
    return (PROXY / f"{name}.py").is_file() or (PROXY / name / "__init__.py").is_file()


def _runtime_imports(tree: ast.AST) -> list[str]:
    found: list[str] = []

    def visit(node: ast.AST, types_only: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, types_only)
            return
        if not types_only:
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [alias.name for alias in node.names]
                if node.module == "proxy":  # `from proxy import x`: a module of the package, or its own names
                    found.extend(f"proxy.{n}" if _is_module(n) else "proxy" for n in names)
                else:
                    found.append(node.module)
            elif isinstance(node, ast.Import):
                found.extend(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child, types_only)

    visit(tree, False)
    return [name for name in found if name == "proxy" or name.startswith("proxy.")]


def _edges() -> dict[tuple[str, str], set[str]]:
    edges: dict[tuple[str, str], set[str]] = {}
    for path in PROXY.rglob("*.py"):
        own = _part(".".join(path.relative_to(PROXY.parent).with_suffix("").parts))
        for module in _runtime_imports(ast.parse(path.read_text())):
            other = _part(module)
            if other != own:
                edges.setdefault((own, other), set()).add(path.name)
    return edges


def test_every_part_imports_only_the_parts_below_it() -> None:
    parts = {p.name for p in PROXY.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    parts |= {p.stem for p in PROXY.glob("*.py")}
    assert parts - BASE <= set(ALLOWED) | TOP, f"a new part without rules: {sorted(parts - BASE - set(ALLOWED) - TOP)}"
    wrong = []
    for (own, other), files in sorted(_edges().items()):
        if own in TOP or other in BASE:
            continue
        if other not in ALLOWED.get(own, set()):
            wrong.append(f"{own} -> {other} ({', '.join(sorted(files))})")
        elif (own, other) in NARROW and not files <= NARROW[own, other]:
            wrong.append(f"{own} -> {other} only from {sorted(NARROW[own, other])}, also {sorted(files)}")
    assert not wrong, "imports against the layout:\n" + "\n".join(wrong)


def _closure(part: str, edges: set[tuple[str, str]]) -> set[str]:
    """Every part `part` reaches through `edges`, itself included only through a cycle."""
    seen: set[str] = set()
    todo = [other for own, other in edges if own == part]
    while todo and len(seen) <= len(ORDER) + len(BASE):
        other = todo.pop()
        if other not in seen:
            seen.add(other)
            todo.extend(b for a, b in edges if a == other)
    return seen


def _downward_edges() -> set[tuple[str, str]]:
    return {edge for edge in _edges() if edge not in UPWARD and edge[1] not in BASE}


def test_every_import_points_down_the_order() -> None:
    """ORDER is the layout written down (docs/development.md "Layout" lists it): a run-time import goes to a part
    before the importer's, or is a named UPWARD debt. The rules themselves must agree with it."""
    assert set(ORDER) == set(ALLOWED) - BASE | TOP, "ORDER and ALLOWED name different parts"
    rank = {part: i for i, part in enumerate(ORDER)}
    against = [f"{own} -> {other} ({', '.join(sorted(files))})" for (own, other), files in sorted(_edges().items())
               if other not in BASE and (own, other) not in UPWARD and rank[other] >= rank[own]]
    assert not against, "imports up the order:\n" + "\n".join(against)
    rules = [f"{own} -> {other}" for own, others in ALLOWED.items() for other in others
             if (own, other) not in UPWARD and rank[other] >= rank[own]]
    assert not rules, f"ALLOWED permits imports up the order: {rules}"
    assert set(UPWARD) <= {(own, other) for own, others in ALLOWED.items() for other in others}


def test_no_part_reaches_itself_at_run_time() -> None:
    """No cycle between parts, however long (hub -> dialects -> hub was one: the pipeline now names the session's
    class as a type only)."""
    edges = _downward_edges()
    cycles = sorted(part for part in ORDER if part in _closure(part, edges))
    assert not cycles, f"parts on a run-time import cycle: {cycles}"


def test_the_cycle_check_sees_a_cycle() -> None:
    edges = {("hub", "stream"), ("stream", "dialects"), ("dialects", "hub"), ("gateway", "settings")}
    assert _closure("hub", edges) == {"hub", "stream", "dialects"} and "gateway" not in _closure("gateway", edges)


# What importing each part's modules may pull in, transitively (UPWARD debts aside): the hub and the stream
# transforms stay free of the request path's upper half, whatever their imports' imports do.
PULLS_IN: dict[str, set[str]] = {
    "settings": set(),
    "state": {"settings"},
    "stream": set(),
    "hub": {"settings", "stream"},
    "dialects": {"settings", "hub", "stream"},
    "gateway": {"settings", "state"},  # state: the per-key limit counters (proxy/gateway/limits.py)
    "metrics": {"settings", "hub", "stream", "dialects"},
    "probe": {"settings", "hub", "stream", "dialects", "gateway", "state"},
    "mock": set(),
}


@pytest.mark.parametrize("part", sorted(PULLS_IN))
def test_what_each_part_pulls_in(part: str) -> None:
    assert _closure(part, _downward_edges()) == PULLS_IN[part]
    for upper in ("clients", "endpoint", "server"):
        assert upper not in PULLS_IN[part]


@pytest.mark.parametrize("part", ["stream", "hub", "dialects", "gateway", "metrics", "state"])
def test_importing_a_part_loads_only_what_it_pulls_in(part: str) -> None:
    """The same, as Python sees it: a fresh interpreter imports every module of the part, and the proxy modules
    loaded then belong to the part, the base or PULLS_IN (a package's `__init__` that only holds a docstring, such as
    the one proxy/build.py's `find_spec` loads, is no dependency)."""
    folder = PROXY / part
    modules = [f"proxy.{part}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.stem != "__init__"]
    script = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\nprint(*sorted(sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = {name for name in done.stdout.split() if name.startswith("proxy.")}
    parts = {name.split(".")[1] for name in loaded
             if name.count(".") > 1 or not _docstring_only(PROXY / name.split(".")[1] / "__init__.py")}
    assert parts - BASE - {part} <= PULLS_IN[part], sorted(loaded)


def _docstring_only(init: Path) -> bool:
    if not init.is_file():
        return False  # a top-level module (proxy/settings.py): loaded means used
    body = ast.parse(init.read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def test_every_folder_says_what_it_is_and_what_it_may_import() -> None:
    for init in PROXY.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 80, init
        assert "import" in doc, f"{init}: the docstring says what the part may import"


def test_the_rules_catch_an_edge_against_them() -> None:
    """The walk sees a runtime import and skips a typing one (this test would pass vacuously otherwise)."""
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from proxy.server.app import X\n"
                     "def f():\n    from proxy.gateway import routing\n")
    assert _runtime_imports(tree) == ["proxy.gateway"]
    assert ("endpoint", "gateway") in _edges() and ("mock", "hub") not in _edges()


def test_every_folder_ships_in_the_wheel() -> None:
    """pyproject.toml lists the packages one by one: a folder missing there is missing from every install."""
    import tomllib

    listed = set(tomllib.loads((PROXY.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {f"proxy.{p.parent.name}" for p in PROXY.glob("*/__init__.py")}
    assert folders | {"proxy"} <= listed
