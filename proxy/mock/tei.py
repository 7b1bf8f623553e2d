"""A fake Hugging Face text-embeddings-inference server (TEI): `POST /embed`, `POST /rerank`, `GET /info`, and the
common `GET /health` (proxy/mock/common.py), with TEI's error shape `{"error", "error_type"}` and statuses, its
`max_client_batch_size` (32 unless the `max_batch=N` directive says otherwise) and its `x-compute-tokens` header
(left out under the `no_tokens` directive). Vectors and scores: proxy/mock/retrieval.py. The `error=413|424|429`
directive answers every request with that status and TEI's error for it; `delay_ms=N` answers N ms late. Its
flavours (FLAVOURS) describe a reranker or a classifier on /info instead of an embedding model."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.mock.asgi import Stats
from proxy.mock.common import CHECK_HEADER, MockConfig
from proxy.mock.retrieval import DIMENSION, embedding, score, tokens

DEFAULT_MODEL = "BAAI/bge-m3"
# What `GET /info` says the model is (TEI's OpenAPI `ModelType`: one key); today's ("") an embedding model. Every
# flavour answers /embed and /rerank alike: only what the server says of itself differs.
FLAVOURS = {
    "reranker": "a reranker: /info says model_type reranker (a single-class sequence classifier), model "
                "BAAI/bge-reranker-v2-m3",
    "classifier": "a classifier of several classes: /info says model_type classifier (TEI's /predict only)",
}
_MODEL_TYPES: dict[str, tuple[str, dict[str, Any]]] = {
    "": (DEFAULT_MODEL, {"embedding": {"pooling": "cls"}}),
    "reranker": ("BAAI/bge-reranker-v2-m3", {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}),
    "classifier": ("SamLowe/roberta-base-go_emotions", {"classifier": {
        "id2label": {"0": "admiration", "1": "amusement"}, "label2id": {"admiration": 0, "amusement": 1}}}),
}
MAX_BATCH = 32
# TEI's error types by status (router/src/http/server.rs): what the `error=N` directive answers with
_ERRORS = {400: "Empty", 413: "Validation", 422: "Validation", 424: "Backend", 429: "Overloaded", 503: "Unhealthy"}


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": message, "error_type": _ERRORS.get(status, "Backend")}, status_code=status)


async def _refusal(stats: Stats, size: int, field: str) -> Response | None:
    """The directive's error, an empty batch, or one past the batch limit (TEI's own messages); after the
    `delay_ms=N` directive's wait."""
    delay = stats.directives.get("delay_ms", "")
    if delay.isdigit():
        await asyncio.sleep(int(delay) / 1000)
    wanted = stats.directives.get("error")
    if wanted and wanted.isdigit():
        return _error(int(wanted), f"mock: error {wanted} as asked")
    if size == 0:
        return _error(422, f"`{field}` cannot be empty")
    limit = int(stats.directives.get("max_batch", MAX_BATCH))
    if size > limit:
        return _error(422, f"batch size {size} > maximum allowed batch size {limit}")
    return None


async def _record(stats: Stats, request: Request) -> dict[str, Any]:
    """The request's body, recorded as every mock records its inference requests (GET /_mock/last_request)."""
    body: dict[str, Any] = await request.json()
    if CHECK_HEADER in request.headers:  # the proxy's readiness check: counted apart, as every mock does
        stats.checks += 1
        return body
    stats.requests += 1
    stats.last_request = {"method": request.method, "path": request.url.path, "headers": dict(request.headers),
                          "body": body, "traceparent": request.headers.get("traceparent")}
    stats.recent.append(stats.last_request)
    return body


def _answer(stats: Stats, data: Any, items: list[Any]) -> Response:
    stats.completed += 1
    headers = {} if "no_tokens" in stats.directives else {"x-compute-tokens": str(tokens(items))}
    return JSONResponse(data, headers=headers)


def routes(cfg: MockConfig, stats: Stats) -> list[Route]:
    default_model, model_type = _MODEL_TYPES[cfg.flavour]
    model = cfg.served_model or default_model

    async def embed(request: Request) -> Response:
        body = await _record(stats, request)
        inputs = body.get("inputs")
        items = [inputs] if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)) else inputs or []
        if (refused := await _refusal(stats, len(items), "inputs")) is not None:
            return refused
        size = body.get("dimensions") or int(stats.directives.get("dimension", DIMENSION))
        return _answer(stats, [embedding(item, size) for item in items], items)

    async def rerank(request: Request) -> Response:
        body = await _record(stats, request)
        texts = body.get("texts") or []
        if (refused := await _refusal(stats, len(texts), "texts")) is not None:
            return refused
        query = body.get("query", "")
        ranks = [{"index": i, "score": score(query, t), **({"text": t} if body.get("return_text") else {})}
                 for i, t in enumerate(texts)]
        return _answer(stats, sorted(ranks, key=lambda r: -r["score"]), [query, *texts])

    async def info(request: Request) -> Response:
        return JSONResponse({
            "model_id": model, "model_sha": None, "model_dtype": "float16", "served_model_name": model,
            "model_type": model_type, "max_concurrent_requests": 512,
            "max_input_length": 8192, "max_batch_tokens": 16384, "max_batch_requests": None,
            "max_client_batch_size": int(stats.directives.get("max_batch", MAX_BATCH)), "auto_truncate": False,
            "tokenization_workers": 2, "version": "1.8.0", "sha": None, "docker_label": None})

    return [Route("/embed", embed, methods=["POST"]), Route("/rerank", rerank, methods=["POST"]),
            Route("/info", info, methods=["GET"])]
