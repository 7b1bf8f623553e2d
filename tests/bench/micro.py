"""In-process micro benchmark of the answer path without I/O: upstream bytes -> Pipeline -> client encoder -> bytes.

    python tests/bench/micro.py [--rounds 7] [--profile SCENARIO] [--stages]

Each scenario replays one upstream answer shaped like the built-in mock's (64 chunks) through a fresh upstream
session, pipeline and client encoder per request, as the handler does, fed one upstream event per read (the paced
case; the worst for per-chunk overhead). Prints µs per upstream chunk (per request for non-stream): the fastest
request over `rounds` alternating rounds (the machine is shared: the least disturbed request counts).
`--profile NAME` runs one scenario under cProfile and prints the top functions instead; `--stages` prints
the openai and MindIE full-text chat streams cut after each stage (SSE decode, + JSON, + upstream session,
+ normaliser, + encoder and metrics).
Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import fastest  # noqa: E402  (tests/bench/timing.py)

from proxy.clients.chat import chat_encoder as make_chat_encoder  # noqa: E402
from proxy.clients.messages_encoder import MessagesCall, MessagesEncoder, messages_consumer  # noqa: E402
from proxy.clients.responses_events import Echo, ResponsesEncoder, responses_consumer  # noqa: E402
from proxy.clients.signature import ThinkingSigner  # noqa: E402
from proxy.dialects import DIALECTS  # noqa: E402
from proxy.hub.canonical import CHAT, RequestContext  # noqa: E402
from proxy.hub.events import Answer, Delta  # noqa: E402
from proxy.hub.pipeline import Pipeline  # noqa: E402
from proxy.hub.sse import encode_events  # noqa: E402
from proxy.metrics.definitions import Metrics  # noqa: E402
from proxy.settings import UpstreamSettings  # noqa: E402

CHUNKS = 64
ENVELOPE = '"id":"chatcmpl-aac99a82378e60fb9d8a710f","object":"chat.completion.chunk","created":1795375312,"model":"m"'


def openai_stream(chunks: int = CHUNKS) -> list[bytes]:
    """One SSE event per read, as the mock's openai dialect sends them (include_usage asked by the proxy)."""
    fp = '"system_fingerprint":"fp_mock0001",'
    out = [f'data: {{{ENVELOPE},{fp}"choices":[{{"index":0,"delta":{{"role":"assistant","content":"",'
           f'"refusal":null}},"logprobs":null,"finish_reason":null}}],"usage":null}}\n\n']
    for i in range(chunks):
        text = orjson.dumps(f" tok{i}" if i else "tok0").decode()
        out.append(f'data: {{{ENVELOPE},{fp}"choices":[{{"index":0,"delta":{{"content":{text}}},"logprobs":null,'
                   f'"finish_reason":null}}],"usage":null}}\n\n')
    out.append(f'data: {{{ENVELOPE},{fp}"choices":[{{"index":0,"delta":{{}},"logprobs":null,'
               f'"finish_reason":"stop"}}],"usage":null}}\n\n')
    out.append(f'data: {{{ENVELOPE},{fp}"choices":[],"usage":{{"prompt_tokens":15,"completion_tokens":{chunks},'
               f'"total_tokens":{chunks + 15}}}}}\n\n')
    out.append("data: [DONE]\n\n")
    return [s.encode() for s in out]


def mindie_full_text_stream(chunks: int = CHUNKS, word: str = " tok{i}") -> list[bytes]:
    """MindIE with fullTextEnabled: every chunk carries the whole text so far; the last one full_text and usage."""
    env = '"id":"endpoint_common_1","object":"chat.completion.chunk","created":1795375312,"model":"m"'
    out = [f'data: {{{env},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
           f'"finish_reason":null}}]}}\n\n']
    text = ""
    for i in range(chunks):
        text += word.format(i=i) if i else "tok0"
        t = orjson.dumps(text).decode()
        if i < chunks - 1:
            out.append(f'data: {{{env},"choices":[{{"index":0,"delta":{{"role":"assistant","content":{t}}},'
                       f'"finish_reason":null}}]}}\n\n')
        else:
            usage = (f'{{"prompt_tokens":15,"completion_tokens":{chunks},"total_tokens":{chunks + 15},'
                     f'"batch_size":{[1] * chunks},"queue_wait_time":{[60] * chunks}}}').replace(" ", "")
            out.append(f'data: {{{env},"full_text":{t},"usage":{usage},"choices":[{{"index":0,"delta":'
                       f'{{"role":"assistant","content":{t}}},"finish_reason":"stop"}}]}}\n\n')
    out.append("data: [DONE]\n\n")
    return [s.encode() for s in out]


