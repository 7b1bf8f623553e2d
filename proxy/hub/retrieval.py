"""Retrieval's canonical form: an embeddings call and a rerank call as typed records, what an upstream answers to
them, and how an upstream is spoken to for them (`RetrievalWire`).

The client side (proxy/clients/embeddings.py, proxy/clients/rerank.py) decodes OpenAI's, Cohere's and Jina's bodies
into `EmbedCall` / `RerankCall`; the endpoint (proxy/endpoint/retrieval.py) hands them to the upstream's wire, which
builds the upstream bodies (one per batch) and reads each answer into `EmbedBatch` / `RerankBatch`; the client side
encodes the joined result. `OpenAIWire` is the wire of every upstream that serves OpenAI's `/v1/embeddings` and the
Cohere/Jina-compatible `/v1/rerank` itself (OpenAI, vLLM): the client's own fields go as they are. A spoke whose
server speaks otherwise returns its own wire from `Dialect.retrieval_wire` (proxy/dialects/tei.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import orjson

from proxy.errors import UpstreamError

EMBEDDINGS: Final = "embeddings"
RERANK: Final = "rerank"

Input = str | list[int]  # one text, or one text's token ids


@dataclass(frozen=True, slots=True)
class EmbedCall:
    """One `POST /v1/embeddings`, validated."""

    model: str
    inputs: list[Input]
    encoding_format: str  # float | base64: the proxy encodes; upstreams are always asked for floats
    dimensions: int | None
    request: dict[str, Any]  # the client's body (its extra fields go to upstreams that take them as they are)


@dataclass(frozen=True, slots=True)
class RerankCall:
    """One rerank request (Cohere v1/v2 or Jina shape), validated."""

    model: str
    query: str
    documents: list[str]
    top_n: int | None
    return_documents: bool
    request: dict[str, Any]


@dataclass(slots=True)
class Usage:
    """Tokens the upstream read. `estimated`: it did not say, so the proxy counted (about four characters a token)."""

    prompt_tokens: int = 0
    estimated: bool = False

    def add(self, tokens: int | None, inputs: list[Input]) -> None:
        if tokens is None:
            tokens = estimate_tokens(inputs)
            self.estimated = True
        self.prompt_tokens += tokens

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens}
        if self.estimated:
            out["estimated"] = True
        return out


@dataclass(frozen=True, slots=True)
class EmbedBatch:
    vectors: list[list[float]]
    tokens: int | None  # None: the upstream did not say


@dataclass(frozen=True, slots=True)
class Ranked:
    index: int  # into the client's documents
    score: float


@dataclass(frozen=True, slots=True)
class RerankBatch:
    ranked: list[Ranked]  # indexes into this batch's documents
    tokens: int | None


@dataclass(slots=True)
class UpstreamAnswer:
    """One upstream answer as the wire reads it: status, body, lower-case headers."""

    status: int
    raw: bytes
    headers: dict[str, str] = field(default_factory=dict)


class RetrievalWire(Protocol):
    """How one upstream is asked for embeddings and reranking."""

    def batch_limit(self) -> int | None:
        """The most inputs (documents) one upstream request may carry; None: no limit the proxy knows."""

    def embed_request(self, call: EmbedCall, batch: list[Input], model: str) -> tuple[str, dict[str, Any]]:
        """(path, body) of one batch of `call`."""

    def embed_answer(self, answer: UpstreamAnswer, size: int) -> EmbedBatch:
        """A 2xx answer to one batch of `size` inputs."""

    def rerank_request(self, call: RerankCall, batch: list[str], model: str) -> tuple[str, dict[str, Any]]:
        """(path, body) of one batch of `call`'s documents."""

    def rerank_answer(self, answer: UpstreamAnswer, size: int) -> RerankBatch:
        """A 2xx answer to one batch of `size` documents."""

    def learn(self, answer: UpstreamAnswer) -> bool:
        """An error answer that says the batch was too large: remember the server's limit (True: send again)."""


class OpenAIWire:
    """Upstreams that serve `/v1/embeddings` and `/v1/rerank` as OpenAI and Cohere/Jina define them (vLLM, OpenAI,
    and OpenAI-compatible servers): the client's body goes as it is, with the upstream's model name, and floats
    asked for (the proxy encodes base64 itself, so every upstream's answer reads the same)."""

    def __init__(self, embeddings_path: str, rerank_path: str) -> None:
        self.embeddings_path = embeddings_path
        self.rerank_path = rerank_path

    def batch_limit(self) -> int | None:
        return None

    def embed_request(self, call: EmbedCall, batch: list[Input], model: str) -> tuple[str, dict[str, Any]]:
        body = {**call.request, "model": model, "input": batch, "encoding_format": "float"}
        return self.embeddings_path, body

    def embed_answer(self, answer: UpstreamAnswer, size: int) -> EmbedBatch:
        data = json_object(answer.raw)
        items = data.get("data")
        if not isinstance(items, list) or len(items) != size:
            raise UpstreamError(f"The upstream's embeddings answer has no `data` list of {size} items.")
        ordered = sorted(items, key=lambda item: item.get("index", 0) if isinstance(item, dict) else 0)
        vectors = [vector(item.get("embedding") if isinstance(item, dict) else None) for item in ordered]
        return EmbedBatch(vectors, usage_tokens(data.get("usage")))

    def rerank_request(self, call: RerankCall, batch: list[str], model: str) -> tuple[str, dict[str, Any]]:
        body = {**call.request, "model": model, "documents": batch, "top_n": len(batch), "return_documents": False}
        return self.rerank_path, body

    def rerank_answer(self, answer: UpstreamAnswer, size: int) -> RerankBatch:
        data = json_object(answer.raw)
        results = data.get("results")
        if not isinstance(results, list):
            raise UpstreamError("The upstream's rerank answer has no `results` list.")
        ranked = [ranked_item(item, "relevance_score", size) for item in results]
        return RerankBatch(ranked, usage_tokens(data.get("usage")))

    def learn(self, answer: UpstreamAnswer) -> bool:
        return False


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise UpstreamError("The upstream's answer is not a JSON object.")
    return data


def vector(value: Any) -> list[float]:
    if not isinstance(value, list) or not all(isinstance(x, int | float) for x in value):
        raise UpstreamError("The upstream's answer has an embedding that is not a list of numbers.")
    return [float(x) for x in value]


def ranked_item(item: Any, score_key: str, size: int) -> Ranked:
    if not isinstance(item, dict):
        raise UpstreamError("The upstream's rerank answer has a result that is not an object.")
    index, score = item.get("index"), item.get(score_key)
    if not isinstance(index, int) or not 0 <= index < size or not isinstance(score, int | float):
        raise UpstreamError(f"The upstream's rerank answer has a result without a valid `index` and `{score_key}`.")
    return Ranked(index, float(score))


def usage_tokens(usage: Any) -> int | None:
    if not isinstance(usage, dict):
        return None
    for key in ("prompt_tokens", "total_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and value >= 0:
            return value
    return None


def estimate_tokens(inputs: list[Input]) -> int:
    """About four characters a token for texts (a token list counts itself)."""
    return sum(len(i) if isinstance(i, list) else max(1, math.ceil(len(i) / 4)) for i in inputs)
