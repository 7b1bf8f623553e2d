"""The tei spoke (proxy/dialects/tei.py): TEI's bodies, its errors as the client's statuses, its batch limit learnt
from its refusal, its readiness request."""

from __future__ import annotations

import orjson
import pytest

from proxy.dialects import get_dialect
from proxy.dialects.tei import DEFAULT_BATCH, TEIWire
from proxy.errors import UpstreamError
from proxy.hub.retrieval import EmbedCall, RerankCall, UpstreamAnswer
from proxy.settings import UpstreamSettings


def _tei() -> TEIWire:
    wire = get_dialect("tei").retrieval_wire()
    assert isinstance(wire, TEIWire)
    return wire


def test_embed_body_carries_tei_switches_and_dimensions() -> None:
    request = {"model": "m", "input": ["a"], "normalize": False, "prompt_name": "query", "user": "u"}
    call = EmbedCall("m", ["a", "b"], "base64", 8, request)
    assert _tei().embed_request(call, ["a", "b"], "bge") == (
        "/embed", {"normalize": False, "prompt_name": "query", "inputs": ["a", "b"], "dimensions": 8})


def test_rerank_body_asks_no_text_back() -> None:
    call = RerankCall("m", "q", ["x", "y"], 1, True, {"truncate": True, "documents": ["x", "y"]})
    assert _tei().rerank_request(call, ["y"], "r") == (
        "/rerank", {"truncate": True, "query": "q", "texts": ["y"], "return_text": False})


def test_answers_read_vectors_ranks_and_tokens() -> None:
    wire = _tei()
    got = wire.embed_answer(UpstreamAnswer(200, b"[[1, 0.5], [0, 1]]", {"x-compute-tokens": "7"}), 2)
    assert got.vectors == [[1.0, 0.5], [0.0, 1.0]] and got.tokens == 7
    ranks = wire.rerank_answer(UpstreamAnswer(200, b'[{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}]'), 2)
    assert [(r.index, r.score) for r in ranks.ranked] == [(1, 0.9), (0, 0.1)] and ranks.tokens is None
    with pytest.raises(UpstreamError):
        wire.embed_answer(UpstreamAnswer(200, b"[[1]]"), 2)  # fewer vectors than inputs
    with pytest.raises(UpstreamError):
        wire.rerank_answer(UpstreamAnswer(200, b'[{"index": 5, "score": 1}]'), 2)  # an index out of the batch


def test_the_batch_limit_is_learnt_from_the_refusal_only_downwards() -> None:
    wire = _tei()
    assert wire.batch_limit() == DEFAULT_BATCH
    refusal = orjson.dumps({"error": "batch size 20 > maximum allowed batch size 8", "error_type": "Validation"})
    assert wire.learn(UpstreamAnswer(422, refusal)) and wire.batch_limit() == 8
    assert not wire.learn(UpstreamAnswer(422, refusal))  # the same limit again: nothing new, no resend loop
    other = orjson.dumps({"error": "input is too long", "error_type": "Validation"})
    assert not wire.learn(UpstreamAnswer(422, other)) and not wire.learn(UpstreamAnswer(429, refusal))


@pytest.mark.parametrize(("status", "error_type", "ours"), [
    (400, "Empty", 400), (413, "Validation", 413), (422, "Tokenizer", 400), (424, "Backend", 502),
    (429, "Overloaded", 429), (503, "Unhealthy", 503)])
def test_tei_errors_become_the_clients_statuses(status: int, error_type: str, ours: int) -> None:
    raw = orjson.dumps({"error": "what TEI said", "error_type": error_type})
    err = get_dialect("tei").errors.answer(status, raw, {"retry-after": "2"}, "/embed", "tei", "tei")
    assert err.status == ours and err.message == "what TEI said" and err.upstream_code == error_type
    assert (err.headers.get("Retry-After") == "2") == (ours == 429)


def test_readiness_asks_an_empty_batch_of_the_kind_served() -> None:
    dialect = get_dialect("tei")
    embed = UpstreamSettings(name="e", dialect="tei", url="http://127.0.0.1:1", kinds=("embeddings",))
    rerank = UpstreamSettings(name="r", dialect="tei", url="http://127.0.0.1:1", kinds=("rerank",))
    assert dialect.readiness.request(embed) == ("/embed", {"inputs": []})
    assert dialect.readiness.request(rerank) == ("/rerank", {"query": "", "texts": []})
    ready, why = dialect.readiness.verdict(422, b'{"error": "empty", "error_type": "Validation"}', "/embed", embed)
    assert ready, why