def openai_body(chunks: int = 16) -> bytes:
    text = " ".join(f"tok{i}" for i in range(chunks))
    return orjson.dumps({"id": "chatcmpl-d61b9ef2f29234d0f4f0aa0e", "object": "chat.completion",
                         "created": 1795375312, "model": "m",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                                      "logprobs": None, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 11, "completion_tokens": chunks, "total_tokens": chunks + 11},
                         "system_fingerprint": "fp_mock0001"})


def context(dialect: str, stream: bool, full_text: bool = False, response_id: str = "chatcmpl-ours") -> RequestContext:
    upstream = UpstreamSettings(name="bench", dialect=dialect, url="http://127.0.0.1:1", full_text=full_text)
    return RequestContext(kind=CHAT, request_id="rid", client_model="bench", upstream_model="m", upstream=upstream,
                          stream=stream, response_id=response_id, created=7)


Encoderish = Any


def chat_encoder(ctx: RequestContext, answer: Answer) -> Encoderish:
    return make_chat_encoder(ctx, answer, ctx.stream, False, "reasoning_content", None, True)


def responses_encoder(ctx: RequestContext, answer: Answer) -> Encoderish:
    return ResponsesEncoder(ctx, answer, responses_consumer(ctx.stream), Echo({"store": False}), {}, None)


SIGNER = ThinkingSigner(b"k" * 32)


def messages_encoder(ctx: RequestContext, answer: Answer) -> Encoderish:
    call = MessagesCall({"model": "bench", "messages": []}, "bench", ctx.stream)
    return MessagesEncoder(call, ctx, answer, SIGNER, messages_consumer(call, ctx))


METRICS = Metrics(None)


def stream_request(dialect_name: str, pieces: list[bytes], make_encoder: Callable[[RequestContext, Answer], Encoderish],
                   full_text: bool = False, response_id: str = "chatcmpl-ours") -> Callable[[], int]:
    dialect = DIALECTS[dialect_name]()

    def run() -> int:
        ctx = context(dialect_name, True, full_text, response_id)
        obs = METRICS.request("/v1/chat/completions", "bench", "bench", True)
        session = dialect.session(ctx)
        answer = Answer()
        encoder = make_encoder(ctx, answer)
        pipeline = Pipeline(session, answer)
        events: list[Delta] = []
        sent = 0
        head = False
        for piece in pieces:
            pipeline.feed(piece, events)
            if events:
                # the handler's metrics call per read (proxy/endpoint/translate.py _Answering._account)
                tokens = 0
                for e in events:
                    if e.content or e.reasoning or e.tool_calls:
                        tokens += 1
                obs.chunks(len(events), tokens)
                made = encoder.feed(events)
                events.clear()
                if not head:
                    made = encoder.head() + made
                    head = True
                sent += len(encode_events(made))  # the HTTP sink's framing (proxy/endpoint/sink.py)
            if pipeline.done:
                break
        pipeline.finish(events)
        sent += len(encode_events(encoder.feed(events) + encoder.finish()))
        obs.finish(200, False, answer.finish_reason)
        return sent

    return run


def nonstream_request(dialect_name: str, body: bytes) -> Callable[[], int]:
    dialect = DIALECTS[dialect_name]()

    def run() -> int:
        ctx = context(dialect_name, False)
        session = dialect.session(ctx)
        answer = Answer()
        pipeline = Pipeline(session, answer)
        encoder = chat_encoder(ctx, answer)
        events: list[Delta] = []
        pipeline.feed_body(body, events)
        pipeline.finish(events)
        encoder.feed(events)
        (whole,) = encoder.finish()
        return len(whole.data)

    return run


