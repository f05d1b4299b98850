"""Prompt accounting memoized per segment: token counts, cache-block digests, the prompt digest.

A prompt is rendered as segments: the tool header, then each message
(`tokens.tools_text`, `tokens.message_text`), each tokenized on its own. So
the accounting state after a segment (the tokens so far, the digest chain of
their whole blocks, the tokens after the last whole block, the SHA-256 of
the text so far) depends only on the state before it and on the segment's
text. `PromptChains` keeps these states (`ChainNode`) in an LRU keyed by
(the node before, the segment's text), bounded both in nodes and in the
characters of the texts it keeps: requests that share a prefix (the same
tool header and system prompt in every session; a session's previous
prompt and the reply it replays) tokenize and digest only what is new.

A node's figures are exactly those of tokenizing the whole prompt and
digesting its blocks from the start (`render_prompt`, `PrefixCache`'s
digest chain): the memo changes the cost, never the answer. An evicted
node is rebuilt the same way when next needed (under a new id, so nothing
keyed by the old one is found again).
"""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections import OrderedDict
from collections.abc import Iterable

import attrs

from actors.providers.simulator.cache import block_digest, key_digest
from actors.providers.simulator.tokens import tokenize


@attrs.frozen(kw_only=True, eq=False)
class ChainNode:
    """The accounting state of a prompt after its segments so far.

    Attributes:
        id: The node's id, unique in its `PromptChains` and never reused.
        tokens: The tokens so far.
        digest: The chained digest of the whole blocks so far (the key's
            digest before the first).
        blocks: The digests of the whole blocks this node's segment
            completed, in order.
        rest_text: The text of the tokens after the last whole block.
        rest_lengths: Their lengths, as the bytes of an `array("Q")`.
        text_hash: The SHA-256 state of the text so far; never updated in
            place (`seed` reads it, `PromptChains` copies it).
    """

    id: int
    tokens: int
    digest: bytes
    blocks: tuple[bytes, ...]
    rest_text: str
    rest_lengths: bytes
    text_hash: hashlib._Hash

    @property
    def seed(self) -> bytes:
        """The SHA-256 digest of the prompt's text so far (its tokens joined)."""
        return self.text_hash.digest()


class PromptChains:
    """A bounded LRU of `ChainNode`s, keyed by the node before and the segment's text.

    Args:
        block_tokens: Tokens per cache block (the `PrefixCache`'s).
        max_nodes: The most nodes kept; the least recently used go first.
        max_chars: The most characters of segment text kept as keys, summed
            over the nodes; the least recently used go first (a segment
            longer than this alone is accounted but not kept).
    """

    def __init__(self, *, block_tokens: int, max_nodes: int, max_chars: int) -> None:
        if block_tokens < 1 or max_nodes < 1 or max_chars < 1:
            raise ValueError(
                "block_tokens, max_nodes and max_chars must be positive, got "
                f"{block_tokens}, {max_nodes}, {max_chars}"
            )
        self._block = block_tokens
        self._max_nodes = max_nodes
        self._max_chars = max_chars
        self._nodes: OrderedDict[tuple[int, str], ChainNode] = OrderedDict()
        self._chars = 0
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        """The nodes kept now."""
        return len(self._nodes)

    @property
    def chars(self) -> int:
        """The characters of segment text (and cache keys) kept now."""
        return self._chars

    def walk(self, key: str, texts: Iterable[str]) -> tuple[ChainNode, list[bytes]]:
        """The node after the segments `texts` under cache key `key`, and every block digest.

        Returns:
            The last node and the digests of all the prompt's whole blocks,
            in order (`node.tokens // block_tokens` of them).
        """
        node = self._lookup(0, key)
        if node is None:
            root = ChainNode(
                id=next(self._ids),
                tokens=0,
                digest=key_digest(key),
                blocks=(),
                rest_text="",
                rest_lengths=b"",
                text_hash=hashlib.sha256(),
            )
            node = self._keep(0, key, root)
        digests: list[bytes] = []
        for text in texts:
            node = self.extend(node, text)
            digests += node.blocks
        return node, digests

    def extend(self, node: ChainNode, text: str) -> ChainNode:
        """The node after the segment `text` follows `node`."""
        found = self._lookup(node.id, text)
        if found is not None:
            return found
        return self._keep(node.id, text, self._build(node, text))

    def _lookup(self, parent: int, text: str) -> ChainNode | None:
        slot = (parent, text)
        found = self._nodes.get(slot)
        if found is not None:
            self._nodes.move_to_end(slot)
        return found

    def _keep(self, parent: int, text: str, node: ChainNode) -> ChainNode:
        if len(text) > self._max_chars:
            return node
        self._nodes[(parent, text)] = node
        self._chars += len(text)
        while len(self._nodes) > self._max_nodes or self._chars > self._max_chars:
            (_, dropped), _ = self._nodes.popitem(last=False)
            self._chars -= len(dropped)
        return node

    def _build(self, parent: ChainNode, text: str) -> ChainNode:
        """Tokenize `text` and digest the blocks it completes after `parent`."""
        lengths = array("Q")
        lengths.frombytes(parent.rest_lengths)
        new_tokens = tokenize(text)
        lengths.extend(map(len, new_tokens))
        full = parent.rest_text + text
        digest = parent.digest
        blocks: list[bytes] = []
        offset = 0
        whole = len(lengths) // self._block * self._block
        for start in range(0, whole, self._block):
            block = lengths[start : start + self._block]
            size = sum(block)
            digest = block_digest(digest, block.tobytes(), full[offset : offset + size])
            blocks.append(digest)
            offset += size
        text_hash = parent.text_hash.copy()
        text_hash.update(text.encode())
        return ChainNode(
            id=next(self._ids),
            tokens=parent.tokens + len(new_tokens),
            digest=digest,
            blocks=tuple(blocks),
            rest_text=full[offset:],
            rest_lengths=lengths[whole:].tobytes(),
            text_hash=text_hash,
        )
