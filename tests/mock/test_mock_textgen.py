"""The mock's generation model (tokens -> delta text and full-text snapshots), and its independence."""

from __future__ import annotations

import ast
from pathlib import Path

from proxy.mock.scenario import parse
from proxy.mock.textgen import generate, tokenize

DEFAULT = "Hello from the mock x upstream! 你好, 世界 🌍."


def test_tokenize_splits_four_byte_characters() -> None:
    tokens = tokenize("a 🌍.")
    assert b"".join(tokens) == "a 🌍.".encode()
    assert tokens == [b"a", b" \xf0\x9f", b"\x8c\x8d", b"."]


def test_default_generation_holds_back_half_characters() -> None:
    gen = generate(parse(""), dialect="x")
    assert gen.content == DEFAULT and gen.finish_reason == "stop"
    assert "".join(p.text for p in gen.pieces) == DEFAULT
    assert [p.full for p in gen.pieces][-1] == DEFAULT
    assert all("\ufffd" not in p.text and "\ufffd" not in p.full for p in gen.pieces)
    held = [i for i, p in enumerate(gen.pieces) if p.text == ""]
    assert len(held) == 1 and gen.pieces[held[0]].full == gen.pieces[held[0] - 1].full


def test_split_utf8_lets_one_broken_snapshot_through() -> None:
    gen = generate(parse("[mock:split_utf8]"), dialect="x")
    fulls = [p.full for p in gen.pieces]
    broken = [f for f in fulls if f.endswith("\ufffd")]
    assert len(broken) == 1
    i = fulls.index(broken[0])
    assert fulls[i + 1] == broken[0][:-1] + "🌍"
    assert "".join(p.text for p in gen.pieces) == DEFAULT  # delta mode is unaffected


def test_generation_cut_mid_character() -> None:
    gen = generate(parse("[mock:split_utf8_end]"), dialect="x")
    assert gen.finish_reason == "length"
    assert gen.pieces[-1].full.endswith("\ufffd") and gen.content.endswith("\ufffd")


def test_max_tokens_and_chunks() -> None:
    gen = generate(parse("[mock:chunks=10]"), dialect="x", max_tokens=4)
    assert [p.text for p in gen.pieces] == ["tok0", " tok1", " tok2", " tok3"]
    assert gen.finish_reason == "length" and gen.completion_tokens == 4
    assert generate(parse("[mock:chunks=0]"), dialect="x").pieces == []


def test_reasoning_and_tools() -> None:
    gen = generate(parse("[mock:reasoning_field]"), dialect="x")
    assert gen.reasoning and gen.reasoning_tokens == sum(p.kind == "reasoning" for p in gen.pieces)
    gen = generate(parse("[mock:tool_calls=2]"), dialect="x", tools=["a", "b"])
    assert gen.finish_reason == "tool_calls" and [c["function"]["name"] for c in gen.tool_calls] == ["a", "b"]
    assert gen.content == ""
    gen = generate(parse("[mock:think_close_only]"), dialect="x")
    assert "<think>" not in gen.content and "</think>\n\n" in gen.content


def test_mock_is_independent_of_the_proxy_code() -> None:
    """The mock is written from the upstreams' documents (docs/upstreams.md), never from the proxy's own modules."""
    root = Path(__file__).resolve().parents[2] / "proxy" / "mock"
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level >= 2 or (node.module or "").startswith("proxy") and \
                        not (node.module or "").startswith("proxy.mock"):
                    raise AssertionError(f"{path.name} imports {node.module!r} (level {node.level})")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("proxy") or alias.name.startswith("proxy.mock"), path.name
