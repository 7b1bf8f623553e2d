"""Embeddings and rerank on the proxy's base URL (docs/retrieval.md), end to end on loopback: one proxy serving chat
from the MindIE mock, embeddings and rerank from the TEI mock (TEI's /embed and /rerank), and the same from the vLLM
mock (OpenAI's /v1/embeddings, Cohere/Jina's /v1/rerank), asked by the openai SDK, LangChain, the cohere SDK and raw
Jina / Open WebUI bodies."""

from __future__ import annotations

import base64
import json
import logging
import math
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from proxy.build import BUILD
from proxy.mock.retrieval import DIMENSION, embedding, score
from tests.conftest import Mock, ServerThread

DOCS = ["Paris is the capital of France.", "The llama is a camelid of the Andes.",
        "France borders Spain and Italy.", "Rust is a systems programming language."]
QUERY = "What is the capital of France?"


@pytest.fixture(scope="module")
def mocks() -> Iterator[dict[str, Mock]]:
    from proxy.mock import create_app

    started = {d: ServerThread(create_app(d)).start() for d in ("mindie", "tei", "vllm")}
    try:
        yield {d: Mock(srv, d) for d, srv in started.items()}
    finally:
        for srv in started.values():
            srv.stop()


def config(mocks: dict[str, Mock]) -> list[dict[str, Any]]:
    return [
        {"name": "npu", "dialect": "mindie", "url": mocks["mindie"].url, "models": ["qwen-chat"]},
        {"name": "tei-embed", "dialect": "tei", "url": mocks["tei"].url, "models": ["bge-m3"], "kinds": ["embeddings"]},
        {"name": "tei-rerank", "dialect": "tei", "url": mocks["tei"].url, "models": ["bge-reranker"],
         "kinds": ["rerank"]},
        {"name": "vllm", "dialect": "vllm", "url": mocks["vllm"].url, "models": ["vllm-embed", "vllm-rerank"],
         "kinds": ["embeddings", "rerank"]},
    ]


@pytest.fixture
def proxy(mocks: dict[str, Mock], start_proxy: Any) -> Any:
    for mock in mocks.values():
        httpx.post(mock.url + "/_mock/directives", json={"directives": ""}, timeout=5)
    return start_proxy(config(mocks))


def directives(mock: Mock, text: str) -> None:
    httpx.post(mock.url + "/_mock/directives", json={"directives": text}, timeout=5).raise_for_status()


@pytest.mark.parametrize("model", ["bge-m3", "vllm-embed"])
def test_openai_sdk_embeddings(proxy: Any, model: str) -> None:
    client = proxy.client()
    one = client.embeddings.create(model=model, input="hello world", encoding_format="float")
    assert len(one.data) == 1 and one.data[0].embedding == pytest.approx(embedding("hello world", DIMENSION))
    assert one.model == model and one.usage.prompt_tokens == 2 == one.usage.total_tokens
    many = client.embeddings.create(model=model, input=DOCS, encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2, 3]
    assert [d.embedding for d in many.data] == [pytest.approx(embedding(doc, DIMENSION)) for doc in DOCS]
    # The SDK's default asks for base64 and decodes it: the same floats, as float32
    decoded = client.embeddings.create(model=model, input=DOCS[0])
    assert decoded.data[0].embedding == pytest.approx(embedding(DOCS[0], DIMENSION), abs=1e-6)
    short = client.embeddings.create(model=model, input="hello", dimensions=16, encoding_format="float")
    assert len(short.data[0].embedding) == 16


def test_base64_is_little_endian_float32(proxy: Any) -> None:
    got = httpx.post(proxy.url + "/v1/embeddings", json={"model": "bge-m3", "input": ["a b"],
                                                          "encoding_format": "base64"}, timeout=10).json()
    raw = base64.b64decode(got["data"][0]["embedding"])
    assert struct.unpack(f"<{DIMENSION}f", raw) == pytest.approx(embedding("a b", DIMENSION), abs=1e-6)


def test_token_inputs_reach_tei(proxy: Any, mocks: dict[str, Mock]) -> None:
    got = proxy.client().embeddings.create(model="bge-m3", input=[[1, 2, 3], [4]], encoding_format="float")
    assert got.data[0].embedding == pytest.approx(embedding([1, 2, 3], DIMENSION))
    assert mocks["tei"].last_request()["body"] == {"inputs": [[1, 2, 3], [4]]}
    assert got.usage.prompt_tokens == 4


def test_langchain_openai_embeddings(proxy: Any) -> None:
    from langchain_openai import OpenAIEmbeddings

    emb = OpenAIEmbeddings(model="bge-m3", base_url=proxy.url + "/v1", api_key="unused",
                           check_embedding_ctx_length=False)
    docs = emb.embed_documents(DOCS[:2])
    assert docs == [pytest.approx(embedding(d, DIMENSION), abs=1e-6) for d in DOCS[:2]]
    assert emb.embed_query(QUERY) == pytest.approx(embedding(QUERY, DIMENSION), abs=1e-6)


