"""The tree shows its parts (proxy/*/__init__.py, DESIGN.md "Layout"): each part imports only the parts below it.

Imports under `if TYPE_CHECKING:` are types, not dependencies, and are not counted; an import inside a function is
(it runs). A new edge that breaks a rule is either a design change (then change the rule here and the part's
`__init__` docstring together) or a module in the wrong folder.
"""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parent.parent / "proxy"

# part -> the parts it may import at run time (a part is a folder of proxy/ or a top-level module)
BASE = {"__init__", "errors", "build"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "build": set(),
    "settings": {"dialects", "metrics", "state"},  # names to validate against (the registries), read lazily
    "state": {"settings"},
    "stream": {"hub"},
    "hub": {"settings", "stream", "dialects"},  # dialects: the UpstreamSession base class the pipeline drives
    "dialects": {"settings", "hub", "stream"},
    "clients": {"settings", "hub", "dialects"},
    "gateway": {"settings"},
    "metrics": {"settings", "hub", "dialects"},  # dialects: the registry's names, the `dialect` label's values
    "endpoint": {"settings", "hub", "clients", "gateway", "server"},  # server: the front end's disconnect hook
    "probe": {"dialects", "gateway", "hub"},
    "mock": set(),
}
TOP = {"__main__", "server"}  # may import anything
NARROW = {("hub", "dialects"): {"pipeline.py"}}


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
