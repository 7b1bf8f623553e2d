"""proxy/dialects/templates.py NameTest: a model-name pattern's verdicts, remembered per name and bounded."""

from __future__ import annotations

import re

from proxy.dialects.templates import R1_MODEL_RE, THINKING_MODEL_RE, NameTest, is_r1_era, is_thinking_model

NAMES = ["DeepSeek-R1", "deepseek-r1-distill-qwen-32b", "deepseek-reasoner", "deepseek-v4-flash", "qwen3-r10",
         "R1", "my_r1", "gpt-4o", "r1x", "", "Reasoner-7B"]


def test_verdicts_are_the_patterns_asked_twice() -> None:
    for _ in range(2):  # the second time from memory
        assert [is_r1_era(n) for n in NAMES] == [R1_MODEL_RE.search(n) is not None for n in NAMES]
        assert [is_thinking_model(n) for n in NAMES] == [THINKING_MODEL_RE.search(n) is not None for n in NAMES]
    assert is_r1_era("DeepSeek-R1") and not is_r1_era("deepseek-reasoner") and is_thinking_model("deepseek-reasoner")


def test_memory_is_bounded_and_stays_right_past_the_bound() -> None:
    test = NameTest(re.compile(r"7$"), limit=5)
    names = [f"model-{i}" for i in range(23)]
    for name in names * 2:
        assert test(name) is name.endswith("7")
        assert len(test._seen) <= 5
