"""Hugging Face text-embeddings-inference (TEI), and its Ascend adaptation: embeddings and rerank, no chat.

Embeddings go to TEI's own `POST /embed` rather than its OpenAI-compatible `/v1/embeddings`: /embed and /rerank
answer one error shape (`{"error", "error_type"}`), and /embed takes TEI's own switches (`normalize`, `truncate`,
`truncation_direction`, `prompt_name`), which a client may add to its OpenAI body and which go on as they are. Rerank
goes to `POST /rerank` with `texts`, and `return_text: false`: the proxy has the texts and returns them itself.

TEI refuses a request with more inputs than its `max_client_batch_size` (32 unless the server was started with
another) with a 422 that names the limit: the proxy sends at most 32 a request, and when the server says its limit
is lower, remembers that limit (per upstream, per process) and sends the refused batch again, split. TEI reports the
tokens it read in its `x-compute-tokens` response header; a server that does not gets its usage estimated
(proxy/hub/retrieval.py `Usage`). Readiness: `GET /health`, then an empty batch, which TEI refuses as invalid.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

from proxy.dialects.base import Dialect, UpstreamSession
from proxy.dialects.probing import Probe, ProbeInfo
from proxy.dialects.readiness import Readiness
from proxy.errors import UpstreamError
from proxy.hub.retrieval import (
    EmbedBatch,
    EmbedCall,
    Input,
    RerankBatch,
    RerankCall,
    RetrievalWire,
    UpstreamAnswer,
    json_object,
    ranked_item,
    vector,
)
from proxy.settings import UpstreamSettings

DEFAULT_BATCH: Final = 32  # TEI's default max_client_batch_size
# Its refusal of a batch past the limit (router/src/http/server.rs): "batch size 40 > maximum allowed batch size 32"
_BATCH_REFUSED: Final = re.compile(r"maximum allowed batch size (\d+)")
# TEI's own /embed and /rerank fields a client may add to its body: passed on as they are.
_EMBED_FIELDS: Final = ("normalize", "truncate", "truncation_direction", "prompt_name")
_RERANK_FIELDS: Final = ("truncate", "truncation_direction", "raw_scores")


class TEIWire:
    """TEI's /embed and /rerank, for one upstream."""

    def __init__(self, embed_path: str, rerank_path: str) -> None:
        self.embed_path = embed_path
        self.rerank_path = rerank_path
        self.limit = DEFAULT_BATCH

    def batch_limit(self) -> int | None:
        return self.limit

    def embed_request(self, call: EmbedCall, batch: list[Input], model: str) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {k: call.request[k] for k in _EMBED_FIELDS if k in call.request}
        body["inputs"] = batch
        if call.dimensions is not None:
            body["dimensions"] = call.dimensions
        return self.embed_path, body

    def embed_answer(self, answer: UpstreamAnswer, size: int) -> EmbedBatch:
        try:
            data = orjson.loads(answer.raw)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, list) or len(data) != size:
            raise UpstreamError(f"TEI's /embed answer is not a list of {size} vectors.")
        return EmbedBatch([vector(v) for v in data], _tokens(answer))

    def rerank_request(self, call: RerankCall, batch: list[str], model: str) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {k: call.request[k] for k in _RERANK_FIELDS if k in call.request}
        body.update(query=call.query, texts=batch, return_text=False)
        return self.rerank_path, body

    def rerank_answer(self, answer: UpstreamAnswer, size: int) -> RerankBatch:
        try:
            data = orjson.loads(answer.raw)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, list):
            raise UpstreamError("TEI's /rerank answer is not a list of ranks.")
        return RerankBatch([ranked_item(item, "score", size) for item in data], _tokens(answer))

    def learn(self, answer: UpstreamAnswer) -> bool:
        if answer.status != 422:
            return False
        try:
            message = json_object(answer.raw).get("error")
        except UpstreamError:
            return False
        found = _BATCH_REFUSED.search(message) if isinstance(message, str) else None
        if found is None or not 0 < int(found.group(1)) < self.limit:
            return False
        self.limit = int(found.group(1))
        return True


def _tokens(answer: UpstreamAnswer) -> int | None:
    value = answer.headers.get("x-compute-tokens", "")
    return int(value) if value.isdigit() else None


class TEIReadiness(Readiness):
    """An empty batch, which TEI refuses as invalid: on /rerank for an upstream that serves rerank alone (a reranker
    model answers /embed with an error of another kind), else on /embed."""

    def request(self, u: UpstreamSettings) -> tuple[str, dict[str, Any]]:
        if u.kinds == ("rerank",):
            return "/rerank", {"query": "", "texts": []}
        return "/embed", {"inputs": []}


class TEIProbe(Probe):
    """A TEI server lists no models: it describes itself on `GET /info` (mappings/tei.yaml `info`; TEI's OpenAPI
    `Info`): `model_id`, `model_type` with one key — `embedding`, `reranker` (a sequence classifier with one class:
    what /rerank needs) or `classifier` (several classes: /predict only, /rerank refuses it with a 424) — and
    `max_client_batch_size`."""

    def info(self, body: Any) -> ProbeInfo | None:
        if not isinstance(body, dict) or not isinstance(body.get("model_id"), str):
            return None
        model_type = body.get("model_type")
        if not isinstance(model_type, dict) or len(model_type) != 1:
            return None
        found = _MODEL_TYPES.get(next(iter(model_type)))
        if found is None:
            return None
        kinds, what = found
        version = body.get("version")
        evidence = f"GET /info: text-embeddings-inference{f' {version}' if isinstance(version, str) else ''}, {what}"
        return ProbeInfo(evidence, [body["model_id"]], kinds, _batch_note(body.get("max_client_batch_size")))


# /info's `model_type` key -> the kinds of model the proxy serves from it, and what it is in the probe's words
_MODEL_TYPES: Final = {
    "embedding": (("embeddings",), "an embedding model"),
    "reranker": (("rerank",), "a reranker"),
    "classifier": ((), "a classifier of several classes (TEI reranks only with a single-class model)"),
}


def _batch_note(limit: Any) -> list[str]:
    if not isinstance(limit, int) or isinstance(limit, bool):
        return []
    if limit < DEFAULT_BATCH:
        return [f"    # TEI's max_client_batch_size is {limit}: the proxy sends {DEFAULT_BATCH} inputs a request until "
                "TEI's first refusal names the lower limit, then that many"]
    return [f"    # TEI's max_client_batch_size is {limit}: the proxy sends at most {DEFAULT_BATCH} inputs a request"]


class TEIDialect(Dialect):
    name = "tei"
    session_class = UpstreamSession  # no chat: never asked for a session
    readiness_class = TEIReadiness
    probe = TEIProbe()

    def __init__(self) -> None:
        super().__init__()
        self.wire = TEIWire(self.path("embeddings") or "/embed", self.path("rerank") or "/rerank")

    def retrieval_wire(self) -> RetrievalWire:
        return self.wire
