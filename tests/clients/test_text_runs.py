"""A TextRun (several plain text events of one choice, as the pipeline hands them to an encoder whose `runs` is set:
proxy/hub/events.py) gives what its Deltas give, for the Responses and Messages encoders, streamed or not, whatever
comes around it (reasoning, tool calls, another choice, the end). The Chat Completions encoder has the same property in
tests/clients/test_chat_encoder.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hub_harness import request_context
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.clients.base import Encoder
from proxy.clients.messages_encoder import MessagesCall, MessagesEncoder, messages_consumer
from proxy.clients.responses_events import Echo, ResponsesEncoder, responses_consumer
from proxy.clients.responses_request import ToolName
from proxy.clients.signature import ThinkingSigner
from proxy.errors import ProxyError
from proxy.hub.canonical import CHAT
from proxy.hub.events import Answer, Delta, TextRun
from proxy.settings import UpstreamSettings

UP = UpstreamSettings(name="u", dialect="openai", url="http://127.0.0.1:9")
SIGNER = ThinkingSigner(b"k" * 32)
TEXT = st.text(alphabet=st.sampled_from(["a", " ", "é", "\n", '"', "\\", "<", "😀", "\x00"]), min_size=1, max_size=5)

EVENTS = st.one_of(
    st.builds(Delta, index=st.sampled_from([0, 0, 0, 1]), content=TEXT),
    st.builds(Delta, index=st.just(0), reasoning=TEXT),
    st.builds(Delta, index=st.just(0), tool_calls=st.just([{"index": 0, "id": "call_1", "type": "function",
                                                             "function": {"name": "get", "arguments": "{}"}}])),
    st.builds(Delta, index=st.just(0), finish_reason=st.sampled_from(["stop", "length", "tool_calls"])),
    st.builds(TextRun, index=st.sampled_from([0, 0, 0, 1]), reasoning=st.booleans(),
              texts=st.lists(TEXT, min_size=1, max_size=5)),
)


def responses(stream: bool) -> Encoder:
    ctx = request_context(CHAT, "m", UP, stream=stream, client_model="alias", response_id="resp_0123456789abcdef")
    return ResponsesEncoder(ctx, Answer(), responses_consumer(stream), Echo({"store": False}),
                            {"get": ToolName("get")}, SIGNER)


def messages(stream: bool) -> Encoder:
    ctx = request_context(CHAT, "m", UP, stream=stream, client_model="alias", response_id="msg_x")
    call = MessagesCall({"model": "m", "messages": []}, "alias", stream)
    return MessagesEncoder(call, ctx, Answer(), SIGNER, messages_consumer(call, ctx))


def output(encoder: Encoder, stream: bool, reads: list[list[Delta | TextRun]]) -> tuple[bytes, str | None]:
    out = encoder.head() if stream else b""
    try:
        for read in reads:
            out += encoder.feed(read)  # type: ignore[arg-type]
        return out + encoder.finish(), None
    except ProxyError as e:  # (an answer the encoder refuses: refused alike)
        return out, f"{type(e).__name__}: {e.message}"


def expand(read: list[Delta | TextRun]) -> list[Delta | TextRun]:
    return [d for e in read for d in (e.deltas() if isinstance(e, TextRun) else [e])]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([responses, messages]), st.booleans(), st.lists(st.lists(EVENTS, max_size=6), max_size=8))
def test_a_text_run_gives_what_its_deltas_give(make: Callable[[bool], Encoder], stream: bool,
                                               reads: list[list[Any]]) -> None:
    with_runs = output(make(stream), stream, reads)
    with_deltas = output(make(stream), stream, [expand(read) for read in reads])
    assert with_runs == with_deltas
