"""Parameters an upstream cannot honour: refused with a 400 that names them, never silently dropped.

Two rules, applied to the canonical request before a dialect builds the upstream body (proxy/dialects/base.py):

- `response_format`, per upstream (`response_format: pass | emulate | reject | drop`, default per dialect): `pass`
  sends it (OpenAI-compatible servers, MindIE >= 2.3); `emulate` obtains it another way where the upstream cannot
  honour it (proxy/hub/structured.py, docs/structured-output.md): by the time the request is built only a
  `json_object` the upstream's JSON mode honours is left, and passes; `reject` answers a 400 naming it when the
  client asks for `json_object` or `json_schema`; `drop` leaves it out (the answer will not follow the format). A
  `{"type": "text"}` format asks for nothing and is left out wherever it is not passed.
- the `refuse` section of mappings/<dialect>.yaml: parameters the upstream has no equivalent for. A client that sets
  one to a value that asks for something gets a 400 naming it; null, an empty object/list/string and the values
  listed as harmless are left out. What the mapping only `drop`s is documented as safe to ignore (bookkeeping such
  as `user`, `store`, `metadata`; hints such as `parallel_tool_calls`, `verbosity`, `prediction`), or is computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from proxy.errors import ClientRequestError

STRUCTURED: Final = ("json_object", "json_schema")


@dataclass(frozen=True, slots=True)
class Refusal:
    why: str
    harmless: tuple[Any, ...] = ()


def load_refusals(raw: Any) -> dict[str, Refusal]:
    """The `request.refuse` section: `{param: "why"}` or `{param: {why: "...", harmless: [values]}}`."""
    out: dict[str, Refusal] = {}
    for key, spec in (raw or {}).items():
        if isinstance(spec, Mapping):
            out[key] = Refusal(str(spec.get("why") or ""), tuple(spec.get("harmless") or ()))
        else:
            out[key] = Refusal(str(spec or ""))
    return out


def _asks_nothing(value: Any, refusal: Refusal) -> bool:
    if value is None or (isinstance(value, (dict, list, str)) and not value):
        return True
    return any(value == h for h in refusal.harmless)


def refuse_unsupported(body: dict[str, Any], refusals: Mapping[str, Refusal], upstream: str) -> dict[str, Any]:
    """400 for the first parameter set to something the upstream cannot do; the others, which ask for nothing, are
    left out (the body is returned, copied when changed)."""
    present = [key for key in refusals if key in body]
    if not present:
        return body
    for key in present:
        refusal = refusals[key]
        if not _asks_nothing(body[key], refusal):
            why = f" ({refusal.why})" if refusal.why else ""
            raise ClientRequestError(
                f"`{key}` is not supported by the upstream {upstream!r}{why}; it would be ignored, so it is "
                "refused. Remove it from the request.",
                param=key,
                code="unsupported_parameter",
            )
    return {k: v for k, v in body.items() if k not in refusals}


def apply_response_format(body: dict[str, Any], mode: str, upstream: str, dialect: str, hint: str,
                          json_mode: bool = False) -> dict[str, Any]:
    """`response_format` per the upstream's `response_format` mode (returns the body, copied when changed). `hint`:
    the dialect's advice when it is refused (proxy/dialects/base.py `RequestRules.response_format_hint`);
    `json_mode`: the upstream honours `json_object` (what `emulate` lets through)."""
    if "response_format" not in body:
        return body
    if mode == "pass":
        return body
    fmt = body["response_format"]
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if mode == "emulate" and kind == "json_object" and json_mode:
        return body
    if mode == "emulate" and kind in STRUCTURED:  # a request the emulation did not take (a completions request)
        raise ClientRequestError(
            f"`response_format` {kind!r} is emulated for the upstream {upstream!r} ({dialect}) on chat requests "
            "only.", param="response_format", code="unsupported_parameter")
    if mode == "reject" and kind in STRUCTURED:
        raise ClientRequestError(
            f"`response_format` {kind!r} is not supported by the upstream {upstream!r} ({dialect}): it would be "
            f"ignored, and the answer would not follow the format, so it is refused. {hint}",
            param="response_format",
            code="unsupported_parameter",
        )
    return {k: v for k, v in body.items() if k != "response_format"}
