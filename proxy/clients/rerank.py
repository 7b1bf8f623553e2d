"""Rerank on the client side: `POST /rerank`, `/v1/rerank` (Cohere v1 and Jina) and `/v2/rerank` (Cohere v2), the
body validated into a `RerankCall` (proxy/hub/retrieval.py) and the scores encoded as the answer those clients read.

The request: `model`, `query`, `documents` as strings or `{text}` objects, `top_n`, `return_documents`. When
`return_documents` is not given, /v2/rerank leaves the documents out (Cohere v2's default) and the others put them in
(Jina's default; Cohere v1's SDK reads them when present). The answer carries what the cohere SDK reads (`id`,
`results[].index`, `results[].relevance_score`, `results[].document.text`, `meta`) and what Jina's clients read
(`model`, `usage`), its results sorted by score, best first, cut to `top_n`.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import orjson

from proxy.errors import ClientRequestError
from proxy.hub.retrieval import Ranked, RerankCall, Usage

PATHS: Final = ("/rerank", "/v1/rerank", "/v2/rerank")
MAX_DOCUMENTS: Final = 10_000  # Cohere's limit on one request's documents


def decode(request: dict[str, Any], path: str) -> RerankCall:
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise ClientRequestError("`model` is required: the name of a rerank model.", param="model")
    query = request.get("query")
    if not isinstance(query, str) or not query:
        raise ClientRequestError("`query` must be a non-empty string.", param="query")
    top_n = request.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 1):
        raise ClientRequestError("`top_n` must be a positive integer.", param="top_n")
    returned = request.get("return_documents")
    if returned is None:
        returned = path != "/v2/rerank"
    if not isinstance(returned, bool):
        raise ClientRequestError("`return_documents` must be a boolean.", param="return_documents")
    return RerankCall(model, query, documents(request.get("documents")), top_n, returned, request)


def documents(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ClientRequestError("`documents` must be a non-empty list.", param="documents")
    if len(value) > MAX_DOCUMENTS:
        raise ClientRequestError(f"`documents` has {len(value)} items; at most {MAX_DOCUMENTS} are allowed.",
                                 param="documents")
    out: list[str] = []
    for doc in value:
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str):
            raise ClientRequestError("Each document must be a string or an object with a `text` string.",
                                     param="documents")
        out.append(text)
    return out


def encode(call: RerankCall, ranked: list[Ranked], usage: Usage) -> bytes:
    best = sorted(ranked, key=lambda r: (-r.score, r.index))
    if call.top_n is not None:
        best = best[:call.top_n]
    results = [_result(call, r) for r in best]
    return orjson.dumps({
        "id": str(uuid.uuid4()),
        "model": call.model,
        "results": results,
        "usage": usage.as_json(),
        "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
    })


def _result(call: RerankCall, r: Ranked) -> dict[str, Any]:
    out: dict[str, Any] = {"index": r.index, "relevance_score": r.score}
    if call.return_documents:
        out["document"] = {"text": call.documents[r.index]}
    return out
