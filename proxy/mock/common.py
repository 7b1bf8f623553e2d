"""Shared by every mock dialect: configuration, the inference-endpoint wrapper, introspection routes, helpers."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.mock import scenario as scenarios
from proxy.mock import toolcall
from proxy.mock.asgi import SLEEP, Noop, Plan, PlanResponse, Stats, drop_before_plan, hang_plan, json_plan
from proxy.mock.scenario import Scenario


@dataclass(frozen=True)
class MockConfig:
    dialect: str
    full_text: bool = False
    api_key: str | None = None
    served_model: str | None = None
    flavour: str = ""  # a dialect's variant of its server (proxy/mock/README.md "Flavours"); "" = today's


@dataclass
class Call:
    """One inference request as a dialect handler sees it."""

    cfg: MockConfig
    stats: Stats
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    body: Any  # the parsed JSON, or None when the body is not JSON (see json_ok)
    json_ok: bool
    scenario: Scenario
    seq: int
    created: int

    @property
    def authorized(self) -> bool:
        key = self.cfg.api_key
        return key is None or self.headers.get("authorization", "") == f"Bearer {key}"

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def include_usage(self) -> bool:
        opts = self.body.get("stream_options") if isinstance(self.body, dict) else None
        return isinstance(opts, dict) and bool(opts.get("include_usage"))

    @property
    def model(self) -> str:
        model = self.body.get("model") if isinstance(self.body, dict) else None
        return model if isinstance(model, str) else (self.cfg.served_model or "")


Handler = Callable[[Call], Plan]

# The header the proxy's readiness checks carry (proxy/gateway/health.py; the mock shares no code with the proxy).
CHECK_HEADER = "x-dialect-proxy-check"


def inference(cfg: MockConfig, stats: Stats, handler: Handler,
              scenario_of: Callable[[Any], Scenario] = toolcall.chat_scenario) -> Callable[[Request], Any]:
    """A Starlette endpoint that records the request, lets `handler` build the plan, and runs it."""

    counted, aside = stats, Stats()

    async def endpoint(request: Request) -> Any:
        stats = counted
        if CHECK_HEADER in request.headers:
            # A readiness check of the proxy's: answered as any request, counted apart (in `checks`), so that the
            # counters and last_request stay those of the clients' requests. Server-wide directives apply to it.
            counted.checks += 1
            aside.directives = counted.directives
            stats = aside
        stats.requests += 1
        stats.seq += 1
        stats.in_flight += 1
        try:
            raw = await request.body()
        except ClientDisconnect:
            stats.in_flight -= 1
            stats.disconnects += 1
            return Noop()
        try:
            try:
                body: Any = orjson.loads(raw)
                ok = True
            except orjson.JSONDecodeError:
                body, ok = None, False
            headers: dict[str, str] = {}
            for name, value in request.headers.items():
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            # The W3C trace context the caller sent (null without one), on its own: a traced proxy's upstream request
            # carries its attempt's span here (tests/test_tracing.py).
            stats.last_request = {"method": request.method, "path": request.url.path, "headers": headers,
                                  "body": body, "traceparent": headers.get("traceparent")}
            stats.recent.append(stats.last_request)
            sc = scenario_of(body) if ok else scenarios.EMPTY
            if stats.directives:  # server-wide directives win over the request's own
                sc = Scenario({**sc.flags, **stats.directives}, sc.tool_call, sc.reply)
                if "call_tool" in stats.directives or "wrong_json" in stats.directives:
                    # resolved against this request, as the request's own is (a forced tool's wrong arguments too)
                    sc = toolcall.resolve(body, Scenario(sc.flags))
            sc = scenarios.no_tools_no_calls(body, sc)
            if ok and isinstance(body, dict) and isinstance(body.get("messages"), list):
                stats.prefix.observe(body["messages"])
            call = Call(cfg, stats, request.method, request.url.path, headers, raw, body, ok, sc, stats.seq,
                        int(time.time()))
            plan = handler(call)
            first_byte = sc.seconds("first_byte_ms")
            if first_byte:
                plan = [(SLEEP, first_byte), *plan]
            return PlanResponse(plan, stats)
        except BaseException:
            stats.in_flight -= 1
            raise

    return endpoint


def parse_directives(text: str) -> dict[str, str]:
    """Server-wide directives: `error=503,first_byte_ms=100` (or the `[mock:...]` form); empty text clears them."""
    text = text.strip()
    if not text:
        return {}
    return dict(scenarios.parse(text if text.lower().startswith("[mock:") else f"[mock:{text}]").flags)


def connection_directives(sc: Scenario) -> Plan | None:
    """`drop_before` and `hang`: behaviours that never produce an HTTP response."""
    if sc.has("drop_before"):
        return drop_before_plan()
    if sc.has("hang"):
        return hang_plan(float(sc.num("hang", 120, lo=0, hi=120) or 120))
    return None


def requested_status(sc: Scenario) -> int | str | None:
    """The `error=STATUS` directive: an int, or a special word such as `raw500`; None when absent."""
    value = sc.get("error")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return value.lower() or 500


def preamble(call: Call, error_plan: Callable[[int], Plan]) -> Plan | None:
    """What every OpenAI-shaped mock checks first, in order: the API key, `drop_before`/`hang`, `error=STATUS`
    (rendered in the dialect's own error shape by `error_plan`; special words become a 500)."""
    if not call.authorized:
        return error_plan(401)
    if (plan := connection_directives(call.scenario)) is not None:
        return plan
    if (status := requested_status(call.scenario)) is not None:
        return error_plan(status if isinstance(status, int) else 500)
    return None


RAW_TIMEOUT = b"Engine callback timeout: server tokenTimeout"


def stream_directives(sc: Scenario) -> dict[str, Any]:
    """The stream-damage and timing directives, as keyword arguments of `asgi.stream_plan`."""
    return {
        "delay": sc.seconds("delay_ms"),
        "drop": sc.num("drop", None, lo=0),
        "stall": sc.num("stall", None, lo=0),
        "raw_after": (sc.num("raw_timeout", 3, lo=0) if sc.has("raw_timeout") else None),
        "raw": RAW_TIMEOUT,
        "bad_json": sc.has("bad_json"),
    }


# ------------------------------------------------------------------------------------------ OpenAI-shaped errors

def openai_error(status: int, message: str, type_: str, code: str | None = None, param: str | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> Plan:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    hdrs = [(b"content-type", b"application/json"), *(headers or [])]
    return json_plan(status, body, hdrs)


class Template:
    """Pre-encoded SSE frame with one slot: `frame(value)` costs one small orjson call and two joins."""

    SLOT = "@@mock-slot@@"

    __slots__ = ("prefix", "suffix")

    def __init__(self, obj: Any) -> None:
        encoded = orjson.dumps(obj)
        self.prefix, self.suffix = encoded.split(orjson.dumps(self.SLOT), 1)
        self.prefix = b"data: " + self.prefix
        self.suffix = self.suffix + b"\n\n"

    def frame(self, value: Any) -> bytes:
        return self.prefix + orjson.dumps(value) + self.suffix


def int_param(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --------------------------------------------------------------------------------------------- common endpoints

def common_routes(stats: Stats) -> list[Route]:
    async def get_stats(request: Request) -> Response:
        return JSONResponse(stats.snapshot())

    async def last_request(request: Request) -> Response:
        return JSONResponse(stats.last_request)

    async def recent(request: Request) -> Response:
        return JSONResponse(list(stats.recent))

    async def reset(request: Request) -> Response:
        stats.reset()
        return JSONResponse(stats.snapshot())

    async def health(request: Request) -> Response:
        return Response(status_code=503 if "unhealthy" in stats.directives else 200)

    async def directives(request: Request) -> Response:
        if request.method == "POST":
            try:
                data = orjson.loads(await request.body())
                text = data["directives"] if isinstance(data, dict) else None
            except (orjson.JSONDecodeError, KeyError):
                text = None
            if not isinstance(text, str):
                return JSONResponse({"error": 'expected {"directives": "key=value,flag,..."}'}, status_code=400)
            stats.directives = parse_directives(text)
        return JSONResponse(stats.directives)

    async def prefix_cache(request: Request) -> Response:
        return JSONResponse(stats.prefix.snapshot())

    return [
        Route("/_mock/directives", directives, methods=["GET", "POST"]),
        Route("/_mock/prefix_cache", prefix_cache, methods=["GET"]),
        Route("/_mock/stats", get_stats, methods=["GET"]),
        Route("/_mock/last_request", last_request, methods=["GET"]),
        Route("/_mock/requests", recent, methods=["GET"]),
        Route("/_mock/reset", reset, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]


def models_routes(stats: Stats, names: list[str], owned_by: str, paths: tuple[str, ...] = ("/v1/models",),
                  check_auth: Callable[[Request], Response | None] | None = None,
                  not_found: Callable[[str], Response] | None = None) -> list[Route]:
    """GET /v1/models (OpenAI list shape) and GET /v1/models/{model}."""

    def card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": stats.created, "owned_by": owned_by}

    async def list_models(request: Request) -> Response:
        stats.model_lists += 1
        if check_auth is not None and (denied := check_auth(request)) is not None:
            return denied
        return JSONResponse({"object": "list", "data": [card(n) for n in names]})

    async def get_model(request: Request) -> Response:
        if check_auth is not None and (denied := check_auth(request)) is not None:
            return denied
        name = request.path_params["model"]
        if name in names:
            return JSONResponse(card(name))
        if not_found is not None:
            return not_found(name)
        return JSONResponse({"error": {"message": f"The model `{name}` does not exist", "type":
                                       "invalid_request_error", "param": None, "code": "model_not_found"}},
                            status_code=404)

    routes: list[Route] = []
    for path in paths:
        routes += [Route(path, list_models, methods=["GET"]),
                   Route(path + "/{model:path}", get_model, methods=["GET"])]
    return routes


def static_response(plan: Plan) -> Response:
    """A plain Starlette response from a simple (START, BODY) plan; used outside the counted inference paths."""
    start, body = plan[0], plan[1]
    headers = {k.decode(): v.decode() for k, v in start[2] if k != b"content-length"}
    return Response(content=body[1], status_code=start[1], headers=headers)


def bearer_checker(cfg: MockConfig, denied: Callable[[], Response]) -> Callable[[Request], Response | None]:
    def check(request: Request) -> Response | None:
        if cfg.api_key is None or request.headers.get("authorization", "") == f"Bearer {cfg.api_key}":
            return None
        return denied()

    return check
