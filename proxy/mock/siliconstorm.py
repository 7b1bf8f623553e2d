"""Mock Siliconstorm: hosted MindIE (`POST /v1/chat/completions` with `Authorization: Bearer {ApiKey}`).

Written from Siliconstorm's documentation (docs/upstreams.md "Siliconstorm"). Everything MindIE does (see mindie.py),
with these differences taken from the Siliconstorm document:

* Its own error envelope `{"code": N, "result": null, "message": "..."}`, which may arrive with HTTP 200, also for
  `stream: true` (then no SSE at all). Codes: 701 Insufficient balance, 702 Authorization not passed,
  801 Apikey error, 802 Request timeout, 9999 Model response exception. A wrong or missing API key (when the mock
  has one) gets code 801 at HTTP 200.
* `usage` is the plain `prompt_tokens`/`completion_tokens`/`total_tokens` (no `batch_size`, `queue_wait_time` or
  `prompt_tokens_details`); non-stream answers still carry top-level `prefill_time` and `decode_time_arr`.
* A non-stream answer without tool calls has `"tool_calls": null` (MindIE proper: `[]`).
* `top_k` may be 0 (range [0, 2147483647]); `top_p` is (0.0, 1.0].
"""

from __future__ import annotations

from starlette.routing import Route

from proxy.mock import mindie
from proxy.mock.asgi import JSON_HEADERS, SSE_HEADERS, Plan, Stats, json_plan, sse, stream_plan
from proxy.mock.common import Call, MockConfig

CODES = {
    701: "Insufficient balance",
    702: "Authorization not passed",
    801: "Apikey error",
    802: "Request timeout",
    9999: "Model response exception",
}


def code_error(code: int, status: int = 200) -> Plan:
    return json_plan(status, {"code": code, "result": None, "message": CODES.get(code, "Unknown error")},
                     JSON_HEADERS)


def _pre(call: Call) -> Plan | None:
    """`[mock:code=701]` (optionally with `[mock:status=402]`): a Siliconstorm error body.
    `[mock:code_in_stream=701]`: the same body as the first event of a 200 event stream (as some gateways in front of
    the service send it), then the stream ends."""
    sc = call.scenario
    in_stream = sc.num("code_in_stream", None, lo=0, hi=1_000_000)
    if in_stream is not None:
        event = sse({"code": in_stream, "result": None, "message": CODES.get(in_stream, "Unknown error")})
        return stream_plan([event], [], [], headers=SSE_HEADERS)
    code = sc.num("code", None, lo=0, hi=1_000_000)
    if code is None:
        return None
    return code_error(code, sc.num("status", 200, lo=100, hi=599) or 200)


FLAVOUR = mindie.Flavour(
    name="siliconstorm",
    default_model="DeepSeek-R1",
    perf_usage=False,
    null_tool_calls=True,
    listed_tool_models=False,  # its document names no model limit on tools
    top_k_zero_ok=True,
    response_formats=(),  # its document has no response_format: ignored
    auth_error=lambda: code_error(801),
    pre=_pre,
)


def routes(cfg: MockConfig, stats: Stats) -> list[Route]:
    return mindie.routes(cfg, stats, FLAVOUR)
