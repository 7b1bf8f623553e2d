"""vLLM's OpenAI-compatible server (`vllm serve`), and vLLM-Ascend, which serves the same API on Ascend NPUs
(docs/vllm.md says which releases and flags are covered).

Requests are OpenAI's, passed as they are (mappings/vllm.yaml), but for the thinking switch and what older releases
refuse:

- the client's reasoning switch — `reasoning_effort`, DeepSeek-style `thinking: {"type": ...}` or a top-level
  `enable_thinking` — becomes `chat_template_kwargs.enable_thinking` (`thinking` for DeepSeek V3.1+ templates), the
  switch Qwen3-style chat templates read; a value the client put in `chat_template_kwargs` itself wins, and its other
  keys go through;
- `reasoning_effort` itself still goes (gpt-oss reads it) where every release takes it: `low`, `medium`, `high`.
  `none` and `minimal` are said by the template switch alone, `xhigh` goes as `high`: releases before the field
  widened answer any other value with a 400 (`max`, DeepSeek's grade, is taken as `xhigh`);
- `stream_options.include_usage` is forced on (as for OpenAI); `continuous_usage_stats` is not sent: the proxy places
  usage itself (the final chunk, docs/decisions.md "Streams"), so per-chunk counts would only cost bytes.

Answers are OpenAI's, with vLLM's own fields passed through (`stop_reason`, `prompt_token_ids`, `kv_transfer_params`,
...). Reasoning arrives in `reasoning_content` (up to 0.11.0), in both `reasoning` and `reasoning_content` with the
same text (0.11.1 to 0.15), or in `reasoning` (0.16 on): the normaliser reads either and one of them when both come
(proxy/hub/normalize.py), so no release doubles it. Errors are `{"error": {..., "code": <status>}}` (0.10.1 on) or the
flat `{"object": "error", "message", "type", "param", "code"}` before; both are read by the base class, and the flat
one's `param` here. Readiness asks `GET /health` (mappings/vllm.yaml `paths.health`) and then the invalid-body
request; the probe knows a vLLM server by its model cards' `owned_by: "vllm"`.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from proxy.dialects.base import Dialect, UpstreamSession
from proxy.dialects.error_shape import ErrorShape
from proxy.dialects.probing import Probe, ProbeListing
from proxy.dialects.templates import EFFORT_OFF, interleaved_thinking, set_template_thinking, thinking_kwarg
from proxy.errors import ProxyError
from proxy.hub.canonical import CHAT, ChatRequest, RequestContext

# The efforts every release with `reasoning_effort` accepts (a Literal of these three until it widened); the rest go
# as the nearest of them.
_EFFORTS: Final = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


class VLLMSession(UpstreamSession):
    """Per request: the thinking switch decides whether an R1-style template opens a `<think>` block."""

    def build_request(self, body: ChatRequest) -> dict[str, Any]:
        out = super().build_request(body)
        kwargs = out.get("chat_template_kwargs")
        self.thinking_off = isinstance(kwargs, dict) and kwargs.get(thinking_kwarg(self.ctx.upstream_model)) is False
        return out


class VLLMErrors(ErrorShape):
    def from_body(self, status: int, raw: bytes, headers: dict[str, str] | None = None) -> ProxyError:
        err = super().from_body(status, raw, headers)
        if err.param is None and raw[:1] == b"{":
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return err
            if isinstance(data, dict) and data.get("object") == "error" and isinstance(data.get("param"), str):
                err.param = data["param"]  # the flat shape (vLLM before 0.10.1)
        return err


class VLLMProbe(Probe):
    def listing(self, listing: ProbeListing) -> str | None:
        return "vLLM model list (owned_by: vllm)" if "vllm" in listing.owners else None

    def config_notes(self, url: str) -> list[str]:
        return ["    # vLLM reports cached prompt tokens (usage.prompt_tokens_details) only when it runs with "
                "--enable-prompt-tokens-details"]


class VLLMDialect(Dialect):
    name = "vllm"
    session_class = VLLMSession
    errors_class = VLLMErrors
    probe = VLLMProbe()

    def reasoning_replay(self, body: ChatRequest, ctx: RequestContext) -> str:
        """`auto`: as for any upstream (R1-era models strip), and thinking models whose templates render the tool
        loop's reasoning restore it, as on MindIE: vLLM hands the template what the client sent back."""
        mode = super().reasoning_replay(body, ctx)
        if ctx.upstream.reasoning_replay == "auto" and mode == "keep" and interleaved_thinking(ctx.upstream_model):
            return "restore"
        return mode

    # -- requests ---------------------------------------------------------------------------------------------
    def build_request(self, body: ChatRequest, ctx: RequestContext) -> dict[str, Any]:
        if ctx.kind == CHAT:
            body = dict(body)
            if body.get("reasoning_effort") == "max":  # DeepSeek's top grade, which newer vLLM takes for V4
                body["reasoning_effort"] = "xhigh"
            set_template_thinking(body, ctx.upstream_model)
            effort = body.get("reasoning_effort")
            if effort in EFFORT_OFF:
                del body["reasoning_effort"]
            elif isinstance(effort, str) and effort in _EFFORTS:
                body["reasoning_effort"] = _EFFORTS[effort]
        out = super().build_request(body, ctx)
        opts = out.get("stream_options")
        if isinstance(opts, dict) and "continuous_usage_stats" in opts:
            out["stream_options"] = {k: v for k, v in opts.items() if k != "continuous_usage_stats"}
        return out
