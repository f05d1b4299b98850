"""The simulator's per-segment prompt memo gives exactly the uncached accounting.

The reference is the uncached path: tokenize every segment of the prompt
(`tokenize`, as `render_prompt` does), then `PrefixCache.lookup_and_insert`
on the whole token lists. The memo (`PromptChains`) must give the same
token counts, the same block digests (so the same hits and the same cache
state), and the same prompt digest, whatever the segments, their splits,
the block size and the memo's bounds (tiny bounds evict all the time).
"""

from __future__ import annotations

import hashlib
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.simulator import PrefixCache, tokenize
from actors.providers.simulator.prompt_chain import PromptChains

# Few distinct characters, so segments repeat and prompts share prefixes.
SEGMENT = st.text(alphabet="ab c\n{}:é", max_size=30)
# A request: its prompt's segments, and the completion's segment.
REQUEST = st.tuples(st.lists(SEGMENT, max_size=5), SEGMENT)


def _tokens(texts: list[str]) -> list[str]:
    return [token for text in texts for token in tokenize(text)]


def _cache(block: int) -> PrefixCache:
    return PrefixCache(block_tokens=block, ttl=None, max_blocks=50, clock=lambda: 0.0)


@given(
    requests=st.lists(REQUEST, min_size=1, max_size=8),
    block=st.integers(1, 6),
    max_nodes=st.integers(1, 6),
    max_chars=st.integers(1, 80),
    keys=st.lists(st.sampled_from(["k", "other"]), min_size=8, max_size=8),
)
def test_the_memo_accounts_every_request_as_the_uncached_path(
    requests: list[tuple[list[str], str]],
    block: int,
    max_nodes: int,
    max_chars: int,
    keys: list[str],
) -> None:
    chains = PromptChains(block_tokens=block, max_nodes=max_nodes, max_chars=max_chars)
    memo, uncached = _cache(block), _cache(block)
    for (segments, completion), key in zip(requests, keys, strict=False):
        prompt_tokens = _tokens(segments)
        node, digests = chains.walk(key, segments)
        assert node.tokens == len(prompt_tokens)
        assert len(digests) == len(prompt_tokens) // block
        assert node.seed == hashlib.sha256("".join(segments).encode()).digest()
        reply = chains.extend(node, completion)
        assert reply.tokens == len(prompt_tokens) + len(tokenize(completion))
        hit = memo.lookup_and_insert_digests([*digests, *reply.blocks], len(digests))
        assert hit == uncached.lookup_and_insert(key, prompt_tokens, tokenize(completion))
        assert list(memo._blocks.items()) == list(uncached._blocks.items())
        assert len(chains) <= max_nodes and chains.chars <= max_chars
    assert memo.statistics() == uncached.statistics()


@given(text=st.text(alphabet="ab c\n", max_size=60), cuts=st.lists(st.integers(0, 60)))
def test_every_split_of_a_text_is_accounted_as_its_own_tokens(text: str, cuts: list[int]) -> None:
    """The same text cut into different segments tokenizes (and digests) per segment."""
    bounds = sorted({0, len(text), *(cut for cut in cuts if cut < len(text))})
    segments = [text[start:end] for start, end in itertools.pairwise(bounds)]
    chains = PromptChains(block_tokens=3, max_nodes=100, max_chars=1000)
    whole, whole_digests = chains.walk("k", [text])
    split, split_digests = chains.walk("k", segments)
    tokens = _tokens(segments)
    assert split.tokens == len(tokens) and whole.tokens == len(tokenize(text))
    assert split.seed == whole.seed  # the same text
    reference = _cache(3)
    reference.insert("k", tokens)
    probe = _cache(3)
    probe.lookup_and_insert_digests(split_digests, len(split_digests))
    assert list(probe._blocks) == list(reference._blocks)
    whole_cache = _cache(3)
    whole_cache.lookup_and_insert_digests(whole_digests, len(whole_digests))
    assert whole_cache.lookup("k", tokens) == reference.lookup("k", tokenize(text))


def test_prompts_that_share_a_prefix_share_its_blocks_and_differ_after_it() -> None:
    chains = PromptChains(block_tokens=4, max_nodes=100, max_chars=10_000)
    header = "shared header text " * 5
    first, first_digests = chains.walk("k", [header, "then one thing"])
    second, second_digests = chains.walk("k", [header, "then another thing"])
    shared = len(tokenize(header)) // 4
    assert first_digests[:shared] == second_digests[:shared]
    assert first_digests[shared:] != second_digests[shared:]
    assert first.seed != second.seed
    memo, uncached = _cache(4), _cache(4)
    memo.lookup_and_insert_digests(first_digests, len(first_digests))
    uncached.insert("k", _tokens([header, "then one thing"]))
    hit = memo.lookup_and_insert_digests(second_digests, len(second_digests))
    assert hit == uncached.lookup("k", _tokens([header, "then another thing"])) == shared * 4
    # Another cache key shares nothing.
    _, other = chains.walk("other", [header, "then one thing"])
    assert not set(other) & set(first_digests)


def test_the_memo_keeps_what_it_is_bounded_to() -> None:
    chains = PromptChains(block_tokens=4, max_nodes=3, max_chars=50)
    chains.walk("k", ["a" * 10, "b" * 10, "c" * 10])
    assert len(chains) == 3  # the last three of the root and the three segments
    chains.walk("k", ["d" * 40])
    assert chains.chars <= 50
    node, _ = chains.walk("k", ["e" * 51])  # too long to keep; still accounted
    assert node.tokens == len(tokenize("e" * 51)) and chains.chars <= 50


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        PromptChains(block_tokens=4, max_nodes=0, max_chars=1)
