"""The settings tables of README.md and docs/configuration.md, held to the declarations in proxy/settings.py: every
setting is documented once per table with its real flag (and, in docs/configuration.md, its environment variable),
its choices and its default; no row documents a setting that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.dialects import DIALECTS
from proxy.settings import Declared, declared

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("upstream", "client", "server")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def _tables(text: str, starts: dict[str, str]) -> dict[str, list[list[str]]]:
    """Each section's rows (cells), a section starting at the line that begins with its marker."""
    rows: dict[str, list[list[str]]] = {s: [] for s in SECTIONS}
    section = None
    for line in text.splitlines():
        for name, marker in starts.items():
            if line.startswith(marker):
                section = name
        if section and line.startswith("| `"):
            rows[section].append(_cells(line))
    return rows


def configuration_tables() -> dict[str, list[list[str]]]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    text = text[text.index("## Every key, in full"):text.index("\n## ", text.index("## Every key, in full") + 1)]
    return _tables(text, {"upstream": "Upstream keys", "client": "Client keys", "server": "Server keys"})


def readme_tables() -> dict[str, list[list[str]]]:
    text = (ROOT / "README.md").read_text()
    text = text[text.index("## Configuration\n"):text.index("\n## ", text.index("## Configuration\n") + 1)]
    return _tables(text, {"upstream": "| **`upstreams[]`**", "client": "| **`client`**", "server": "| **`server`**"})


def _plain(cell: str) -> str:
    return cell.replace("`", "")


def _check(rows: list[list[str]], section: str, with_env: bool) -> None:
    by_name: dict[str, Declared] = {d.name: d for d in declared(section)}
    documented = [re.fullmatch(r"`([a-z_]+)`", row[0]) for row in rows]
    names = [m.group(1) if m else rows[i][0] for i, m in enumerate(documented)]
    assert sorted(names) == sorted(by_name), f"{section}: documented {names}, declared {list(by_name)}"
    for row in rows:
        d = by_name[row[0].strip("`")]
        key, flags, kind, default = row[0], row[1], row[2], row[3]
        assert f"`--{d.flag}`" in flags, (key, flags)
        if with_env:
            assert f"`{d.env}`" in flags, (key, flags)
        if d.choices():
            assert sorted(re.findall(r"`([^`]+)`", kind)) == sorted(d.choices()), (key, kind)
        assert _plain(default) == _plain(d.default_words()), (key, default, d.default_words())


@pytest.mark.parametrize("section", SECTIONS)
def test_configuration_md_tables_match_the_declarations(section: str) -> None:
    _check(configuration_tables()[section], section, with_env=True)


@pytest.mark.parametrize("section", SECTIONS)
def test_readme_table_matches_the_declarations(section: str) -> None:
    _check(readme_tables()[section], section, with_env=False)


@pytest.mark.parametrize(("name", "attribute"), [("reasoning_source", "reasoning_source"),
                                                 ("response_format", "response_format")])
def test_per_dialect_defaults_are_said_as_the_spokes_have_them(name: str, attribute: str) -> None:
    """`X for a, b; else Y`: each dialect's spoke has that default, read from the registry."""
    d = next(d for d in declared("upstream") if d.name == name)
    said = re.fullmatch(r"`(\w+)` for ([a-z, ]+); else `(\w+)`", d.default_words())
    assert said, d.default_words()
    named = said.group(2).split(", ")
    for dialect, spoke in DIALECTS.items():
        assert getattr(spoke.rules, attribute) == (said.group(1) if dialect in named else said.group(3)), dialect


def test_every_declared_flag_is_in_serve_help() -> None:
    from proxy.__main__ import parser

    serve = parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = " ".join(serve.format_help().split())
    for d in declared():
        assert f"--{d.flag}" in text and d.env in text, d.name
    assert "(default: 8000) [env DIALECT_PROXY_PORT]" in text
    assert "one of deepseek, engine, mindie, openai, siliconstorm, tei, vllm" in text
