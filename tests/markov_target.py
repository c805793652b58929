"""A target whose next-token law is a Markov chain: the law after a token is the row of a fixed transition matrix.

Every decoder runs on it through the Target protocol (its outputs read only the token fed at each position, so the
cache and the mask play no part), and the target's law of every token is known exactly: ``transition[x_{t-1}]``
(``start`` for token 0). Monte Carlo tests of whole decodes use it (tests/test_sjd_pac.py, tests/test_audit.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lantern.models.condition import Condition
from lantern.models.kv_cache import KVCache
from lantern.models.target import EmbeddingsTarget, GridShape
from lantern.rng import keys_tensor


@dataclass(frozen=True)
class MarkovConfig(GridShape):
    vocab_size: int
    grid_size: int
    cls_token_num: int = 1


class MarkovTarget(EmbeddingsTarget, torch.nn.Module):
    """Embeddings are one-hot (V + 1 channels, the last the condition's); the head maps channel ``i`` to
    ``log transition[i]`` (``log start`` for the condition)."""

    def __init__(self, transition: torch.Tensor, start: torch.Tensor, grid: int):
        super().__init__()
        vocab = transition.shape[0]
        self.config = MarkovConfig(vocab, grid)
        self.register_buffer("table", torch.cat([transition, start[None]]).log())  # (V + 1, V)

    def embed_condition(self, condition: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(torch.full_like(condition, self.config.vocab_size)[:, None])  # (B, 1, V + 1)

    def null_condition(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, dtype=torch.long)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(tokens, self.config.vocab_size + 1).float()

    def input_embeddings(self) -> torch.Tensor:
        return self.table

    def forward_embeddings(self, x, positions, slots, mask, cache, taps=()):
        return x

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.table

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        return KVCache.allocate(1, batch, 1, max_len or self.config.max_seq_len, 1, torch.float32, "cpu")


def markov_chain(vocab: int = 4, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A random transition matrix (V, V) with uneven rows and a start law (V,)."""
    generator = torch.Generator().manual_seed(seed)
    transition = torch.rand(vocab, vocab, generator=generator).pow(2) + 0.01
    start = torch.rand(vocab, generator=generator) + 0.1
    return transition / transition.sum(1, keepdim=True), start / start.sum()


def decode(decoder, model: MarkovTarget, rows: int, seed: int = 0) -> torch.Tensor:
    """Codes (rows, N) of ``rows`` images, keys from (seed, index)."""
    condition = Condition(torch.zeros(rows, dtype=torch.long), torch.ones(rows, 1, dtype=torch.bool))
    return decoder.generate(model, condition, keys_tensor(seed, range(rows))).codes


def transition_tv(codes: torch.Tensor, transition: torch.Tensor) -> tuple[float, float]:
    """(chi-square p, TV) of the tokens' law given the token before, pooled over positions 1.. and weighted by how
    often each previous token occurs, against ``transition``: a lower bound on the mean TV per token of a law that
    may read more than the previous token. The p-value sums the chi-square statistics of every row."""
    from scipy.stats import chi2

    vocab = transition.shape[0]
    pairs = codes[:, :-1] * vocab + codes[:, 1:]
    counts = torch.bincount(pairs.flatten(), minlength=vocab * vocab).view(vocab, vocab).double()
    totals = counts.sum(1, keepdim=True)
    expected = totals * transition.double()
    statistic = float(((counts - expected) ** 2 / expected.clamp_min(1e-12)).sum())
    tv = float(0.5 * (counts - expected).abs().sum() / totals.sum())
    return float(chi2.sf(statistic, vocab * (vocab - 1))), tv
