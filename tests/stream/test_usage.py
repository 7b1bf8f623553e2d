"""Usage: upstream shapes -> OpenAI shape + extras, and the DeepSeek fields back out."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from proxy.hub.sse import SSEDecoder
from proxy.stream.usage import deepseek_usage_fields, normalize_usage

FIXTURES = Path(__file__).parent.parent / "fixtures" / "mindie"


def test_mindie_transcript_usage_is_already_openai_shaped() -> None:
    dec = SSEDecoder()
    raw = (FIXTURES / "stream-deltas.sse").read_bytes()
    chunks = [json.loads(e.data) for e in dec.feed(raw) + dec.flush() if e.data != "[DONE]"]
    [raw_usage] = [c["usage"] for c in chunks if "usage" in c]
    assert normalize_usage(raw_usage) == ({"prompt_tokens": 54, "completion_tokens": 17, "total_tokens": 71}, {})


def test_mindie_extras_are_split_off() -> None:
    raw = {"prompt_tokens": 31, "completion_tokens": 10, "total_tokens": 41, "batch_size": [1, 2],
           "queue_wait_time": [1203, 5], "prefill_time": 42.5, "decode_time_arr": [12, 11, 13]}
    before = copy.deepcopy(raw)
    usage, extras = normalize_usage(raw)
    assert usage == {"prompt_tokens": 31, "completion_tokens": 10, "total_tokens": 41}
    assert extras == {"batch_size": [1, 2], "queue_wait_time": [1203, 5], "prefill_time": 42.5,
                      "decode_time_arr": [12, 11, 13]}
    assert raw == before


def test_total_is_computed_when_missing_and_kept_when_given() -> None:
    assert normalize_usage({"prompt_tokens": 3, "completion_tokens": 4})[0]["total_tokens"] == 7
    assert normalize_usage({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": None})[0]["total_tokens"] == 7
    assert normalize_usage({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 9})[0]["total_tokens"] == 9


def test_absent_counts_are_not_invented() -> None:
    usage, _ = normalize_usage({"completion_tokens": 4})
    assert usage == {"completion_tokens": 4}
    assert normalize_usage({}) == ({}, {})


def test_deepseek_usage() -> None:
    raw = {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150,
           "prompt_tokens_details": {"cached_tokens": 64},
           "completion_tokens_details": {"reasoning_tokens": 30},
           "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 36}
    usage, extras = normalize_usage(raw)
    assert usage == {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150,
                     "prompt_tokens_details": {"cached_tokens": 64},
                     "completion_tokens_details": {"reasoning_tokens": 30}}
    assert extras == {"prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 36}
    assert deepseek_usage_fields(usage) == {**usage, "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 36}


def test_cached_tokens_from_deepseek_hit_field_when_nested_is_absent() -> None:
    usage, extras = normalize_usage({"prompt_tokens": 10, "completion_tokens": 1,
                                     "prompt_cache_hit_tokens": 8, "prompt_cache_miss_tokens": 2})
    assert usage["prompt_tokens_details"] == {"cached_tokens": 8}
    assert extras == {"prompt_cache_hit_tokens": 8, "prompt_cache_miss_tokens": 2}
    # The nested field wins when both are present.
    usage, _ = normalize_usage({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 5},
                                "prompt_cache_hit_tokens": 8})
    assert usage["prompt_tokens_details"] == {"cached_tokens": 5}


def test_details_with_nothing_in_them_are_left_out() -> None:
    usage, _ = normalize_usage({"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": None,
                                "completion_tokens_details": {"reasoning_tokens": None}})
    assert usage == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    usage, _ = normalize_usage({"prompt_tokens_details": {}})
    assert "prompt_tokens_details" not in usage


def test_zero_is_a_value_not_an_absence() -> None:
    usage, _ = normalize_usage(
        {"prompt_tokens": 5, "completion_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}})
    assert usage == {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5,
                     "prompt_tokens_details": {"cached_tokens": 0}}


def test_other_openai_detail_keys_are_kept() -> None:
    raw = {"prompt_tokens": 5, "completion_tokens": 9,
           "prompt_tokens_details": {"audio_tokens": 2, "cached_tokens": 1},
           "completion_tokens_details": {"reasoning_tokens": 3, "audio_tokens": 0,
                                         "accepted_prediction_tokens": 4, "rejected_prediction_tokens": 1}}
    usage, extras = normalize_usage(raw)
    assert usage["prompt_tokens_details"] == raw["prompt_tokens_details"]
    assert usage["completion_tokens_details"] == raw["completion_tokens_details"]
    assert extras == {}


def test_odd_values() -> None:
    usage, extras = normalize_usage({"prompt_tokens": 5.0, "completion_tokens": "7", "total_tokens": True})
    assert usage == {"prompt_tokens": 5}
    assert extras == {"completion_tokens": "7", "total_tokens": True}
    assert normalize_usage(None) == ({}, {})  # type: ignore[arg-type]


def test_deepseek_fields_without_cache_info() -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    out = deepseek_usage_fields(usage)
    assert out == {**usage, "prompt_cache_hit_tokens": 0, "prompt_cache_miss_tokens": 12}
    assert usage == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}  # a copy
    assert deepseek_usage_fields({"completion_tokens": 3}) == {"completion_tokens": 3, "prompt_cache_hit_tokens": 0}
