"""Sampling maths, in one place: CFG, temperature, top-k, top-p, and drawing tokens.

Order (as in LlamaGen): CFG on fp32 logits, then temperature, then top-k, then top-p, then softmax.
Temperature 0 means greedy: the distribution is one-hot at the argmax, so every consumer (AR
sampling, acceptance rules) treats greedy as sampling from a degenerate distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lantern import checks, rng

# How scales below 1 are treated. LlamaGen guides only when cfg_scale > 1 and otherwise runs the
# conditional stream alone; ``mix`` applies ``uncond + (cond - uncond) * scale`` for every scale != 1.
CFG_BELOW_ONE = ("conditional", "mix")


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become a next-token distribution.

    ``top_k = 0`` and ``top_p = 1`` switch those filters off. Guidance, as in LlamaGen's ``generate``:
    it runs only when ``cfg_scale > 1``; ``cfg_scale <= 1`` samples the conditional stream alone
    (``cfg_below_one="mix"`` mixes the two streams for scales in [0, 1) instead). ``cfg_interval = -1``
    guides every token; ``n >= 0`` guides tokens ``0 .. n + 1`` (token 0 comes from the prefill, and
    decode step ``i`` makes token ``i + 1`` and stops guiding once ``i > n``).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    cfg_scale: float = 1.0
    cfg_interval: int = -1
    cfg_below_one: str = "conditional"

    def __post_init__(self):
        # Integral floats from the command line become ints (torch.topk needs an int).
        values = {
            "temperature": checks.real("temperature", self.temperature, 0, note="0 = greedy"),
            "top_k": checks.integer("top_k", self.top_k, 0, note="0 = off"),
            "top_p": checks.probability("top_p", self.top_p, zero=False, note="1 = off"),
            "cfg_scale": checks.real("cfg_scale", self.cfg_scale, 0, note="guidance when > 1"),
            "cfg_interval": checks.integer("cfg_interval", self.cfg_interval, -1, note="-1 = guide every token"),
            "cfg_below_one": checks.choice("cfg_below_one", self.cfg_below_one, CFG_BELOW_ONE),
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_cfg(self) -> bool:
        """Whether the batch carries an unconditional half."""
        if self.cfg_below_one == "mix":
            return self.cfg_scale != 1.0
        return self.cfg_scale > 1.0

    @property
    def last_guided_token(self) -> int | None:
        """Index of the last guided token (``None``: every token), LlamaGen's ``cfg_interval + 1``."""
        return None if self.cfg_interval < 0 else self.cfg_interval + 1

    def guidance_on(self, step: int) -> bool:
        """Whether token ``step`` (0 = the token sampled from the prefill) is guided."""
        last = self.last_guided_token
        return self.uses_cfg and (last is None or step <= last)


