"""The OpenAI Responses API (`/v1/responses`) as a client spoke: request mapping in responses_request.py, the event
stream and the response object in responses_events.py; this module adds conversation state.

State (the state store, proxy/state): a response created with `store` (default true, as OpenAI) is kept under
namespace "responses" as its response object plus the conversation so far in hub form, so that
`previous_response_id` continues it and `GET`/`DELETE /v1/responses/{id}` answer. `store: false` keeps nothing
(Codex sends the whole history every turn instead). An unknown, expired or unstored `previous_response_id` is a 400
(docs/decisions.md "Client dialects and state"); a store that cannot be reached is a 503 for requests that need it.
An `item_reference` input item names an output item of a stored response (an item's id carries its response's id:
responses_events.item_response_hex) and stands for that item (the Vercel AI SDK sends them from its second turn on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from proxy.clients.base import ClientCall, ClientDialect, Encoder, Headers, Outcome, openai_error_response
from proxy.clients.responses_compact import CompactionEncoder, retained_items, summary_request
from proxy.clients.responses_events import (
    REASONING_EVENTS,
    Echo,
    ResponsesEncoder,
    item_response_hex,
    responses_consumer,
)
from proxy.clients.responses_native import ResponsesReader, stream_error
from proxy.clients.responses_request import COMPACTION_TRIGGER, Decoded, to_chat
from proxy.clients.signature import COMPACTION, ThinkingSigner
from proxy.clients.validate import (
    ARRAY,
    BOOLEAN,
    INTEGER,
    NULL,
    NUMBER,
    OBJECT,
    STRING,
    FieldTable,
    check_types,
    compile_table,
)
from proxy.errors import ClientRequestError, ProxyError
from proxy.hub.canonical import CHAT

if TYPE_CHECKING:
    from proxy.hub.canonical import RequestContext
    from proxy.hub.events import Answer
    from proxy.hub.sse import Event
    from proxy.settings import Settings
    from proxy.state.base import StateStore

NAMESPACE: Final = "responses"
# The fields' JSON types, checked once at the edge (proxy/clients/validate.py): a wrong type is a 400 naming the
# parameter.
RESPONSES_FIELDS: Final[FieldTable] = {
    "model": STRING,
    "input": (STRING, ARRAY, NULL),
    "input[]": OBJECT,
    "input[].role": STRING,
    "input[].type": STRING,
    "input[].content": (STRING, ARRAY, NULL),
    "input[].call_id": STRING,
    "input[].name": STRING,
    "input[].arguments": (STRING, OBJECT),
    "instructions": (STRING, NULL),
    "stream": (BOOLEAN, NULL),
    "store": (BOOLEAN, NULL),
    "background": (BOOLEAN, NULL),
    "tools": (ARRAY, NULL),
    "tools[]": OBJECT,
    "tools[].type": STRING,
    "tools[].name": STRING,
    "tool_choice": (STRING, OBJECT, NULL),
    "parallel_tool_calls": (BOOLEAN, NULL),
    "max_output_tokens": (INTEGER, NULL),
    "temperature": (NUMBER, NULL),
    "top_p": (NUMBER, NULL),
    "top_logprobs": (INTEGER, NULL),
    "previous_response_id": (STRING, NULL),
    "include": (ARRAY, NULL),
    "include[]": STRING,
    "metadata": (OBJECT, NULL),
    "reasoning": (OBJECT, NULL),
    "reasoning.effort": (STRING, NULL),
    "reasoning.summary": (STRING, NULL),
    "text": (OBJECT, NULL),
    "text.format": (OBJECT, NULL),
    "user": (STRING, NULL),
}
_TABLE: Final = compile_table(RESPONSES_FIELDS)
IGNORED_TOOLS_HEADER: Final = b"x-dialect-proxy-ignored-tools"
_ENCRYPTED: Final = "reasoning.encrypted_content"


class ResponsesCall(ClientCall):
    """A Responses request: its decoded form and what the encoder and the store need again."""

    decoded: Decoded  # the hub request with the conversation so far (responses_request.py to_chat)
    store: bool  # `store` (default true): the answer is kept for previous_response_id and GET
    echo: Echo  # the request fields the response object repeats
    seal: bool  # reasoning.encrypted_content was asked for in `include`
    compact: bool  # the answer is the conversation's summary (responses_compact.py)
    retained: list[dict[str, Any]] | None  # the compact endpoint: the input items the compaction keeps

    def __init__(self, decoded: Decoded, model: str, stream: bool, store: bool, echo: Echo, seal: bool,
                 headers: Headers | None = None) -> None:
        super().__init__(decoded.request, CHAT, model, stream, headers)
        self.decoded = decoded
        self.store = store
        self.echo = echo
        self.seal = seal
        self.compact = False
        self.retained = None


class ResponsesClient(ClientDialect[ResponsesCall]):
    name = "responses"
    path = "/v1/responses"
    id_prefix = "resp_"
    websocket = True

    def __init__(self, settings: Settings, store: StateStore) -> None:
        super().__init__(settings, store)
        key = settings.client.thinking_key  # the same key signs Anthropic thinking blocks (proxy/clients/messages.py)
        self.signer = ThinkingSigner(key.encode() if key else None)
        self.sealer = self.signer.for_domain(COMPACTION)  # seals compaction summaries (responses_compact.py)
        # where the two Responses specifications differ, the one this endpoint follows (client.responses_spec)
        self.reasoning_events = REASONING_EVENTS[settings.client.responses_spec]
        # A WebSocket connection's own copy has its connection-local state here (for_socket): response id -> record
        self.cache: dict[str, bytes] | None = None

    def for_socket(self, cache: dict[str, bytes]) -> ResponsesClient:
        """This client for one WebSocket connection (proxy/server/responses_socket.py): `previous_response_id` is
        looked up in the connection's `cache` first, and every response answered on it is kept there, stored or not
        (the Open Responses spec's connection-local state: `store: false` continues on the same socket)."""
        client = ResponsesClient(self.settings, self.store)
        client.cache = cache
        return client

    async def decode(self, body: dict[str, Any]) -> ResponsesCall:
        check_types(body, _TABLE)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ClientRequestError("`model` is required and must be a non-empty string.", param="model")
        stream = body.get("stream") is True
        store = body.get("store") is not False
        include = body.get("include") or []
        previous = body.get("previous_response_id")
        history: list[dict[str, Any]] = []
        if previous is not None:
            history = await self._history(previous)
        items = body.get("input")
        wanted = [item.get("id") for item in items if isinstance(item, dict) and item.get("type") == "item_reference"] \
            if isinstance(items, list) else None
        references = await self._references(wanted) if wanted else None  # a store read only when there are any
        decoded = to_chat(body, history, self.signer, references)
        # Codex's remote compaction: this turn's answer is the conversation's summary, as a compaction item.
        compact = isinstance(items, list) and bool(items) and isinstance(items[-1], dict) \
            and items[-1].get("type") == COMPACTION_TRIGGER
        if compact:
            decoded.request = summary_request(decoded.request)
        call = ResponsesCall(decoded, model, stream, store, Echo(body), _ENCRYPTED in include)
        call.compact = compact
        if decoded.ignored_tools:
            names = ",".join(dict.fromkeys(decoded.ignored_tools))
            call.headers.append((IGNORED_TOOLS_HEADER, names.encode()))
            call.log_note = ("ignored_tools", names)
        return call

    async def _history(self, previous: Any) -> list[dict[str, Any]]:
        if not isinstance(previous, str) or not previous:
            raise ClientRequestError("`previous_response_id` must be a string.", param="previous_response_id")
        raw = self.cache.get(previous) if self.cache is not None else None
        if raw is None:
            raw = await self.store.get(NAMESPACE, previous)
        if raw is None:
            where = ""
            if self.store.describe() == "memory":  # a memory store is per process: name that cause too
                where = (" This proxy keeps responses in its own process's memory (state_store: memory), so a "
                         "response stored by another proxy replica or before a restart is not found here either.")
            raise ClientRequestError(
                f"Previous response with id '{previous}' not found (unknown, expired, or created with store: false)."
                + where, param="previous_response_id", code="previous_response_not_found")
        messages: list[dict[str, Any]] = orjson.loads(raw)["messages"]
        return messages

    async def _references(self, wanted: list[Any]) -> dict[str, dict[str, Any]]:
        """Item id -> the stored output item, for the ids of the `item_reference` items of `input`. An id that names
        no stored item is left out: to_chat refuses its reference with a 400 that names it."""
        found: dict[str, dict[str, Any]] = {}
        outputs: dict[str, dict[str, Any]] = {}  # response id -> its output items by id (each response read once)
        for item_id in wanted:
            hex_id = item_response_hex(item_id) if isinstance(item_id, str) else None
            if hex_id is None:
                continue
            response_id = self.id_prefix + hex_id
            if response_id not in outputs:
                raw = await self.store.get(NAMESPACE, response_id)
                output = orjson.loads(raw)["response"]["output"] if raw is not None else []
                outputs[response_id] = {item["id"]: item for item in output}
            if item_id in outputs[response_id]:
                found[item_id] = outputs[response_id][item_id]
        return found

    def encoder(self, call: ResponsesCall, ctx: RequestContext, answer: Answer) -> Encoder:
        decoded = call.decoded
        sink = responses_consumer(call.stream, self.reasoning_events)
        encoder = ResponsesEncoder(ctx, answer, sink, call.echo, decoded.tools, self.signer if call.seal else None)
        if call.store or self.cache is not None:  # kept: the store, or the connection's own state (for_socket)
            encoder.history = decoded.messages
            encoder.store = call.store
        if call.compact:
            return CompactionEncoder(encoder, self.sealer, call.retained)
        return encoder

    def error_response(self, err: ProxyError) -> tuple[int, Headers, bytes]:
        return openai_error_response(err)

    async def completed(self, outcome: Outcome) -> None:
        raw = orjson.dumps(outcome.record)
        if self.cache is not None:  # the connection's most recent response only
            self.cache.clear()
            self.cache[outcome.response_id] = raw
        if outcome.store:
            await self.store.put(NAMESPACE, outcome.response_id, raw)

    def native_reader(self) -> ResponsesReader:
        return ResponsesReader()

    def native_error(self, err: ProxyError) -> Event:
        return stream_error(err)

    def routes(self) -> list[BaseRoute]:
        return [Route(self.path + "/{response_id}", self._get_or_delete, methods=["GET", "DELETE"])]

    async def _get_or_delete(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        try:
            if request.method == "DELETE":
                if not await self.store.delete(NAMESPACE, response_id):
                    raise _not_found(response_id)
                body = orjson.dumps({"id": response_id, "object": "response.deleted", "deleted": True})
                return Response(body, media_type="application/json")
            raw = await self.store.get(NAMESPACE, response_id)
            if raw is None:
                raise _not_found(response_id)
            return Response(orjson.dumps(orjson.loads(raw)["response"]), media_type="application/json")
        except ProxyError as err:
            status, headers, payload = openai_error_response(err)
            return Response(payload, status, {k.decode(): v.decode() for k, v in headers},
                            media_type="application/json")


class CompactClient(ResponsesClient):
    """`POST /v1/responses/compact` (responses_compact.py): the conversation of a Responses request body, summarised
    by the upstream model into one compaction item, after the conversation's user messages."""

    name = "responses_compact"
    path = "/v1/responses/compact"
    websocket = False

    async def decode(self, body: dict[str, Any]) -> ResponsesCall:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ClientRequestError("`model` is required and must be a non-empty string.", param="model",
                                     code="missing_required_parameter")
        # The compact body's own fields; anything else (sampling, tools, stream ...) has no meaning here.
        request: dict[str, Any] = {key: body[key] for key in _COMPACT_FIELDS if key in body}
        call = await super().decode({**request, "store": False})
        decoded = call.decoded
        call.retained = retained_items(decoded.messages)
        call.request = decoded.request = summary_request(decoded.request)
        call.compact = True
        return call

    def routes(self) -> list[BaseRoute]:
        return []


_COMPACT_FIELDS: Final = ("model", "input", "previous_response_id", "instructions", "prompt_cache_key")


def _not_found(response_id: str) -> ProxyError:
    return ProxyError(f"Response with id '{response_id}' not found.", 404, code="response_not_found")
