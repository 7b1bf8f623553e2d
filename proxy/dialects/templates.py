"""What a model's name and its chat template say about thinking: which names start inside a `<think>` block (the R1
family), which are R1-era (reasoning must never go back to them), which templates render the tool loop's reasoning
(Qwen3, DeepSeek V3.1+, GLM-4.5+, Kimi K2), and the thinking switch of Hugging Face chat templates (servers that render
them: MindIE, vLLM). Heuristics on names, shared by the spokes; nothing here knows an upstream's wire.
"""

from __future__ import annotations

import re
from typing import Any, Final

from proxy.errors import ClientRequestError

# docs/decisions.md "Reasoning": upstream model names whose template opens the thinking block in the prompt (R1 family).
THINKING_MODEL_RE: Final = re.compile(r"(?i)(^|[^a-z0-9])r1([^a-z0-9]|$)|reasoner")
# R1-era models (DeepSeek-R1 and its distills): reasoning must never be sent back to them. Not `reasoner`: DeepSeek's
# `deepseek-reasoner` ended as an alias of V4 Flash's thinking mode (proxy/dialects/deepseek.py).
R1_MODEL_RE: Final = re.compile(r"(?i)(^|[^a-z0-9])r1([^a-z0-9]|$)")


class NameTest:
    """A pattern's verdict on model names, remembered: a request names one of a few models, and a dict lookup costs
    a small part of a search. Bounded: forgotten all at once at `limit` names."""

    __slots__ = ("_limit", "_pattern", "_seen")

    def __init__(self, pattern: re.Pattern[str], limit: int = 4096) -> None:
        self._pattern = pattern
        self._seen: dict[str, bool] = {}
        self._limit = limit

    def __call__(self, name: str) -> bool:
        verdict = self._seen.get(name)
        if verdict is None:
            if len(self._seen) >= self._limit:
                self._seen.clear()
            verdict = self._seen[name] = self._pattern.search(name) is not None
        return verdict


is_thinking_model: Final = NameTest(THINKING_MODEL_RE)
is_r1_era: Final = NameTest(R1_MODEL_RE)

# -- the thinking switch of Hugging Face chat templates (servers that render them: MindIE, vLLM) ---------------------
# OpenAI reasoning_effort values; "none" and "minimal" ask for (next to) no thinking, which a template can only switch
# off.
EFFORT_OFF: Final = frozenset({"none", "minimal"})
EFFORT_ON: Final = frozenset({"low", "medium", "high", "xhigh"})
# Chat templates whose thinking switch is the `thinking` kwarg (DeepSeek V3.1 and later); others (Qwen3, GLM ...)
# read `enable_thinking`.
_THINKING_KWARG_MODELS: Final = re.compile(r"(?i)deepseek[-_ ]?v3\.[1-9]|deepseek[-_ ]?v4")
# Thinking models whose chat templates render the reasoning of the current tool loop's assistant turns (Qwen3 keeps
# `reasoning_content` after the last user query; DeepSeek V3.1+ and GLM-4.5+ interleave it with tool calls): a client
# that drops it changes the prompt, so `reasoning_replay: auto` restores it (proxy/hub/continuity.py).
_INTERLEAVED_THINKING: Final = re.compile(r"(?i)qwen3|deepseek[-_ ]?v3\.[1-9]|deepseek[-_ ]?v4|glm-?4\.[5-9]|kimi-k2")
interleaved_thinking: Final = NameTest(_INTERLEAVED_THINKING)  # asked once per request
_thinking_kwarg_model: Final = NameTest(_THINKING_KWARG_MODELS)


def thinking_kwarg(model: str) -> str:
    """The chat_template_kwargs key that switches this model's thinking."""
    return "thinking" if _thinking_kwarg_model(model) else "enable_thinking"


def set_template_thinking(body: dict[str, Any], model: str) -> None:
    """The client's reasoning switch (`template_thinking`) into `chat_template_kwargs`, under the key the model's
    template reads, unless the client put that key there itself (its other keys go through). `body` is the caller's
    own copy."""
    enable = template_thinking(body)
    if enable is not None:
        kwargs = body.get("chat_template_kwargs")
        kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
        kwargs.setdefault(thinking_kwarg(model), enable)
        body["chat_template_kwargs"] = kwargs


def template_thinking(body: dict[str, Any]) -> bool | None:
    """The chat template's thinking switch from `thinking`, a top-level `enable_thinking` or `reasoning_effort`
    (in that order of precedence); None when the client said nothing."""
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind in ("enabled", "disabled"):
            return bool(kind == "enabled")
        raise ClientRequestError(
            f'`thinking` must be {{"type": "enabled"}} or {{"type": "disabled"}}, got {thinking!r}.', param="thinking"
        )
    flag = body.get("enable_thinking")
    if flag is not None:
        if not isinstance(flag, bool):
            raise ClientRequestError(f"`enable_thinking` must be a boolean, got {flag!r}.", param="enable_thinking")
        return flag
    effort = body.get("reasoning_effort")
    if effort is None:
        return None
    if effort in EFFORT_OFF:
        return False
    if effort in EFFORT_ON:
        return True
    raise ClientRequestError(
        f"`reasoning_effort` must be one of none, minimal, low, medium, high; got {effort!r}.", param="reasoning_effort"
    )
