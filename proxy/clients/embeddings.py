"""OpenAI's `POST /v1/embeddings` on the client side: the body validated into an `EmbedCall` (proxy/hub/retrieval.py)
before any upstream is asked, and the joined vectors encoded as OpenAI's answer.

`input` is a string, a list of strings, a list of token ids or a list of such lists (OpenAI's four forms); none may
be empty. `encoding_format` is `float` or `base64`: base64 is the proxy's own encoding of the floats (little-endian
float32, as OpenAI and its SDKs decode it), whatever the upstream answered. `dimensions` goes to the upstream, which
says whether the model can shorten its vectors.
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Final

import orjson

from proxy.errors import ClientRequestError
from proxy.hub.retrieval import EmbedCall, Input, Usage

ENCODINGS: Final = ("float", "base64")
MAX_INPUTS: Final = 2048  # OpenAI's own limit on one request's inputs


def decode(request: dict[str, Any]) -> EmbedCall:
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise ClientRequestError("`model` is required: the name of an embeddings model.", param="model")
    encoding = request.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if encoding not in ENCODINGS:
        raise ClientRequestError(f"`encoding_format` must be one of {', '.join(ENCODINGS)}.",
                                 param="encoding_format")
    dimensions = request.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise ClientRequestError("`dimensions` must be a positive integer.", param="dimensions")
    user = request.get("user")
    if user is not None and not isinstance(user, str):
        raise ClientRequestError("`user` must be a string.", param="user")
    return EmbedCall(model, inputs(request.get("input")), encoding, dimensions, request)


def inputs(value: Any) -> list[Input]:
    """OpenAI's four forms of `input`, as a list of texts and token lists."""
    items = _items(value)
    if not items:
        raise ClientRequestError("`input` must not be empty.", param="input")
    if len(items) > MAX_INPUTS:
        raise ClientRequestError(f"`input` has {len(items)} items; at most {MAX_INPUTS} are allowed.", param="input")
    for item in items:
        _check(item)
    return items


def _items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(type(x) is int for x in value):
        return [value]  # one text's token ids
    if isinstance(value, list):
        return value
    raise ClientRequestError("`input` must be a string, a list of strings, or token ids.", param="input")


def _check(item: Any) -> None:
    if isinstance(item, str):
        if not item:
            raise ClientRequestError("`input` must not contain an empty string.", param="input")
    elif not isinstance(item, list) or not item or not all(type(x) is int and x >= 0 for x in item):
        raise ClientRequestError("Each `input` item must be a non-empty string or a non-empty list of token ids.",
                                 param="input")


def encode(call: EmbedCall, vectors: list[list[float]], usage: Usage) -> bytes:
    as_base64 = call.encoding_format == "base64"
    data = [{"object": "embedding", "index": i, "embedding": _base64(v) if as_base64 else v}
            for i, v in enumerate(vectors)]
    return orjson.dumps({"object": "list", "data": data, "model": call.model, "usage": usage.as_json()})


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
