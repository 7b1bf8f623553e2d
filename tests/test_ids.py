"""Ids: response ids name stored responses, so they are random (secrets.token_hex: proxy/endpoint/inference.py) and
distinct; a request's own x-request-id is the first it sent."""

from __future__ import annotations

import re

MSG = [{"role": "user", "content": "hi"}]


def test_the_proxys_answers_carry_distinct_ids(start_mock, start_proxy) -> None:
    proxy = start_proxy(mock=start_mock("openai"))
    client = proxy.client()
    ids = [client.chat.completions.create(model="m", messages=MSG).id for _ in range(20)]
    ids += [client.responses.create(model="m", input="hi", store=False).id for _ in range(20)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", i) for i in ids[:20])
    assert all(re.fullmatch(r"resp_[0-9a-f]{24}", i) for i in ids[20:]), ids[20:]


def test_the_first_request_id_and_length_count_in_any_order() -> None:
    from proxy.endpoint.request import scan_headers as _scan_headers

    assert _scan_headers([]) == (b"", b"")
    assert _scan_headers([(b"host", b"h"), (b"content-length", b"12"), (b"x-request-id", b"a")]) == (b"a", b"12")
    assert _scan_headers([(b"x-request-id", b"a"), (b"x-request-id", b"b"), (b"content-length", b"3")]) == (b"a", b"3")
    assert _scan_headers([(b"x-request-id", b""), (b"x-request-id", b"b")]) == (b"", b"")  # the first, even empty
    assert _scan_headers([[b"content-length", b"7"], [b"accept", b"*/*"]]) == (b"", b"7")  # ASGI allows lists
