"""Prefix caching: content hashes of full KV blocks, and the index from hash to cached block.

A full block's hash chains its parent's, so equal hashes mean equal *prefixes*, not just
equal blocks (vLLM v1's scheme):

    h_0 = H(ROOT, tokens[0:bs], extra keys)      extra keys: e.g. the request's cache salt
    h_i = H(h_{i-1}, tokens[i*bs:(i+1)*bs], ())

H is SHA-256 over the parent digest and the tokens' int64 bytes: a 256-bit digest makes a
collision (which would silently reuse another prompt's KV) out of reach, where Python's
64-bit `hash` of a tuple could be forced by a crafted prompt. Each block is hashed once,
when it first needs a hash (lookup at admission, or when it becomes full), so the cost is
O(1) per block and nothing per decode token.

`PrefixCache` is the index (mini-sglang style interface: the manager only talks to it).
Invariants of `HashPrefixCache`: one block per hash, one hash per block; a block leaves the
index only when it is handed out again (`evict`, lazily) or on `reset`.
"""
from __future__ import annotations

import abc
import hashlib
from array import array
from typing import Sequence

ROOT = b"inferlab-prefix-root"  # the parent of every first block


def hash_block(parent: bytes, token_ids: Sequence[int], extra: tuple = ()) -> bytes:
    h = hashlib.sha256(parent)
    h.update(array("q", token_ids).tobytes())
    if extra:
        h.update(repr(extra).encode())
    return h.digest()


def block_hashes(req, num_blocks: int, block_size: int) -> list[bytes]:
    """Extend `req.block_hashes` to the request's first `num_blocks` full blocks and return it.
    Only the first block carries the extra keys: the chain carries them to the rest."""
    hs = req.block_hashes
    for i in range(len(hs), num_blocks):
        extra = (req.cache_salt,) if i == 0 and req.cache_salt else ()
        hs.append(hash_block(hs[-1] if hs else ROOT, req.tokens(i * block_size, (i + 1) * block_size), extra))
    return hs


class PrefixCache(abc.ABC):
    """Which cached block holds which content."""

    @abc.abstractmethod
    def lookup(self, hashes: list[bytes]) -> list[int]:
        """Blocks of the longest run of leading `hashes` that are cached."""

    @abc.abstractmethod
    def insert(self, h: bytes, block: int) -> bool:
        """Index a block that just became full and computed; False if that content is already cached."""

    @abc.abstractmethod
    def evict(self, block: int) -> None:
        """The block is being handed out again: forget what it held."""

    @abc.abstractmethod
    def is_cached(self, block: int) -> bool: ...

    @abc.abstractmethod
    def reset(self) -> None: ...

    @property
    @abc.abstractmethod
    def num_cached(self) -> int: ...


class HashPrefixCache(PrefixCache):
    def __init__(self):
        self.by_hash: dict[bytes, int] = {}
        self.hash_of: dict[int, bytes] = {}

    def lookup(self, hashes):
        out = []
        for h in hashes:
            b = self.by_hash.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def insert(self, h, block):
        if h in self.by_hash or block in self.hash_of:
            return False  # computed twice concurrently: keep the first copy, the other stays private
        self.by_hash[h] = block
        self.hash_of[block] = h
        return True

    def evict(self, block):
        h = self.hash_of.pop(block, None)
        if h is not None:
            del self.by_hash[h]

    def is_cached(self, block):
        return block in self.hash_of

    def reset(self):
        self.by_hash.clear()
        self.hash_of.clear()

    @property
    def num_cached(self):
        return len(self.hash_of)


class NoPrefixCache(PrefixCache):
    """`enable_prefix_caching=False`: nothing is ever found or kept."""

    def lookup(self, hashes):
        return []

    def insert(self, h, block):
        return False

    def evict(self, block):
        pass

    def is_cached(self, block):
        return False

    def reset(self):
        pass

    @property
    def num_cached(self):
        return 0


PREFIX_CACHES: dict[str, type[PrefixCache]] = {"hash": HashPrefixCache, "none": NoPrefixCache}
