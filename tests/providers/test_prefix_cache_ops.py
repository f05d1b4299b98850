"""The simulator's one-pass lookup-and-insert is exactly a lookup followed by an insert."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.providers.simulator import PrefixCache, tokenize

TOKENS = st.lists(st.sampled_from(["a", "b", " c", "dd", "\n", "e"]), max_size=40)


def _cache() -> PrefixCache:
    return PrefixCache(block_tokens=4, ttl=None, max_blocks=12, clock=lambda: 0.0)


@given(history=st.lists(st.tuples(TOKENS, TOKENS), max_size=6), prompt=TOKENS, reply=TOKENS)
def test_lookup_and_insert_equals_lookup_then_insert(
    history: list[tuple[list[str], list[str]]], prompt: list[str], reply: list[str]
) -> None:
    one_pass, two_passes = _cache(), _cache()
    for earlier_prompt, earlier_reply in [*history, (prompt, reply)]:
        hit = one_pass.lookup_and_insert("k", earlier_prompt, earlier_reply)
        assert hit == two_passes.lookup("k", earlier_prompt)
        two_passes.insert("k", earlier_prompt + earlier_reply)
        assert list(one_pass._blocks.items()) == list(two_passes._blocks.items())
    assert one_pass.statistics() == two_passes.statistics()


def test_different_splits_of_the_same_text_are_different_blocks() -> None:
    cache = _cache()
    cache.insert("k", ["ab", "c", "d", "e"])
    assert cache.lookup("k", ["a", "bc", "d", "e"]) == 0
    assert cache.lookup("k", ["ab", "c", "d", "e"]) == 4


@given(st.text(min_size=200, max_size=600))
def test_long_texts_tokenize_the_same_from_the_cache(text: str) -> None:
    first, again = tokenize(text), tokenize(text)
    assert first == again and "".join(first) == text
    first.append("x")  # callers own the list they get
    assert tokenize(text) == again
