"""What recorded requests would be billed with prompt caching: a plain pricer of the
requests an upstream received, for benchmarks (ctxd's own billing model is elsewhere).

The rule, the same for every run so that runs compare:

- A request's **cached** tokens: its longest common prefix (in tokens, in the provider's
  order: tools, system, messages) with any earlier request of the run, counted in blocks
  of ``block`` tokens from ``minimum`` on (OpenAI: 1,024, then 128 at a time); below
  ``minimum`` nothing is cached.
- Cached tokens are billed ``read`` (0.1x for both providers); the rest ``write``
  (Anthropic writes it to the cache at 1.25x; OpenAI bills it at 1x).
- A bill is in input-token units: one uncached, unwritten input token is 1.0. Output
  tokens are left out (the scripted model writes the same replies direct and proxied).

Import it: ``from tests.agents.pricing import ANTHROPIC, OPENAI, price``; change the
defaults in one place (``Prices``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Prices:
    write: float  # an input token not read from the cache
    read: float  # a cached input token
    minimum: int = 1024
    block: int = 128


ANTHROPIC = Prices(write=1.25, read=0.1)
OPENAI = Prices(write=1.0, read=0.1)


def prices_for(api: str) -> Prices:
    """The prices of an upstream API (``anthropic``; ``chat`` and ``responses`` are OpenAI's)."""
    return ANTHROPIC if api == "anthropic" else OPENAI


def common_prefix(a: Sequence[int], b: Sequence[int], chunk: int = 512) -> int:
    """The length of the longest common prefix of two token lists (compared a chunk at a
    time, so that long equal runs cost a slice comparison each)."""
    n = min(len(a), len(b))
    i = 0
    while i < n:
        j = min(n, i + chunk)
        if a[i:j] == b[i:j]:
            i = j
            continue
        while i < j and a[i] == b[i]:
            i += 1
        return i
    return n


def cached(prefix: int, prices: Prices) -> int:
    """The tokens a provider serves from its cache for a common prefix of ``prefix`` tokens."""
    if prefix < prices.minimum:
        return 0
    return prices.minimum + (prefix - prices.minimum) // prices.block * prices.block


@dataclass
class Billed:
    tokens: int
    cached: int
    cost: float

    @property
    def uncached(self) -> int:
        return self.tokens - self.cached


class Pricer:
    """Prices requests one after another, each against all the earlier ones."""

    def __init__(self, prices: Prices) -> None:
        self.prices = prices
        self.seen: list[Sequence[int]] = []

    def longest_prefix(self, tokens: Sequence[int]) -> int:
        return max((common_prefix(tokens, earlier) for earlier in self.seen), default=0)

    def add(self, tokens: Sequence[int]) -> Billed:
        hit = cached(self.longest_prefix(tokens), self.prices)
        self.seen.append(tokens)
        return Billed(len(tokens), hit, hit * self.prices.read + (len(tokens) - hit) * self.prices.write)


def price(requests: Sequence[Sequence[int]], prices: Prices) -> list[Billed]:
    """Every request's bill, in order."""
    pricer = Pricer(prices)
    return [pricer.add(tokens) for tokens in requests]
