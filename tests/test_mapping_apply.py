"""proxy/dialects/mapping.py `DialectMapping.apply_request` walks the body's fields that a rule names, not every rule:
it must give what trying every rule in turn gives, for every dialect's mapping (mappings/*.yaml), on any body — the same
out dict, or an error where the rule-by-rule walk raised one (with two bad fields, either may be named: the walk
goes in the body's order)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.dialects.mapping import DialectMapping, _check_range, load_mapping
from proxy.errors import ClientRequestError

DIALECTS = ["openai", "deepseek", "mindie", "siliconstorm", "engine"]


def rule_by_rule(m: DialectMapping, body: dict[str, Any]) -> dict[str, Any]:
    """Every rule tried in turn (apply_request before it walked the body)."""
    out = dict(body)
    for src, dst in m.rename.items():
        if src in out:
            value = out.pop(src)
            if dst not in out or out[dst] is None:
                out[dst] = value
    for key in m.drop:
        out.pop(key, None)
    for key in m.integer:
        value = out.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ClientRequestError(f"`{key}` must be an integer.", param=key)
    for key, r in m.ranges.items():
        value = out.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ClientRequestError(f"`{key}` must be a number.", param=key)
        out[key] = _check_range(key, value, r)
    for key, limit in m.max_items.items():
        value = out.get(key)
        if isinstance(value, list) and len(value) > limit:
            raise ClientRequestError(f"`{key}` has too many items.", param=key)
    return out


def ruled_fields() -> list[str]:
    names: set[str] = {"model", "messages", "stream", "unknown_field"}
    for d in DIALECTS:
        m = load_mapping(d)
        names |= set(m.rename) | set(m.rename.values()) | m.drop | m.integer | set(m.ranges) | set(m.max_items)
    return sorted(names)


value = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 300), st.floats(-3, 3, allow_nan=False), st.sampled_from([0, 1e-7, 2.5]),
    st.text(max_size=2), st.lists(st.text(max_size=1), max_size=5), st.just(list(range(2000))),
)
bodies = st.dictionaries(st.sampled_from(ruled_fields()), value, max_size=8)


@pytest.mark.parametrize("dialect", DIALECTS)
@settings(max_examples=300, deadline=None)
@given(body=bodies)
def test_apply_request_equals_trying_every_rule(dialect: str, body: dict[str, Any]) -> None:
    m = load_mapping(dialect)
    try:
        want: dict[str, Any] | None = rule_by_rule(m, body)
    except ClientRequestError:
        want = None
    if want is None:
        with pytest.raises(ClientRequestError):
            m.apply_request(body)
        return
    got = m.apply_request(body)
    assert got == want
    assert list(got) == list(want)  # the same order of fields, as sent upstream
    assert got is not body


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_rule_is_applied_to_a_body_of_one_field(dialect: str) -> None:
    """Each rule on its own, a body of one field that breaks it (or that it drops or renames)."""
    m = load_mapping(dialect)
    for key in m.drop:
        assert key not in m.apply_request({key: 1})
    for src, dst in m.rename.items():
        assert m.apply_request({src: 5}) == rule_by_rule(m, {src: 5}) and dst in m.apply_request({src: 5})
    for key in m.integer - m.drop:
        with pytest.raises(ClientRequestError):
            m.apply_request({key: 1.5})
    for key in set(m.ranges) - m.drop:
        with pytest.raises(ClientRequestError):
            m.apply_request({key: "x"})
    for key, limit in m.max_items.items():
        with pytest.raises(ClientRequestError):
            m.apply_request({key: ["s"] * (limit + 1)})
