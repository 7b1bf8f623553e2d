"""What the mock upstreams answer to embeddings and rerank (proxy/mock/tei.py, and the OpenAI-shaped routes of the
vLLM and OpenAI mocks): deterministic vectors — the same input always gives the same unit vector, of the asked
dimension — and a relevance score that grows with the words a text shares with the query."""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

DIMENSION = 64  # the mock models' vector size (`dimension=N` directive: another)
_WORDS = re.compile(r"\w+")


def embedding(item: Any, dimension: int) -> list[float]:
    """A unit vector drawn from the input's hash: equal inputs, equal vectors."""
    seed = repr(item).encode()
    raw = b""
    block = 0
    while len(raw) < dimension * 4:
        raw += hashlib.blake2b(seed + block.to_bytes(4, "big"), digest_size=64).digest()
        block += 1
    values = [(n / 0xFFFFFFFF) * 2 - 1 for n in struct.unpack(f">{dimension}I", raw[:dimension * 4])]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def score(query: str, text: str) -> float:
    """The share of the query's words that the text has, nudged by the text's hash so that ties are rare."""
    words = {w.lower() for w in _WORDS.findall(query)}
    found = {w.lower() for w in _WORDS.findall(text)}
    share = len(words & found) / len(words) if words else 0.0
    nudge = hashlib.blake2b(text.encode(), digest_size=2).digest()[0] / 255 / 1000
    return round(share * 0.99 + nudge, 6)


def tokens(items: list[Any]) -> int:
    """Tokens read: a token list counts itself, a text its words (at least one)."""
    return sum(len(i) if isinstance(i, list) else max(1, len(_WORDS.findall(str(i)))) for i in items)


def openai_routes(model: str, check: Callable[[Request], Response | None]) -> list[Route]:
    """OpenAI's /v1/embeddings and the Cohere/Jina-compatible /v1/rerank, as vLLM serves them."""

    async def embeddings(request: Request) -> Response:
        if (refused := check(request)) is not None:
            return refused
        body = await request.json()
        items = body.get("input")
        items = [items] if isinstance(items, str) or (items and isinstance(items[0], int)) else items
        if not items:
            return JSONResponse({"error": {"message": "input is empty", "type": "BadRequestError", "param": "input",
                                           "code": 400}}, status_code=400)
        size = body.get("dimensions") or DIMENSION
        data = [{"object": "embedding", "index": i, "embedding": embedding(item, size)} for i, item in enumerate(items)]
        used = tokens(items)
        return JSONResponse({"id": "embd-mock", "object": "list", "created": 0, "model": body.get("model", model),
                             "data": data, "usage": {"prompt_tokens": used, "total_tokens": used}})

    async def rerank(request: Request) -> Response:
        if (refused := check(request)) is not None:
            return refused
        body = await request.json()
        docs = [d if isinstance(d, str) else d.get("text", "") for d in body.get("documents") or []]
        query = body.get("query", "")
        order = sorted(range(len(docs)), key=lambda i: -score(query, docs[i]))[:body.get("top_n") or len(docs)]
        results = [{"index": i, "relevance_score": score(query, docs[i]), "document": {"text": docs[i]}}
                   for i in order]
        used = tokens([body.get("query", ""), *docs])
        return JSONResponse({"id": "rerank-mock", "model": body.get("model", model), "results": results,
                             "usage": {"total_tokens": used}})

    return [Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/rerank", rerank, methods=["POST"]), Route("/v2/rerank", rerank, methods=["POST"])]
