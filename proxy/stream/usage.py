"""Usage objects: upstream shapes -> OpenAI shape (+ extras for metrics), and back out to the DeepSeek shape.

OpenAI's usage is `prompt_tokens`, `completion_tokens`, `total_tokens`, `prompt_tokens_details{cached_tokens,
audio_tokens}` and `completion_tokens_details{reasoning_tokens, audio_tokens, accepted_prediction_tokens,
rejected_prediction_tokens}`. Upstreams add their own top-level keys: MindIE `batch_size`, `queue_wait_time`,
`prefill_time`, `decode_time_arr`…; DeepSeek `prompt_cache_hit_tokens` / `prompt_cache_miss_tokens`. Those never
reach an OpenAI client; `normalize_usage` returns them as `extras` (name -> value) for the metrics layer, and a
DeepSeek-dialect client gets the two cache fields back through `deepseek_usage_fields`.

Absent stays absent: a count the upstream did not give is not invented as 0 (only `total_tokens` is computed, from
the two counts it is the sum of), and a details object whose values are all absent is left out.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["deepseek_usage_fields", "normalize_usage"]

_COUNTS: Final = frozenset({"prompt_tokens", "completion_tokens", "total_tokens"})
_DETAILS: Final = ("prompt_tokens_details", "completion_tokens_details")  # in the order an OpenAI usage has them
_DETAIL_KEYS: Final = frozenset(_DETAILS)  # (membership: a tuple compares an upstream's key with each by value)


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def normalize_usage(raw: object) -> tuple[dict[str, Any], dict[str, Any]]:
    """(OpenAI-shaped usage, extras). Never raises; a non-dict gives ({}, {})."""
    counts: dict[str, int] = {}
    details: dict[str, dict[str, Any]] = {}
    extras: dict[str, Any] = {}
    if not isinstance(raw, dict):
        return {}, extras
    for key, value in raw.items():
        if value is None:
            continue
        if key in _COUNTS:
            n = _count(value)
            if n is not None:
                counts[key] = n
            else:
                extras[key] = value  # e.g. a string count: not OpenAI-shaped, still worth a look
        elif key in _DETAIL_KEYS:
            if isinstance(value, dict):
                # OpenAI's namespace: keep every key it has (audio_tokens, accepted_prediction_tokens, …).
                kept = {k: v for k, v in value.items() if v is not None}
                if kept:
                    details[key] = kept
            else:
                extras[key] = value
        else:
            extras[key] = value

    if "cached_tokens" not in details.get("prompt_tokens_details", ()):
        hit = _count(raw.get("prompt_cache_hit_tokens"))
        if hit is not None:
            details.setdefault("prompt_tokens_details", {})["cached_tokens"] = hit

    usage: dict[str, Any] = {}
    prompt = counts.get("prompt_tokens")
    completion = counts.get("completion_tokens")
    if prompt is not None:
        usage["prompt_tokens"] = prompt
    if completion is not None:
        usage["completion_tokens"] = completion
    total = counts.get("total_tokens")
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    if total is not None:
        usage["total_tokens"] = total
    for key in _DETAILS:
        if key in details:
            usage[key] = details[key]
    return usage, extras


def deepseek_usage_fields(usage: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAI-shaped usage with DeepSeek's `prompt_cache_hit_tokens` (cached_tokens, or 0) and
    `prompt_cache_miss_tokens` (prompt_tokens - hit; left out when prompt_tokens is unknown)."""
    out = dict(usage)
    ptd = usage.get("prompt_tokens_details")
    hit = _count(ptd.get("cached_tokens")) if isinstance(ptd, dict) else None
    hit = hit or 0
    out["prompt_cache_hit_tokens"] = hit
    prompt = _count(usage.get("prompt_tokens"))
    if prompt is not None:
        out["prompt_cache_miss_tokens"] = max(prompt - hit, 0)
    return out