def scenarios() -> dict[str, tuple[Callable[[], int], int]]:
    """name -> (one request, the divisor: upstream chunks per request, 1 for non-stream)."""
    oa = openai_stream()
    mi = mindie_full_text_stream()
    return {
        "openai chat stream": (stream_request("openai", oa, chat_encoder), len(oa) - 1),
        "mindie full-text chat stream": (stream_request("mindie", mi, chat_encoder, True), len(mi) - 1),
        "openai responses stream": (stream_request("openai", oa, responses_encoder, response_id="resp_0123456789"),
                                    len(oa) - 1),
        "openai messages stream": (stream_request("openai", oa, messages_encoder, response_id="msg_0123456789"),
                                   len(oa) - 1),
        "openai non-stream (per req)": (nonstream_request("openai", openai_body()), 1),
        # A fast upstream (or a busy proxy): 16 events to a read, as the bench's zero-delay streams arrive.
        "openai chat, 16 events/read": (stream_request("openai", reads_of(oa, 16), chat_encoder), len(oa) - 1),
        "mindie full-text, 16 events/read": (stream_request("mindie", reads_of(mi, 16), chat_encoder, True),
                                             len(mi) - 1),
    }


def reads_of(events: list[bytes], n: int) -> list[bytes]:
    """The events of a stream, `n` to a read."""
    return [b"".join(events[i:i + n]) for i in range(0, len(events), n)]


def stages() -> dict[str, tuple[Callable[[], int], int]]:
    """The openai and MindIE full-text chat streams cut after each stage of the pipeline (cumulative), per upstream
    chunk."""
    table = scenarios()
    out = {}
    for label, name, pieces, full_text in (("openai", "openai", openai_stream(), False),
                                           ("mindie", "mindie", mindie_full_text_stream(), True)):
        dialect = DIALECTS[name]()

        def upto(level: int, name: str = name, pieces: list[bytes] = pieces, full_text: bool = full_text,
                 dialect: Any = dialect) -> Callable[[], int]:
            def run() -> int:
                ctx = context(name, True, full_text)
                session = dialect.session(ctx)
                answer = Answer()
                pipeline = Pipeline(session, answer)
                decoder = pipeline._decoder
                chunk = session.chunk
                feed = pipeline.normalizer.feed
                n = 0
                for piece in pieces[:-1]:  # not [DONE]
                    for event in decoder.payloads(piece):
                        if level >= 1:
                            data = orjson.loads(event)
                            if level >= 2:
                                data = chunk(data)
                                if level >= 3:
                                    n += len(feed(data))
                return n

            return run

        count = len(pieces) - 1
        out[f"{label}: SSE decode"] = (upto(0), count)
        out[f"{label}: + orjson.loads"] = (upto(1), count)
        out[f"{label}: + session.chunk"] = (upto(2), count)
        out[f"{label}: + Normalizer"] = (upto(3), count)
        out[f"{label}: + chat encoder, obs.chunks"] = table[f"{name}{' full-text' if full_text else ''} chat stream"]
    return out


def measure(run: Callable[[], object], divisor: int, budget: float = 0.2) -> float:
    """µs per unit: the fastest of the requests run in about `budget` seconds, after one untimed warm-up."""
    run()
    return fastest(run, budget) / divisor * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", metavar="SCENARIO", help="one of: " + ", ".join(scenarios()))
    ap.add_argument("--stages", action="store_true", help="time the openai chat stream stage by stage")
    args = ap.parse_args()
    table = stages() if args.stages else scenarios()
    if args.profile:
        run, _ = table[args.profile]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            run()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, (run, divisor) in table.items():
            us = measure(run, divisor)
            best[name] = min(best.get(name, us), us)
    print(f"in-process pipeline + encoder, fastest request of {args.rounds} alternating rounds")
    for name, us in best.items():
        unit = "µs/req" if "non-stream" in name else "µs/chunk"
        print(f"{name:<34}{us:>8.2f} {unit}")


if __name__ == "__main__":
    main()
