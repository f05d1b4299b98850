"""`parse_body` answers exactly as `json.loads`: the same value, or the same exception."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from actors.providers.simulator.body_json import parse_body

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 10, max_value=2**80)
    | st.integers(min_value=-(2**80), max_value=-(2**63) + 10)
    | st.floats()
    | st.text()
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def _outcome(parse: Any, raw: bytes) -> tuple[str, str]:
    """What `parse(raw)` gives: its value as exact JSON text (types, key order), or its error."""
    try:
        value = parse(raw)
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)
    return "value", json.dumps(value)


@given(_VALUES, st.booleans(), st.sampled_from([None, 2]))
def test_any_json_text_parses_to_the_same_value(value: Any, ascii_only: bool, indent: Any) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode("utf-8", "surrogatepass")
    assert _outcome(parse_body, raw) == _outcome(json.loads, raw)


@given(st.binary(max_size=64))
@example(b"")
def test_any_bytes_give_the_same_value_or_error(raw: bytes) -> None:
    assert _outcome(parse_body, raw) == _outcome(json.loads, raw)


@given(_VALUES, st.data())
def test_a_damaged_json_text_gives_the_same_value_or_error(value: Any, data: st.DataObject) -> None:
    raw = bytearray(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    at = data.draw(st.integers(min_value=0, max_value=len(raw)))
    cut = data.draw(st.integers(min_value=0, max_value=3))
    insert = data.draw(st.binary(max_size=3) | st.sampled_from([b",", b"]", b"}", b'"', b"\\"]))
    raw[at : at + cut] = insert
    assert _outcome(parse_body, bytes(raw)) == _outcome(json.loads, bytes(raw))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"max_tokens": 18446744073709551616}',  # orjson alone would give a float
        b'{"max_tokens": -9223372036854775809}',
        b'{"n": 123456789012345678901234567890}',
        b'{"s": "1234567890123456789012"}',
        b'{"t": 1e400}',
        b'{"t": NaN}',
        b"[Infinity, -Infinity]",
        b'{"s": "\\ud800"}',
        b'{"s": "\xed\xa0\x80"}',
        b"\xef\xbb\xbf{}",
        '{"model": "x"}'.encode("utf-16"),
        b'{"s": "\xff"}',
        b'{"a": 1, "b": 2, "a": 3}',
        b'{"a": 1,}',
        b"[" * 100_000,
    ],
)
def test_what_orjson_refuses_or_reads_otherwise_is_parsed_by_json(raw: bytes) -> None:
    assert _outcome(parse_body, raw) == _outcome(json.loads, raw)