def combine_cfg(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """``[cond; uncond]`` logits (2B, ..., V) -> guided fp32 logits (B, ..., V)."""
    cond, uncond = (logits if logits.dtype == torch.float32 else logits.float()).chunk(2, dim=0)
    return uncond + (cond - uncond) * scale


def guided_logits(logits: torch.Tensor, config: SamplingConfig, step: int) -> torch.Tensor:
    """Apply CFG as configured for token ``step``: (2B, ..., V) with CFG, (B, ..., V) without -> (B, ..., V)."""
    if not config.uses_cfg:
        return logits.float()
    if config.guidance_on(step):
        return combine_cfg(logits, config.cfg_scale)
    return logits.float().chunk(2, dim=0)[0]


def guided_logits_at(logits: torch.Tensor, config: SamplingConfig, steps: torch.Tensor | None) -> torch.Tensor:
    """CFG per position: ``logits`` (2B, S, V) or (B, S, V) -> (B, S, V), with ``steps`` (B, S) the token
    index each position predicts (guided up to :attr:`SamplingConfig.last_guided_token`; unused, and may be
    None, when every token is guided). Tensor steps, so no host synchronisation.
    """
    if not config.uses_cfg:
        return logits.float()
    guided = combine_cfg(logits, config.cfg_scale)
    last = config.last_guided_token
    if last is None:
        return guided
    cond = logits.float().chunk(2, dim=0)[0]
    return torch.where((steps <= last)[..., None], guided, cond)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits (..., V) outside the top-k set and outside the top-p nucleus with -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already exceeds top_p (the best token always stays).
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) > top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Guided fp32 logits (..., V) -> the next-token distribution (..., V) after temperature/top-k/top-p.

    Greedy (temperature 0) gives the one-hot distribution at the argmax.
    """
    if config.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    if config.temperature != 1.0:  # x / 1.0 is x: the division is skipped at temperature 1 (the same values)
        logits = logits / config.temperature
    return filter_logits(logits, config.top_k, config.top_p).softmax(-1)


def verification_probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The distribution speculative decoding tests and drafts with, from guided logits (..., V).

    When sampling this is :func:`probabilities`. When greedy it is the temperature-1 softmax after
    top-k/top-p: its argmax is the greedy token, and relaxed greedy rules (greedy LANTERN) need the
    soft masses around it.
    """
    if config.greedy:
        return filter_logits(logits, config.top_k, config.top_p).softmax(-1)
    return probabilities(logits, config)


def exponentials(keys: torch.Tensor, step, stream: int, draws: int, vocab: int) -> torch.Tensor:
    """Exp(1) variables (B, draws, V) for ``draws`` independent draws, made in one pass."""
    return as_exponentials(rng.uniform(keys, step, stream, draws * vocab), draws, vocab)


def as_exponentials(uniforms: torch.Tensor, draws: int, vocab: int) -> torch.Tensor:
    """Exp(1) variables (B, draws, V) from ``draws * vocab`` uniforms (B, draws * V) per row (:func:`exponentials`)."""
    return -torch.log(uniforms).reshape(uniforms.shape[0], draws, vocab)


def race(probs: torch.Tensor, exponential: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """One token per row of ``probs`` (B, V): ``argmax(p / E)`` (distributed as ``p``), or the argmax when greedy."""
    if config.greedy:
        return probs.argmax(-1)
    return (probs / exponential).argmax(-1)


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws (...,) from laws ``probs`` (..., V) with ``uniforms`` (...,) in (0, 1); a
    zero-mass token is never returned (the argmax instead: float rounding can put ``u * total`` at the very end)."""
    cdf = probs.cumsum(-1)
    token = torch.searchsorted(cdf, (uniforms[..., None] * cdf[..., -1:]).contiguous(), right=True)
    token = token.clamp_max(probs.shape[-1] - 1)
    possible = probs.gather(-1, token) > 0
    return torch.where(possible, token, probs.argmax(-1, keepdim=True))[..., 0]


def sample(probs: torch.Tensor, keys: torch.Tensor, step, stream: int = rng.SAMPLE) -> torch.Tensor:
    """Draw one token per row of ``probs`` (B, V) with one counter-based uniform per row of ``keys`` (B,).

    Inverse CDF: the first token whose cumulative mass exceeds ``u * total``. One hash per row instead
    of one per vocabulary entry (the race of :func:`race`), so sampling costs about a softmax and a
    cumulative sum, as ``torch.multinomial`` in LlamaGen; still a pure function of (key, step), so
    batch-invariant, and no host sync. A token of zero mass is never drawn: when float rounding puts
    ``u * total`` at the very end (probability below 2**-24), the row takes its argmax instead.
    """
    return draw(probs, rng.uniform(keys, step, stream, 1).to(probs.dtype)[:, 0])  # (B,)


def next_token(logits: torch.Tensor, config: SamplingConfig, keys: torch.Tensor, step) -> torch.Tensor:
    """Guided logits (B, V) -> next tokens (B,): argmax when greedy, else a counter-based draw."""
    if config.greedy:
        return logits.argmax(-1)
    return sample(probabilities(logits, config), keys, step)
