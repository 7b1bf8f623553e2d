"""An independent compliance suite: llm-comply (PyPI, pinned in pyproject.toml's `test` extra) sends its own requests
in each client dialect — OpenAI Chat Completions, Open Responses, Anthropic Messages — streamed and not, and
validates every answer (and every Responses stream event) against the providers' published OpenAPI schemas it
bundles. Here it runs against the proxy in front of each built-in mock upstream, and every one of its tests must pass
but the ones named in EXCEPTIONS below, each of which must be the documented 400 (docs/compliance.md).

On top of llm-comply's own checks, the events it does not validate itself (Chat chunks, Anthropic stream events)
and its error answers are validated here against the same bundled schemas, and legacy Completions answers against
OpenAI's `CreateCompletionResponse` (the bundled OpenAI spec has it; llm-comply has no Completions suite).

`make test-compliance` runs just this module.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import llm_comply
import pytest
from jsonschema import Draft202012Validator
from llm_comply import http as comply_http
from llm_comply import result as comply_result
from llm_comply import runner as comply_runner
from llm_comply.config import ComplianceConfig
from llm_comply.schema import SpecLoader
from llm_comply.tests import get_tests
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from proxy.mock import create_app as create_mock_app
from proxy.server.app import create_app
from proxy.server.frontend import frontend_options
from proxy.settings import build_settings
from tests.conftest import ServerThread

SPECS = Path(llm_comply.__file__).parent / "specs"
assert llm_comply.__version__ == "0.5.0", "docs/compliance.md's figures are for llm-comply 0.5.0"

# The client model names. llm-comply skips its reasoning tests unless the model's name looks like a reasoning model
# ("deepseek-r" for Chat and Responses, a Claude 4 name for Anthropic's thinking test), so both are aliases of
# each upstream's reasoning model: the skipped tests run too.
CHAT_MODEL = "deepseek-r1"
CLAUDE_MODEL = "claude-sonnet-4-5"


@dataclass(frozen=True)
class Upstream:
    dialect: str
    full_text: bool
    model: str  # the upstream's own name the client names are aliases of


UPSTREAMS: dict[str, Upstream] = {
    "openai": Upstream("openai", False, "deepseek-r1"),  # an R1-named model: reasoning before `</think>`
    "mindie-full-text": Upstream("mindie", True, "DeepSeek-R1"),
    "mindie": Upstream("mindie", False, "DeepSeek-R1"),
    "siliconstorm": Upstream("siliconstorm", False, "DeepSeek-R1"),
    "deepseek": Upstream("deepseek", False, "deepseek-v4-flash"),  # thinking mode: `reasoning_content`
    "engine": Upstream("engine", False, "engine"),  # the engine API has no model names (none is sent)
}

# Test id -> llm-comply's format and its options. `open-responses` runs twice: with the proxy's default
# `client.responses_spec: openai_api`, and with `open_responses`, where the Responses endpoint follows Open Responses
# where the two specifications differ (docs/responses.md).
FORMATS: dict[str, dict[str, Any]] = {
    "openai-chat": {"model": CHAT_MODEL, "spec": "openai_chat.json"},
    "open-responses": {"model": CHAT_MODEL, "spec": "openresponses.json"},
    "open-responses-spec": {"format": "open-responses", "responses_spec": "open_responses", "model": CHAT_MODEL,
                            "spec": "openresponses.json"},
    "anthropic": {"model": CLAUDE_MODEL, "spec": "anthropic.json", "auth_header": "x-api-key",
                  "use_bearer_prefix": False, "extra_headers": {"anthropic-version": "2023-06-01"}},
}

# (upstream or "*", format) -> {llm-comply test id: why that upstream cannot do it}. Each must end in the documented
# 400 (an `invalid_request_error` naming the parameter), never a crash or a wrong 200.
EXCEPTIONS: dict[tuple[str, str], dict[str, str]] = {}

# Where the two Responses specifications disagree. Open Responses (its openapi.json, which llm-comply bundles) names
# the raw-reasoning stream events `response.reasoning.delta` / `.done`; OpenAI's API reference, its SDKs' types,
# vLLM, Codex and the Vercel AI SDK's Open Responses provider use `response.reasoning_text.delta` / `.done`, which
# is what the proxy sends by default (docs/responses.md) and what llm-comply reports as unknown. These errors, and
# only these, are set aside (docs/compliance.md) — for every run of the suite's format, and a run with
# `client.responses_spec: open_responses` must have had nothing to set aside.
SPEC_CONFLICTS: dict[str, frozenset[str]] = {
    "open-responses": frozenset({"unknown SSE event type: response.reasoning_text.delta",
                                 "unknown SSE event type: response.reasoning_text.done"}),
}

# Tests that fail until another change lands: each must still fail (so that the entry is removed when it passes).
PENDING: dict[tuple[str, str], dict[str, str]] = {}

# Anthropic stream events -> their schema in anthropic.json (`ping` has none: it is `{"type": "ping"}`).
ANTHROPIC_EVENTS: dict[str, str] = {
    "message_start": "MessageStartEvent", "content_block_start": "ContentBlockStartEvent",
    "content_block_delta": "ContentBlockDeltaEvent", "content_block_stop": "ContentBlockStopEvent",
    "message_delta": "MessageDeltaEvent", "message_stop": "MessageStopEvent", "error": "ErrorResponse",
}


def _named(table: dict[tuple[str, str], dict[str, str]], upstream: str, fmt: str) -> dict[str, str]:
    return {**table.get(("*", fmt), {}), **table.get((upstream, fmt), {})}


@dataclass
class Stack:
    base_url: str
    servers: list[ServerThread]


@pytest.fixture(scope="module")
def stacks() -> Iterator[Callable[[str], Stack]]:
    """The proxy in front of each mock upstream, started once per upstream and `client.responses_spec` for the whole
    module."""
    started: dict[tuple[str, str], Stack] = {}

    def get(name: str, responses_spec: str = "openai_api") -> Stack:
        if (name, responses_spec) not in started:
            up = UPSTREAMS[name]
            mock = ServerThread(create_mock_app(up.dialect, full_text=up.full_text)).start()
            aliases = {alias: up.model for alias in (CHAT_MODEL, CLAUDE_MODEL) if alias != up.model}
            settings = build_settings(config={"upstreams": [{
                "name": name, "dialect": up.dialect, "url": mock.url, "full_text": up.full_text,
                "aliases": aliases}], "client": {"responses_spec": responses_spec}}, environ={})
            proxy = ServerThread(create_app(settings), **frontend_options(settings.server)).start()
            started[(name, responses_spec)] = Stack(proxy.url + "/v1", [mock, proxy])
        return started[(name, responses_spec)]

    yield get
    comply_http.close_client()
    for stack in started.values():
        for srv in reversed(stack.servers):
            srv.stop()


class Spec:
    """One bundled OpenAPI document, for the checks llm-comply does not make. OpenAPI 3.0's `nullable: true` is read
    as the specification says — null is allowed besides the schema (OpenAI's `finish_reason` of a stream chunk, the
    `usage: null` of a chunk) — where llm-comply's own loader only widens a `type` and so rejects a null `enum` or
    `$ref` value that OpenAI itself sends."""

    def __init__(self, path: Path) -> None:
        document = _nullable(json.loads(path.read_text()))
        self.registry: Registry[Any] = Registry().with_resource(
            "urn:spec", Resource.from_contents(document, default_specification=DRAFT202012))
        self._validators: dict[str, Draft202012Validator] = {}

    def errors(self, data: Any, schema: str) -> list[str]:
        validator = self._validators.get(schema)
        if validator is None:
            validator = self._validators[schema] = Draft202012Validator(
                {"$ref": f"urn:spec#/components/schemas/{schema}"}, registry=self.registry)
        return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(data)]


def _nullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _nullable(value) for key, value in node.items() if key != "nullable"}
    return {"anyOf": [out, {"type": "null"}]} if node.get("nullable") is True else out


@pytest.fixture(scope="module")
def specs() -> dict[str, SpecLoader]:
    return {opts.get("format", fmt): SpecLoader(str(SPECS / opts["spec"])) for fmt, opts in FORMATS.items()}


@pytest.fixture(scope="module")
def own_specs() -> dict[str, Spec]:
    return {opts.get("format", fmt): Spec(SPECS / opts["spec"]) for fmt, opts in FORMATS.items()}


def _event_errors(fmt: str, spec: Spec, events: list[dict[str, Any]]) -> list[str]:
    """Schema errors of the stream events llm-comply leaves unvalidated (Chat chunks, Anthropic events)."""
    errors: list[str] = []
    for n, event in enumerate(events):
        data = event.get("data")
        if not isinstance(data, dict):
            continue
        if fmt == "openai-chat":
            schema = "CreateChatCompletionStreamResponse" if "choices" in data else "ErrorResponse"
        elif fmt == "anthropic":
            if event["type"] == "ping":
                continue
            schema = ANTHROPIC_EVENTS.get(event["type"], "")
            if not schema:
                errors.append(f"event {n}: unknown Anthropic event type {event['type']!r}")
                continue
        else:
            continue  # Responses events: llm-comply validates each itself
        errors += [f"event {n} ({event['type'] or 'chunk'}): {e}" for e in spec.errors(data, schema)]
    return errors


def _documented_400(body: Any, fmt: str) -> list[str]:
    """What an exception's answer must be: the 400 envelope of the client dialect, naming what it refuses."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return [f"not an error envelope: {body!r:.300}"]
    error = body["error"]
    if error.get("type") != "invalid_request_error" or not error.get("message"):
        return [f"not an invalid_request_error with a message: {error!r:.300}"]
    if fmt == "anthropic" and body.get("type") != "error":
        return [f"not Anthropic's error shape: {body!r:.300}"]
    return []


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("upstream", list(UPSTREAMS))
def test_llm_comply(stacks: Callable[[str], Stack], specs: dict[str, SpecLoader], own_specs: dict[str, Spec],
                    upstream: str, fmt: str) -> None:
    opts = FORMATS[fmt]
    responses_spec = opts.get("responses_spec", "openai_api")
    fmt = opts.get("format", fmt)  # llm-comply's own name of the format
    config = ComplianceConfig(base_url=stacks(upstream, responses_spec).base_url, api_key="sk-client-key",
                              model=opts["model"],
                              auth_header=opts.get("auth_header", "Authorization"),
                              use_bearer_prefix=opts.get("use_bearer_prefix", True),
                              extra_headers=opts.get("extra_headers"), timeout=30.0, verbose=True)
    spec = specs[fmt]
    own_spec = own_specs[fmt]
    cases = get_tests(fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # jsonschema's RefResolver, used by llm-comply
        results = [comply_runner.TestRunner(config, cases, spec).run_one(case) for case in cases]

    exceptions = _named(EXCEPTIONS, upstream, fmt)
    pending = _named(PENDING, upstream, fmt)
    assert set(exceptions) | set(pending) <= {case.id for case in cases}, "an exception names no llm-comply test"
    conflicts = SPEC_CONFLICTS.get(fmt, frozenset())
    problems: list[str] = []
    set_aside: list[str] = []
    for case, result in zip(cases, results, strict=True):
        errors = [e for e in result.errors if e not in conflicts]
        set_aside += [f"{case.id}: {e}" for e in result.errors if e in conflicts]
        if case.streaming and result.stream_events:
            errors += _event_errors(fmt, own_spec, result.stream_events)
        if not case.streaming and case.expected_statuses != [200] and isinstance(result.response, dict) \
                and "error" in result.response:
            schema = "Error" if fmt == "open-responses" else "ErrorResponse"
            body = result.response["error"] if fmt == "open-responses" else result.response
            errors += [f"error body: {e}" for e in own_spec.errors(body, schema)]
        if result.status is comply_result.TestStatus.SKIPPED:
            errors.append(f"skipped: {result.errors}")
        if case.id in pending:
            if not errors:
                problems.append(f"{case.id}: passes now; remove it from PENDING ({pending[case.id]})")
            continue
        if case.id in exceptions:
            if errors != [f"HTTP 400 (expected {case.expected_statuses})"]:
                problems.append(f"{case.id}: expected only the documented 400, got {errors}")
            problems += [f"{case.id}: {e}" for e in _documented_400(result.response, fmt)]
            continue
        if errors:
            detail = json.dumps(result.response, ensure_ascii=False)[:600] if result.response is not None else ""
            problems.append(f"{case.id}: {errors[:8]} {detail}")
    if responses_spec == "open_responses":  # following Open Responses, nothing of it is set aside
        problems += [f"set aside under responses_spec open_responses: {e}" for e in set_aside]
    elif fmt == "open-responses" and upstream != "engine":  # the set-aside is needed (a model that reasons)
        if not set_aside:
            problems.append("nothing set aside: SPEC_CONFLICTS may go")
    assert not problems, "\n".join(problems)


# -- legacy Completions (no llm-comply suite): the same schema check, against OpenAI's CreateCompletionResponse ----

# Upstreams whose API has no legacy completion for the reasoning model: the documented 400.
COMPLETIONS_EXCEPTIONS: dict[str, str] = {}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("upstream", list(UPSTREAMS))
def test_legacy_completions_schema(stacks: Callable[[str], Stack], own_specs: dict[str, Spec], upstream: str,
                                   stream: bool) -> None:
    spec = own_specs["openai-chat"]
    body = {"model": CHAT_MODEL, "prompt": "Say hello.", "max_tokens": 32, "stream": stream}
    with httpx.Client(timeout=30) as client:
        if not stream:
            resp = client.post(stacks(upstream).base_url + "/completions", json=body)
            data = resp.json()
            if upstream in COMPLETIONS_EXCEPTIONS:
                assert resp.status_code == 400 and not _documented_400(data, "openai-chat"), data
                return
            assert resp.status_code == 200, data
            assert spec.errors(data, "CreateCompletionResponse") == []
            assert data["choices"][0]["text"]
            return
        with client.stream("POST", stacks(upstream).base_url + "/completions", json=body) as resp:
            if upstream in COMPLETIONS_EXCEPTIONS:
                assert resp.status_code == 400
                assert not _documented_400(json.loads(resp.read()), "openai-chat")
                return
            assert resp.status_code == 200, resp.read()
            lines = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    errors: list[str] = []
    for chunk in chunks:
        # A stream is the same object chunk by chunk, with `finish_reason` null until the choice ends (OpenAI's
        # reference: "the same shape as the completion object"); the schema's enum has no null, so a null is
        # checked as the stream's absence of a reason and the rest validated.
        checked = {**chunk, "choices": [{**c, "finish_reason": c["finish_reason"] or "stop"}
                                        for c in chunk["choices"]]}
        errors += spec.errors(checked, "CreateCompletionResponse")
    assert errors == []
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
