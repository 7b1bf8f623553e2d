"""The repository stands alone: what its comments, docs and mappings point at is in the repository.

- No file cites a document the repository lacks (the project's working notes and the upstream documents it was
  written from live elsewhere; what the code relies on from them is in docs/decisions.md and docs/upstreams.md).
- Every `docs/<file>.md "Section"` the code, the tests or the mappings name is a heading of that file, and every
  `[file.md](file.md) "Section"` in the docs too.
- Every `proxy/...` file or folder that the docs and the README name exists.
- The one-line descriptions (pyproject, the package docstring, `--help`) name every client and upstream dialect.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".json", ".sh", ".j2"}
# The project's notes outside the repository, by the names comments used for them (built in pieces, so that this
# file does not match itself).
ELSEWHERE = re.compile("|".join([r"\bDECI" + r"SIONS\b", r"DESIGN" + r"\.md", r"WIRE-" + "NOTES",
                                 r"\.\./" + "shared", r"(?<![\w.-])spec" + r"s/"]))
URL = re.compile(r"https?://\S+")
SECTION_REF = re.compile(r'docs/([\w.-]+\.md) "([^"]+)"')
DOCS_SECTION_REF = re.compile(r'\[[\w.-]+\.md\]\(([\w.-]+\.md)\) "([^"]+)"')
PROXY_PATH = re.compile(r"(?<![\w.-])proxy/(?:(?:[\w-]+/)*[\w-]+\.(?:py|md|yaml|json|txt)\b|(?:[\w-]+/)+)")


def _files(*tops: str) -> list[Path]:
    found: list[Path] = []
    for top in tops:
        path = ROOT / top
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        found += [p for p in candidates if p.is_file() and (p.suffix in TEXT or p.name == "Dockerfile")
                  and "__pycache__" not in p.parts]
    return found


def _joined(text: str) -> str:
    """The text with each line break and the next line's indent and comment marker as one space: a reference wrapped
    over two comment lines reads as one."""
    return re.sub(r"[ \t]*\n[ \t]*(?:#[ \t]*)?", " ", text)


def _headings(doc: Path) -> set[str]:
    """Each heading of `doc`, and its leading words before a colon or a parenthesis: `"Compaction"` names the
    heading "Compaction (`POST /v1/responses/compact`, ...)", `"Client side"` the heading "Client side: one encoder"."""
    found: set[str] = set()
    for line in doc.read_text().splitlines():
        if re.match(r"#{1,6} ", line):
            heading = line.lstrip("#").strip()
            found |= {heading, re.split(r":| \(", heading, maxsplit=1)[0]}
    return found


def test_nothing_cites_a_document_the_repository_lacks() -> None:
    own = Path(__file__).resolve()
    cited = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in _files("proxy", "tests", "docs", "README.md", "deploy", "mappings", "pyproject.toml",
                                "setup.py", "Makefile") if path.resolve() != own
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if ELSEWHERE.search(URL.sub("", line))]
    assert not cited, "citations of files outside the repository:\n" + "\n".join(cited)


def test_every_section_the_code_names_is_a_heading() -> None:
    own = Path(__file__).resolve()
    refs = [(path, doc, section) for path in _files("proxy", "tests", "mappings") if path.resolve() != own
            for doc, section in SECTION_REF.findall(_joined(path.read_text(errors="replace")))]
    refs += [(path, doc, section) for path in _files("docs", "README.md")
             for doc, section in DOCS_SECTION_REF.findall(_joined(path.read_text()))]
    assert len(refs) > 40  # the code names sections of docs/decisions.md and docs/upstreams.md all over
    wrong = []
    for path, doc, section in refs:
        target = ROOT / "docs" / doc
        if not target.is_file():
            wrong.append(f"{path.relative_to(ROOT)}: docs/{doc} does not exist")
        elif section not in _headings(target):
            wrong.append(f'{path.relative_to(ROOT)}: docs/{doc} has no heading "{section}"')
    assert not wrong, "\n".join(wrong)


def test_every_proxy_path_the_docs_name_exists() -> None:
    missing = [f"{path.relative_to(ROOT)}:{n}: {found}"
               for path in _files("docs", "README.md", "deploy")
               for n, line in enumerate(path.read_text().splitlines(), 1)
               for found in PROXY_PATH.findall(line) if not (ROOT / found).exists()]
    assert not missing, "paths the docs name that the tree lacks:\n" + "\n".join(missing)


def test_the_checks_see_what_they_look_for() -> None:
    assert ELSEWHERE.search("see " + "DECI" + 'SIONS.md "Streams"') and ELSEWHERE.search("spec" + "s/mindie.md")
    assert not ELSEWHERE.search(URL.sub("", "the https://opentelemetry.io/docs/spec" + "s/otel/ page"))
    assert _joined('(docs/decisions.md "The\n    # engine dialect")') == '(docs/decisions.md "The engine dialect")'
    assert PROXY_PATH.findall("proxy/endpoint.py and proxy/hub/ and proxy/ref µs") == ["proxy/endpoint.py",
                                                                                       "proxy/hub/"]
    assert "Streams" in _headings(ROOT / "docs" / "decisions.md")


DIALECT_WORDS = {"mindie": "MindIE", "siliconstorm": "Siliconstorm", "deepseek": "DeepSeek", "engine": "engine",
                 "openai": "OpenAI", "vllm": "vLLM", "tei": "TEI"}
CLIENT_WORDS = ["Chat Completions", "Completions", "Responses", "Messages"]


def _descriptions() -> dict[str, str]:
    from proxy.__main__ import parser

    package = ast.get_docstring(ast.parse((ROOT / "proxy" / "__init__.py").read_text())) or ""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    return {"proxy/__init__.py": package, "pyproject.toml": project, "--help": parser().description or ""}


@pytest.mark.parametrize("where", ["proxy/__init__.py", "pyproject.toml", "--help"])
def test_the_one_line_descriptions_name_every_dialect(where: str) -> None:
    from proxy.dialects import DIALECTS

    text = " ".join(_descriptions()[where].split())
    assert set(DIALECT_WORDS) == set(DIALECTS), "a new upstream dialect: name it in the descriptions and here"
    for word in [*DIALECT_WORDS.values(), *CLIENT_WORDS]:
        assert word in text, f"{where} does not name {word}: {text}"
