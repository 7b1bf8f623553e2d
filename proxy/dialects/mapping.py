"""Declarative per-dialect maps: mappings/<dialect>.yaml -> a frozen `DialectMapping`.

The YAML says *what* differs (paths, renames, drops, ranges, clamps, finish reasons, error statuses, fields to strip);
the dialect modules hold only what must be computed. Schema (every section optional):

    paths: {chat: /v1/chat/completions, completions: /v1/completions, models: /v1/models, health: /health}
                                                       # health: the server's own health endpoint (GET, 2xx when
                                                       # serving), asked by /readyz when no health_url is set; null:
                                                       # none on this port (proxy/gateway/health.py)
    native: {responses: /v1/responses, messages: {path: /anthropic/v1/messages, auth: x-api-key}}
                                                       # client dialects served as they are (proxy/dialects/base.py)
    request:
      rename: {max_completion_tokens: max_tokens}      # applied only when the target is absent
      drop: [stream_options, store]                    # removed before sending (safe to ignore, or computed)
      refuse:                                          # set by a client -> 400 naming it (proxy/hub/params.py)
        logit_bias: "no logit bias"                    # why; null and empty values ask for nothing
        modalities: {why: "text only", harmless: [[text]]}
      ranges:                                          # checked after renames; error 400 names the param
        temperature: {min: 0, max: 2}
        top_p: {min: 0, max: 1, min_exclusive: true, clamp_min: 1.0e-6}   # clamp instead of refusing
        top_k: {min: 0, clamp_min: 1, clamp_min_from: 0}   # clamp only values >= clamp_min_from; refuse lower
      max_items: {stop: 1024}
      integer: [max_tokens]
    response:
      finish_reason: {eos_token: stop}
      strip: [full_text, prefill_time]                 # top-level chunk/response fields never forwarded
    errors:
      status: {422: 400, 424: 502}                     # upstream HTTP status -> our status
      code: {701: 402, 9999: 502}                      # error code in the body (Siliconstorm) -> our status
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from proxy.errors import ClientRequestError
from proxy.hub.params import Refusal, load_refusals


@dataclass(frozen=True, slots=True)
class Range:
    # int | float, not float: an integer (max_tokens) stays one, in the compiled build (setup.py) too
    min: int | float | None = None
    max: int | float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    clamp_min: int | float | None = None
    clamp_max: int | float | None = None
    clamp_min_from: int | float | None = None  # clamp_min applies only to values >= this (lower ones are refused)


@dataclass(frozen=True, slots=True)
class DialectMapping:
    paths: Mapping[str, str | None] = field(default_factory=dict)
    rename: Mapping[str, str] = field(default_factory=dict)
    drop: frozenset[str] = frozenset()
    refuse: Mapping[str, Refusal] = field(default_factory=dict)
    ranges: Mapping[str, Range] = field(default_factory=dict)
    max_items: Mapping[str, int] = field(default_factory=dict)
    integer: frozenset[str] = frozenset()
    finish_reason: Mapping[str, str] = field(default_factory=dict)
    strip: tuple[str, ...] = ()  # iterated on every MindIE answer (compiled, a frozenset is iterated generically)
    error_status: Mapping[int, int] = field(default_factory=dict)
    error_code: Mapping[int, int] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict)
    # The request fields that a drop, an integer, range or item-count rule names: apply_request looks at those of a
    # body's fields only (a body has a handful; the rules name ~30 on MindIE).
    checked: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        checked = self.drop | self.integer | frozenset(self.ranges) | frozenset(self.max_items)
        object.__setattr__(self, "checked", checked)

    def apply_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """Renames, then drops, integer checks, range checks and item counts, each over the body's fields that its
        rules name, in the body's order (a shallow copy is returned). Walking the body's few fields rather than every
        rule (docs/speed.md). Each check is one pass, so that a body with two faults is refused for the same one
        whatever their order."""
        out = self._renamed(body)
        checked = self.checked
        present = [key for key in out if key in checked]
        if not present:
            return out
        for key in present:
            if key in self.drop:
                del out[key]
        self._check_integers(out, present)
        self._check_ranges(out, present)
        self._check_items(out, present)
        return out

    def _renamed(self, body: dict[str, Any]) -> dict[str, Any]:
        """A copy of `body` with the renames applied (a value goes to its new name only when that name is unset)."""
        out = dict(body)
        for src, dst in self.rename.items():
            if src in out:
                value = out.pop(src)
                if dst not in out or out[dst] is None:
                    out[dst] = value
        return out

    def _check_integers(self, out: dict[str, Any], present: list[str]) -> None:
        for key in present:
            if key in self.integer:
                value = out.get(key)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                    raise ClientRequestError(f"`{key}` must be an integer, got {value!r}.", param=key)

    def _check_ranges(self, out: dict[str, Any], present: list[str]) -> None:
        """Each ranged number in its range: clamped where the rule says so, else a 400 naming it."""
        for key in present:
            r = self.ranges.get(key)
            if r is None or out.get(key) is None:
                continue
            value = out[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ClientRequestError(f"`{key}` must be a number, got {value!r}.", param=key)
            out[key] = _check_range(key, value, r)

    def _check_items(self, out: dict[str, Any], present: list[str]) -> None:
        for key in present:
            limit = self.max_items.get(key)
            value = out.get(key)
            if limit is not None and isinstance(value, list) and len(value) > limit:
                raise ClientRequestError(
                    f"`{key}` has {len(value)} items; this upstream accepts at most {limit}.", param=key
                )


def _check_range(key: str, value: int | float, r: Range) -> int | float:
    low_bad = r.min is not None and (value < r.min or (r.min_exclusive and value == r.min))
    high_bad = r.max is not None and (value > r.max or (r.max_exclusive and value == r.max))
    if low_bad and r.clamp_min is not None and (r.clamp_min_from is None or value >= r.clamp_min_from):
        return r.clamp_min
    if high_bad and r.clamp_max is not None:
        return r.clamp_max
    if low_bad or high_bad:
        lo = "(" if r.min_exclusive else "["
        hi = ")" if r.max_exclusive else "]"
        span = f"{lo}{'-inf' if r.min is None else r.min}, {'inf' if r.max is None else r.max}{hi}"
        raise ClientRequestError(f"`{key}` = {value} is outside {span} accepted by this upstream.", param=key)
    return value


# A checkout run without an install (PYTHONPATH=.): the YAML files sit in the tree's top-level mappings/ folder,
# two levels above this file's folder (proxy/dialects/), where pyproject's package-dir maps `proxy.mappings` from.
_SOURCE_MAPPINGS = Path(__file__).resolve().parents[2] / "mappings"


def _mapping_dir() -> Path:
    try:
        return Path(str(resources.files("proxy.mappings")))
    except ModuleNotFoundError:  # running from a source tree without an install
        return _SOURCE_MAPPINGS


@functools.cache
def load_mapping(dialect: str) -> DialectMapping:
    path = _mapping_dir() / f"{dialect}.yaml"
    if not path.exists():
        path = _SOURCE_MAPPINGS / f"{dialect}.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    request = data.get("request") or {}
    response = data.get("response") or {}
    errors = data.get("errors") or {}
    return DialectMapping(
        paths=dict(data.get("paths") or {}),
        rename=dict(request.get("rename") or {}),
        drop=frozenset(request.get("drop") or ()),
        refuse=load_refusals(request.get("refuse")),
        ranges={k: Range(**v) for k, v in (request.get("ranges") or {}).items()},
        max_items=dict(request.get("max_items") or {}),
        integer=frozenset(request.get("integer") or ()),
        finish_reason=dict(response.get("finish_reason") or {}),
        strip=tuple(dict.fromkeys(response.get("strip") or ())),
        error_status={int(k): int(v) for k, v in (errors.get("status") or {}).items()},
        error_code={int(k): int(v) for k, v in (errors.get("code") or {}).items()},
        raw=data,
    )
