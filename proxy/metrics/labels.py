"""The values the metrics' labels may take, and their bounds: what keeps the number of series finite whatever a
client or an upstream sends (deploy/METRICS.md lists every label). Shared by the definitions (proxy/metrics/
definitions.py) and the per-request observer (proxy/metrics/observer.py)."""

from __future__ import annotations

from typing import Final

from proxy.dialects import DIALECTS as DIALECT_REGISTRY
from proxy.errors import ERROR_TYPES

OTHER: Final = "other"
NONE: Final = "none"
MAX_UNCONFIGURED_MODELS: Final = 50  # docs/decisions.md "Metrics labels": the first 50 names
MAX_LABEL_VALUES: Final = 50  # cap for route / upstream (config-bounded anyway; this is a guard)
MAX_ERROR_CODES: Final = 100  # distinct (dialect, code) pairs; later ones become "other"
MAX_LABEL_LENGTH: Final = 128
MAX_CACHED_SERIES: Final = 4096  # (route, upstream, model, stream, key) combinations whose children are kept resolved

OUTCOMES: Final = ("ok", "error", "truncated", "client_disconnect")
TRUNCATION_REASONS: Final = frozenset({"upstream_closed", "upstream_error", "idle_timeout", "invalid_data", "shutdown",
                                       "full_text_mismatch"})
FINISH_REASONS: Final = frozenset(
    {"stop", "length", "tool_calls", "function_call", "content_filter", "insufficient_system_resource"}
)
TOKEN_KINDS: Final = ("prompt", "completion", "cached", "reasoning")
DIALECTS: Final = frozenset({*DIALECT_REGISTRY, "any"})  # the `dialect` label: the registry's names, or "any"
CONTINUITY_EVENTS: Final = frozenset({"restored", "fallback", "recorded", "record_failed"})  # proxy/hub/continuity.py
# The `code` label of dialect_proxy_errors_total: the client-facing codes (docs/decisions.md "Errors", proxy/errors.py's
# defaults and the codes the proxy's own refusals carry; deploy/METRICS.md lists them). Any other code is "other".
ERROR_CODES: Final = frozenset({
    *(code for _, code in ERROR_TYPES.values()), "invalid_json", "invalid_request", "unsupported_parameter",
    "unsupported_endpoint", "context_length_exceeded", "previous_response_not_found", "item_not_found",
    "response_not_found", "not_found", "state_store_unavailable", "state_store_full", "shutting_down",
    "internal_error", "missing_required_parameter", "tool_call_not_found", "invalid_encrypted_content",
    "upstream_path_not_found", "full_text_mismatch", "structured_output_failed",
    "rate_limit_exceeded", "model_not_allowed", "limits_unavailable",  # per-key limits (proxy/gateway/limits.py)
})


def status_class(status: int) -> str:
    """``2xx`` / ``4xx`` / ``5xx`` (``3xx`` too, though the proxy never sends one). Anything odd is ``5xx``."""
    family = status // 100
    return f"{family}xx" if 2 <= family <= 5 else "5xx"
