"""Sampling maths, in one place: CFG, temperature, top-k, top-p, and drawing tokens.

Order (as in LlamaGen): CFG on fp32 logits, then temperature, then top-k, then top-p, then softmax.
Temperature 0 means greedy: the distribution is one-hot at the argmax, so every consumer (AR
sampling, acceptance rules) treats greedy as sampling from a degenerate distribution.

``entropy_temperature`` (Ma et al., NeurIPS 2025, arXiv 2510.09012; krennic999/ARsample ``sample``): a
temperature per position driven by the entropy ``H`` (nats) of the filtered law, ``T = temperature * (t0
exp(-H / alpha) + theta)``; as released, top-k and top-p then run first (at temperature 1), the entropy is
measured on what they keep, and the temperature divides the kept logits. It changes the target's law for every
decoder alike (AR too), so it is a sampling setting, recorded with the others.
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
    entropy_temperature: tuple[float, float, float] | None = None  # (t0, alpha, theta); None: off

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
        values["entropy_temperature"] = _entropy_temperature(self.entropy_temperature)
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


ENTROPY_TEMPERATURE = (2.5, 3.0, 0.6)  # ARsample's sample(): 2.5 * exp(-H / 3) + 0.6


def _entropy_temperature(value) -> tuple[float, float, float] | None:
    """``(t0, alpha, theta)`` as floats, t0 >= 0, alpha > 0, theta > 0 (so the temperature stays positive)."""
    if value is None:
        return None
    note = "(t0, alpha, theta): T = temperature * (t0 exp(-H / alpha) + theta); the release: [2.5, 3.0, 0.6]"
    items = list(value) if isinstance(value, (list, tuple)) or hasattr(value, "__len__") else None
    if items is None or isinstance(value, str) or len(items) != 3 or not all(checks.is_number(v) for v in items):
        raise checks.refuse("entropy_temperature", value, "null or three numbers [t0, alpha, theta]", note)
    t0 = checks.real("entropy_temperature[0]", items[0], 0, 1e3, note=note)
    alpha = checks.real("entropy_temperature[1]", items[1], 0, 1e3, low_open=True, note=note)
    theta = checks.real("entropy_temperature[2]", items[2], 0, 1e3, low_open=True, note=note)
    return (t0, alpha, theta)


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
    if config.entropy_temperature is not None:
        return entropy_tempered(logits, config)
    if config.temperature != 1.0:  # x / 1.0 is x: the division is skipped at temperature 1 (the same values)
        logits = logits / config.temperature
    return filter_logits(logits, config.top_k, config.top_p).softmax(-1)


def entropy_tempered(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The entropy-driven temperature's law (..., V): top-k/top-p at temperature 1, then ``T = temperature * (t0
    exp(-H / alpha) + theta)`` per position from the entropy ``H`` of what they keep (ARsample's ``sample``)."""
    t0, alpha, theta = config.entropy_temperature
    kept = filter_logits(logits, config.top_k, config.top_p)  # (..., V)
    law = kept.softmax(-1)
    entropy = -torch.special.xlogy(law, law).sum(-1, keepdim=True)  # (..., 1) nats
    temperature = config.temperature * (t0 * torch.exp(-entropy / alpha) + theta)
    return (kept / temperature).softmax(-1)


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
