"""The simulator's prefix cache: hits counted in whole blocks of tokens.

A prompt hits `floor(L / block) * block` tokens, where `L` is the longest
common token prefix with any earlier prompt or earlier prompt+completion
stored under the same key. Blocks are stored by a chained digest (each
block's digest covers every token before it), so the dictionary of digests
is a trie of blocks and a lookup walks it in one pass over the prompt.

Entries expire `ttl` seconds after their last use (read through the injected
clock) and the least recently used are evicted beyond `max_blocks`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

import attrs


@attrs.frozen(kw_only=True)
class CacheStatistics:
    """Counters of a `PrefixCache`.

    Attributes:
        blocks: Blocks stored now.
        lookups: Prompts looked up.
        hit_tokens: Tokens served from the cache, summed over lookups.
        evictions: Blocks dropped for the size bound or by TTL.
    """

    blocks: int
    lookups: int
    hit_tokens: int
    evictions: int


class PrefixCache:
    """Block-granular prefix-cache accounting.

    Args:
        block_tokens: Tokens per block (DeepSeek: 64).
        ttl: Seconds an unused block lives; None keeps blocks until evicted.
        max_blocks: The most blocks kept (least recently used go first).
        clock: Seconds now, monotonic (e.g. `trio.current_time`).
    """

    def __init__(
        self,
        *,
        block_tokens: int,
        ttl: float | None,
        max_blocks: int,
        clock: Callable[[], float],
    ) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be positive, got {block_tokens}")
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be positive, got {max_blocks}")
        if ttl is not None and not ttl > 0:
            raise ValueError(f"ttl must be positive seconds or None, got {ttl!r}")
        self._block = block_tokens
        self._ttl = ttl
        self._max_blocks = max_blocks
        self._clock = clock
        self._blocks: OrderedDict[bytes, float] = OrderedDict()
        self._lookups = 0
        self._hit_tokens = 0
        self._evictions = 0

    def lookup(self, key: str, tokens: Sequence[str]) -> int:
        """The cached prefix of `tokens` under `key`, in tokens (a multiple of the block)."""
        now = self._clock()
        self._expire(now)
        self._lookups += 1
        hit = 0
        for digest in self._digests(key, tokens):
            if digest not in self._blocks:
                break
            self._blocks[digest] = now
            self._blocks.move_to_end(digest)
            hit += self._block
        self._hit_tokens += hit
        return hit

    def insert(self, key: str, tokens: Sequence[str]) -> None:
        """Store every whole block of `tokens` under `key`."""
        now = self._clock()
        self._expire(now)
        for digest in self._digests(key, tokens):
            self._blocks[digest] = now
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self._max_blocks:
            self._blocks.popitem(last=False)
            self._evictions += 1

    def lookup_and_insert(self, key: str, prompt: Sequence[str], completion: Sequence[str]) -> int:
        """`lookup(key, prompt)`, then `insert(key, prompt + completion)`, digesting once.

        The prompt's blocks are the first blocks of prompt + completion, so
        one pass of the digest chain serves both.
        """
        digests = list(self._digests(key, [*prompt, *completion]))
        return self.lookup_and_insert_digests(digests, len(prompt) // self._block)

    def lookup_and_insert_digests(self, digests: Sequence[bytes], prompt_blocks: int) -> int:
        """`lookup_and_insert` for a prompt + completion already digested (`block_digests`).

        Args:
            digests: The chained digests of every whole block of prompt +
                completion under the key, in order.
            prompt_blocks: How many of them are the prompt's (its whole blocks).
        """
        now = self._clock()
        self._expire(now)
        self._lookups += 1
        blocks = self._blocks
        hit = 0
        for digest in digests[:prompt_blocks]:
            if digest not in blocks:
                break
            hit += self._block
        for digest in digests:
            blocks[digest] = now
            blocks.move_to_end(digest)
        while len(blocks) > self._max_blocks:
            blocks.popitem(last=False)
            self._evictions += 1
        self._hit_tokens += hit
        return hit

    def flush(self) -> int:
        """Forget everything; returns how many blocks were dropped."""
        dropped = len(self._blocks)
        self._blocks.clear()
        return dropped

    def statistics(self) -> CacheStatistics:
        """Current counters."""
        return CacheStatistics(
            blocks=len(self._blocks),
            lookups=self._lookups,
            hit_tokens=self._hit_tokens,
            evictions=self._evictions,
        )

    def _expire(self, now: float) -> None:
        if self._ttl is None:
            return
        # Ordered by last use, so the expired ones are at the front.
        while self._blocks:
            digest, used = next(iter(self._blocks.items()))
            if now - used < self._ttl:
                break
            del self._blocks[digest]
            self._evictions += 1

    def _digests(self, key: str, tokens: Sequence[str]) -> Iterator[bytes]:
        digest = key_digest(key)
        for start in range(0, len(tokens) - self._block + 1, self._block):
            block = tokens[start : start + self._block]
            digest = block_digest(digest, array("Q", map(len, block)).tobytes(), "".join(block))
            yield digest


def key_digest(key: str) -> bytes:
    """The digest a chain of blocks under `key` starts from."""
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


def block_digest(previous: bytes, lengths: bytes, text: str) -> bytes:
    """The chained digest of one block after the digest `previous`.

    Args:
        previous: The digest of the blocks before it (`key_digest` for the first).
        lengths: The block's token lengths, as the bytes of an `array("Q")`:
            different splits of the same text differ.
        text: The block's text (its tokens joined).
    """
    h = hashlib.blake2b(previous, digest_size=16)
    h.update(lengths)
    h.update(text.encode())
    return h.digest()
