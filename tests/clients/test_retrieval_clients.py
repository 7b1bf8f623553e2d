"""The retrieval client sides (proxy/clients/embeddings.py, proxy/clients/rerank.py): OpenAI's four `input` forms,
the rerank bodies of Cohere v1/v2 and Jina, and the answers their clients read."""

from __future__ import annotations

import base64
import struct

import orjson
import pytest

from proxy.clients import embeddings, rerank
from proxy.errors import ClientRequestError
from proxy.hub.retrieval import Ranked, Usage


@pytest.mark.parametrize(("value", "inputs"), [
    ("one", ["one"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]])])
def test_openais_four_input_forms(value: object, inputs: list[object]) -> None:
    assert embeddings.decode({"model": "m", "input": value}).inputs == inputs


@pytest.mark.parametrize("value", [None, "", [], [""], [[]], [["a"]], [1, "a"], [[-1]], 5, {"text": "a"}])
def test_bad_inputs_name_the_param(value: object) -> None:
    with pytest.raises(ClientRequestError) as caught:
        embeddings.decode({"model": "m", "input": value})
    assert caught.value.param == "input" and caught.value.status == 400


def test_base64_answer_is_float32_little_endian() -> None:
    call = embeddings.decode({"model": "m", "input": "x", "encoding_format": "base64"})
    usage = Usage()
    usage.add(None, ["abcdefgh"])
    body = orjson.loads(embeddings.encode(call, [[0.5, -1.0]], usage))
    assert struct.unpack("<2f", base64.b64decode(body["data"][0]["embedding"])) == (0.5, -1.0)
    assert body["usage"] == {"prompt_tokens": 2, "total_tokens": 2, "estimated": True}


def test_rerank_documents_and_defaults_by_route() -> None:
    body = {"model": "r", "query": "q", "documents": ["a", {"text": "b"}]}
    assert rerank.decode(body, "/v1/rerank").documents == ["a", "b"]
    assert rerank.decode(body, "/v1/rerank").return_documents is True  # Jina's default
    assert rerank.decode(body, "/v2/rerank").return_documents is False  # Cohere v2's
    for bad, param in (({"documents": []}, "documents"), ({"documents": [{"title": "x"}]}, "documents"),
                       ({"query": ""}, "query"), ({"top_n": 0}, "top_n"), ({"return_documents": "yes"},
                                                                            "return_documents")):
        with pytest.raises(ClientRequestError) as caught:
            rerank.decode({**body, **bad}, "/rerank")
        assert caught.value.param == param


def test_rerank_answer_is_sorted_cut_and_keeps_indexes() -> None:
    call = rerank.decode({"model": "r", "query": "q", "documents": ["a", "b", "c"], "top_n": 2}, "/v1/rerank")
    got = orjson.loads(rerank.encode(call, [Ranked(0, 0.1), Ranked(1, 0.9), Ranked(2, 0.5)], Usage(5)))
    assert got["results"] == [{"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
                              {"index": 2, "relevance_score": 0.5, "document": {"text": "c"}}]
    assert got["model"] == "r" and got["usage"] == {"prompt_tokens": 5, "total_tokens": 5} and got["id"]
