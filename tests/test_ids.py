"""Ids: response ids name stored responses, so they are random (the system's CSPRNG), never handed out twice, not even
by two processes forked from one (proxy/endpoint/inference.py RandomHex); a request's own x-request-id is the first it
sent."""

from __future__ import annotations

import os
import re

from proxy.endpoint.request import RandomHex

MSG = [{"role": "user", "content": "hi"}]


def test_ids_are_hex_and_never_repeat_across_batches() -> None:
    source = RandomHex()
    ids = [source.hex(12) for _ in range(3 * RandomHex.BATCH // 12 + 7)]  # across several draws from the system
    assert all(re.fullmatch(r"[0-9a-f]{24}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert len(source.hex(RandomHex.BATCH + 5)) == 2 * (RandomHex.BATCH + 5)  # longer than a batch: drawn whole


def test_a_forked_child_does_not_hand_out_the_parents_bytes() -> None:
    from proxy.endpoint import request as handlers

    source = handlers.response_random
    source.hex(12)  # the pool is filled: a child that kept it would hand out the parent's next bytes
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        try:
            os.write(write, source.hex(12).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert re.fullmatch(r"[0-9a-f]{24}", child) and child != source.hex(12)


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
