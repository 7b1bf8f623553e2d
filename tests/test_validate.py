"""proxy/clients/validate.py: the type table and the depth bound, in-process."""

from __future__ import annotations

import pytest

from proxy.clients.validate import ARRAY, BOOLEAN, INTEGER, NULL, NUMBER, OBJECT, STRING, check_depth, check_types
from proxy.errors import ClientRequestError

TABLE = {"n": (INTEGER, NULL), "t": NUMBER, "b": BOOLEAN, "o": OBJECT, "o.s": STRING, "a": ARRAY, "a[]": OBJECT,
         "a[].k": STRING, "m": ARRAY, "m[]": (STRING, ARRAY), "m[][]": INTEGER}


@pytest.mark.parametrize("body", [{"n": 2}, {"n": 2.0}, {"n": None}, {"t": 1}, {"t": 0.5}, {"b": False},
                                  {"o": {"s": "x", "other": [1]}}, {"a": [{"k": "x"}, {}]}, {"m": ["x", [1, 2]]},
                                  {"unknown": {"deep": [True]}}])
def test_accepted(body):
    check_types(body, TABLE)


@pytest.mark.parametrize("body,param", [({"n": True}, "n"), ({"n": 2.5}, "n"), ({"t": "1"}, "t"), ({"b": 1}, "b"),
                                        ({"o": []}, "o"), ({"o": {"s": 1}}, "o.s"), ({"a": [{}, {"k": 2}]}, "a[1].k"),
                                        ({"a": [{}, "x"]}, "a[1]"), ({"m": ["x", [1, "2"]]}, "m[1][1]")])
def test_refused_with_the_path(body, param):
    with pytest.raises(ClientRequestError) as caught:
        check_types(body, TABLE)
    assert caught.value.param == param and caught.value.status == 400 and f"`{param}`" in caught.value.message


def test_depth():
    value: object = "x"
    for _ in range(64):
        value = [value]
    check_depth(value)
    with pytest.raises(ClientRequestError) as caught:
        check_depth([value])
    assert caught.value.code == "invalid_json"