def test_batches_past_tei_limit_are_split_and_joined_in_order(proxy: Any, mocks: dict[str, Mock],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dialect_proxy.access")
    texts = [f"text number {i}" for i in range(75)]
    before = mocks["tei"].stats()["requests"]
    got = proxy.client().embeddings.create(model="bge-m3", input=texts, encoding_format="float",
                                           extra_headers={"x-request-id": "emb-batches-1"})
    assert [d.index for d in got.data] == list(range(75))
    assert [d.embedding for d in got.data] == [pytest.approx(embedding(t, DIMENSION)) for t in texts]
    assert mocks["tei"].stats()["requests"] - before == 3  # 32 + 32 + 11: TEI's default max_client_batch_size
    assert _metric(proxy, "dialect_proxy_retrieval_batches_total", route="/v1/embeddings", upstream="tei-embed") == 3
    assert got.usage.prompt_tokens == 3 * 75
    line = _access_line(caplog, "emb-batches-1")
    assert line["route"] == "/v1/embeddings" and line["upstream"] == "tei-embed" and line["dialect"] == "tei"
    assert line["batches"] == 3 and line["prompt_tokens"] == 3 * 75 and "tokens_estimated" not in line
    assert line["status"] == 200 and line["stream"] is False and line["client_disconnected"] is False


def _access_line(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, Any]:
    from tests.conftest import wait_for  # the line is written just after the answer's last byte

    def lines() -> list[dict[str, Any]]:
        return [json.loads(r.getMessage()) for r in caplog.records
                if r.name == "dialect_proxy.access" and request_id in r.getMessage()]

    assert wait_for(lambda: bool(lines()))
    return lines()[0]


def _metric(proxy: Any, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(proxy.url + "/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_a_lower_server_limit_is_learnt(proxy: Any, mocks: dict[str, Mock]) -> None:
    directives(mocks["tei"], "max_batch=10")
    texts = [f"doc {i}" for i in range(25)]
    got = proxy.client().embeddings.create(model="bge-m3", input=texts, encoding_format="float")
    assert [d.embedding for d in got.data] == [pytest.approx(embedding(t, DIMENSION)) for t in texts]
    ranked = httpx.post(proxy.url + "/v1/rerank", json={"model": "bge-reranker", "query": QUERY,
                                                        "documents": texts + DOCS}, timeout=10).json()
    assert ranked["results"][0]["index"] == 25  # "Paris is the capital of France." wins across batches


def _expected(docs: list[str]) -> list[int]:
    return sorted(range(len(docs)), key=lambda i: -score(QUERY, docs[i]))


@pytest.mark.parametrize("model", ["bge-reranker", "vllm-rerank"])
@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_jina_shaped_rerank(proxy: Any, model: str, path: str) -> None:
    body = {"model": model, "query": QUERY, "documents": [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]], "top_n": 2,
            "return_documents": True}
    got = httpx.post(proxy.url + path, json=body, timeout=10).json()
    results = got["results"]
    assert [r["index"] for r in results] == _expected(DOCS)[:2]
    assert [r["document"]["text"] for r in results] == [DOCS[i] for i in _expected(DOCS)[:2]]
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    assert got["model"] == model and got["usage"]["total_tokens"] > 0


def test_open_webui_reranker_body(proxy: Any) -> None:
    """Open WebUI's external reranker posts {model, query, documents, top_n} and reads index and relevance_score."""
    got = httpx.post(proxy.url + "/v1/rerank", json={"model": "bge-reranker", "query": QUERY, "documents": DOCS,
                                                     "top_n": 4}, timeout=10).json()
    assert [(r["index"], r["relevance_score"]) for r in got["results"]] == [
        (i, pytest.approx(score(QUERY, DOCS[i]))) for i in _expected(DOCS)]


def test_cohere_sdk_rerank(proxy: Any) -> None:
    cohere = pytest.importorskip("cohere")
    with httpx.Client(timeout=10) as http:  # the SDK's own client would be left open
        v1 = cohere.Client(api_key="unused", base_url=proxy.url, httpx_client=http)
        got = v1.rerank(model="bge-reranker", query=QUERY, documents=DOCS, top_n=3)
        v2 = cohere.ClientV2(api_key="unused", base_url=proxy.url, httpx_client=http)
        got2 = v2.rerank(model="vllm-rerank", query=QUERY, documents=DOCS, top_n=2)
    assert [r.index for r in got.results] == _expected(DOCS)[:3]
    assert [r.index for r in got2.results] == _expected(DOCS)[:2]
    assert got2.results[0].relevance_score == pytest.approx(score(QUERY, DOCS[got2.results[0].index]))


def test_chat_and_retrieval_on_one_base_url(proxy: Any) -> None:
    client = proxy.client()
    chat = client.chat.completions.create(model="qwen-chat", messages=[{"role": "user", "content": "Hi"}])
    assert chat.choices[0].message.content
    assert client.embeddings.create(model="bge-m3", input="x").data
    assert {m.id for m in client.models.list()} >= {"qwen-chat", "bge-m3", "bge-reranker", "vllm-embed"}


def _error(resp: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = resp.json()["error"]
    return body


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "bge-m3", "input": ""}, "input"),
    ({"model": "bge-m3", "input": []}, "input"),
    ({"model": "bge-m3", "input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"model": "bge-m3", "input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x"}, "model"),
])
def test_invalid_embeddings_are_refused_before_any_upstream_call(proxy: Any, mocks: dict[str, Mock],
                                                                  body: dict[str, Any], param: str) -> None:
    before = mocks["tei"].stats()["requests"]
    resp = httpx.post(proxy.url + "/v1/embeddings", json=body, timeout=10)
    assert resp.status_code == 400 and _error(resp)["param"] == param
    assert mocks["tei"].stats()["requests"] == before


def test_unknown_model_and_wrong_kind(proxy: Any) -> None:
    client = proxy.client()
    with pytest.raises(openai.NotFoundError) as unknown:
        client.embeddings.create(model="no-such-model", input="x")
    assert unknown.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as chat_model:
        client.embeddings.create(model="qwen-chat", input="x")
    assert "qwen-chat" in chat_model.value.message and "serves chat" in chat_model.value.message
    with pytest.raises(openai.BadRequestError) as embed_model:  # and the reverse: chat from an embeddings model
        client.chat.completions.create(model="bge-m3", messages=[{"role": "user", "content": "Hi"}])
    assert "bge-m3" in embed_model.value.message and "serves embeddings models, not chat" in embed_model.value.message
    resp = httpx.post(proxy.url + "/v1/rerank", json={"model": "bge-m3", "query": "q", "documents": ["d"]},
                      timeout=10)
    assert resp.status_code == 400 and "serves embeddings" in _error(resp)["message"]


def test_a_responses_websocket_turn_for_an_embeddings_model_is_the_kind_400(proxy: Any,
                                                                          mocks: dict[str, Mock]) -> None:
    """The Responses WebSocket mode routes as HTTP does (the one exchange): the socket's error message names what the
    model's upstream serves, and nothing reaches TEI; a chat model on the same socket is answered."""
    from websockets.sync.client import connect

    from tests.clients.test_responses_ws import turn

    before = mocks["tei"].stats()["requests"]
    with connect(proxy.url.replace("http://", "ws://") + "/v1/responses") as ws:
        refused = turn(ws, model="bge-m3", input="Hi")
        answered = turn(ws, model="qwen-chat", input="Hi")
    assert [e["type"] for e in refused] == ["error"] and refused[0]["status"] == 400
    assert refused[0]["error"]["code"] == "model_kind_mismatch"
    assert "serves embeddings models, not chat" in refused[0]["error"]["message"]
    assert mocks["tei"].stats()["requests"] == before
    assert answered[-1]["type"] == "response.completed"


@pytest.mark.parametrize(("status", "ours", "error"), [
    (413, 413, openai.APIStatusError), (424, 502, openai.InternalServerError), (429, 429, openai.RateLimitError)])
def test_upstream_errors(proxy: Any, mocks: dict[str, Mock], status: int, ours: int, error: type[Exception]) -> None:
    directives(mocks["tei"], f"error={status}")
    with pytest.raises(error) as caught:
        proxy.client(max_retries=0).embeddings.create(model="bge-m3", input="x")
    assert caught.value.status_code == ours  # type: ignore[attr-defined]
    assert "mock: error" in caught.value.message  # type: ignore[attr-defined]


def test_usage_is_estimated_when_tei_does_not_say(proxy: Any, mocks: dict[str, Mock],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dialect_proxy.access")
    directives(mocks["tei"], "no_tokens")
    got = httpx.post(proxy.url + "/v1/embeddings", json={"model": "bge-m3", "input": ["abcdefgh"]},
                     headers={"x-request-id": "emb-estimated-1"}, timeout=10).json()
    assert got["usage"] == {"prompt_tokens": 2, "total_tokens": 2, "estimated": True}
    line = _access_line(caplog, "emb-estimated-1")
    assert line["prompt_tokens"] == 2 and line["tokens_estimated"] is True and line["batches"] == 1


def test_metrics_and_readiness(proxy: Any) -> None:
    proxy.client().embeddings.create(model="bge-m3", input="x")
    text = httpx.get(proxy.url + "/metrics", timeout=10).text
    assert any('route="/v1/embeddings"' in line and "tei-embed" in line for line in text.splitlines())
    ready = httpx.get(proxy.url + "/readyz", timeout=10).json()
    assert ready["upstreams"]["tei-embed"].startswith("up") and ready["upstreams"]["tei-rerank"].startswith("up")
    assert math.isfinite(len(text))


def test_a_client_that_leaves_closes_the_upstream_request(proxy: Any, mocks: dict[str, Mock]) -> None:
    from tests.conftest import wait_for

    directives(mocks["tei"], "delay_ms=3000")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(proxy.url + "/v1/embeddings", json={"model": "bge-m3", "input": "x"}, timeout=0.3)
    assert wait_for(lambda: _metric(proxy, "dialect_proxy_client_disconnects_total", route="/v1/embeddings") == 1,
                    timeout=2.5)


def test_embeddings_span(start_mock: Any, start_proxy: Any) -> None:
    from tests.otlp_receiver import Receiver
    from tests.test_tracing import one, otel_env, spans_of, traceparent

    receiver = Receiver().start()
    try:
        tei = start_mock("tei")
        proxy = start_proxy([{"name": "embed", "dialect": "tei", "url": tei.url, "models": ["bge-m3"]}],
                            environ=otel_env(receiver))
        header, trace_id, _ = traceparent()
        texts = [f"t{i}" for i in range(40)]
        got = proxy.client().embeddings.create(model="bge-m3", input=texts, extra_headers={"traceparent": header})
        spans = spans_of(receiver, trace_id, 2)
        server, client = one(spans, "SERVER"), one(spans, "CLIENT")
        assert server.name == "embeddings bge-m3" and client.parent_id == server.span_id
        for span in (server, client):
            assert span.attributes["gen_ai.operation.name"] == "embeddings"
            assert span.attributes["gen_ai.provider.name"] == "tei"
            assert span.attributes["gen_ai.usage.input_tokens"] == got.usage.prompt_tokens == 40
        assert server.attributes["http.response.status_code"] == 200
    finally:
        receiver.stop()


def test_retrieval_requests_leave_no_cycles_of_ours(start_mock: Any, start_proxy: Any) -> None:
    """As tests/test_gc.py holds for chat: batches, a rerank and a refused call leave no reference cycle behind."""

    from tests.test_gc import cycles_left_by

    tei = start_mock("tei")
    proxy = start_proxy([{"name": "tei", "dialect": "tei", "url": tei.url, "models": ["bge-m3"],
                          "kinds": ["embeddings"]},
                         {"name": "tei-rerank", "dialect": "tei", "url": tei.url, "models": ["bge-reranker"],
                          "kinds": ["rerank"]}])

    def requests() -> None:
        client = proxy.client(max_retries=0)
        assert len(client.embeddings.create(model="bge-m3", input=[f"t{i}" for i in range(40)]).data) == 40
        ranked = httpx.post(proxy.url + "/v1/rerank", json={"model": "bge-reranker", "query": QUERY,
                                                            "documents": DOCS}, timeout=10)
        assert ranked.status_code == 200
        directives(tei, "error=424")
        with pytest.raises(openai.InternalServerError):
            client.embeddings.create(model="bge-m3", input="x")
        directives(tei, "")

    names = cycles_left_by(requests, proxy)
    assert not names, f"reference cycles of the proxy's objects after retrieval requests: {names}"


@pytest.mark.skipif(BUILD == "mypyc", reason="a compiled spoke's TEIWire cannot be patched")
def test_a_bug_of_ours_is_a_500_internal_error(proxy: Any, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """A bug in retrieval's own code reaches the client as the exchange answers any bug of ours: a 500
    `internal_error` in OpenAI's envelope, never a stack trace, and the access line says so."""
    from proxy.dialects.tei import TEIWire

    def embed_answer(self: TEIWire, answer: Any, size: int) -> Any:
        return {}["a key our own code forgot"]

    monkeypatch.setattr(TEIWire, "embed_answer", embed_answer)
    caplog.set_level(logging.INFO, logger="dialect_proxy.access")
    resp = httpx.post(proxy.url + "/v1/embeddings", json={"model": "bge-m3", "input": "x"},
                      headers={"x-request-id": "emb-bug-1"}, timeout=10)
    assert resp.status_code == 500 and resp.headers["x-request-id"] == "emb-bug-1"
    err = _error(resp)
    assert (err["type"], err["code"]) == ("server_error", "internal_error") and "Traceback" not in resp.text
    line = _access_line(caplog, "emb-bug-1")
    assert line["status"] == 500 and line["error"] == "internal_error" and line["batches"] == 1
