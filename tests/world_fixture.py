"""The shipped world (GPT, drafter, neighbours) composed from its Hydra config, for tests on real
distributions; plus the randomised probability-integral transform used to test losslessness."""

from __future__ import annotations

import torch
from helpers import REPO
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from scipy.stats import kstest

from lantern.decoding.batch import guided_inputs
from lantern.models.sampling import SamplingConfig, guided_logits_at, probabilities
from lantern.rng import keys_tensor

WORLD_SAMPLING = SamplingConfig(temperature=1.0, cfg_scale=3.0)  # the world's recommended sampling


class World:
    """The world's bundle, drafter and codebook neighbours (cached under ``cache_dir``)."""

    def __init__(self, cache_dir):
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
            cfg = compose("config", overrides=["model=fashion_t2i", f"model.neighbours.cache_dir={cache_dir}"])
        self.bundle = instantiate(cfg.model.bundle)
        self.drafter = instantiate(cfg.model.drafter)
        self.neighbours = instantiate(cfg.model.neighbours)
        self.prompts = list(instantiate(cfg.model.default_prompts))

    def condition(self, count: int, offset: int = 0):
        items = [self.prompts[(offset + i) % len(self.prompts)] for i in range(count)]
        return self.bundle.conditioner.encode(items)

    def decode(self, decoder, count: int, seed: int = 0, batch: int = 40):
        """Codes (count, N) for prompts 0..count-1 (cycled), keys from (seed, index)."""
        codes = []
        for start in range(0, count, batch):
            stop = min(count, start + batch)
            cond = self.condition(stop - start, start)
            codes.append(decoder.generate(self.bundle.target, cond, keys_tensor(seed, range(start, stop))).codes)
        return torch.cat(codes)

    @torch.inference_mode()
    def teacher_probabilities(self, codes: torch.Tensor, sampling: SamplingConfig = WORLD_SAMPLING) -> torch.Tensor:
        """The target's next-token distribution at every image position given the codes: (B, N, V)."""
        model = self.bundle.target
        cond = self.condition(codes.shape[0])
        emb, mask = guided_inputs(model, cond, sampling)
        groups = emb.shape[0] // codes.shape[0]
        hidden = model.forward_teacher(emb, codes.repeat(groups, 1), mask)  # (rows, N, D)
        steps = torch.arange(codes.shape[1]).expand(codes.shape[0], -1)
        return probabilities(guided_logits_at(model.head(hidden), sampling, steps), sampling)


def randomised_pit(probs: torch.Tensor, codes: torch.Tensor, seed: int = 12345) -> torch.Tensor:
    """For each token, F(x-) + U p(x) under its teacher-forced law, tokens ordered by descending
    probability: iid uniform on (0, 1) exactly when the tokens were drawn from the target's joint law."""
    order = probs.argsort(dim=-1, descending=True, stable=True)  # (B, N, V)
    sorted_probs = probs.gather(-1, order)
    rank = order.argsort(dim=-1).gather(-1, codes[..., None])[..., 0]  # (B, N) position of the token
    before = (sorted_probs.cumsum(-1) - sorted_probs).gather(-1, rank[..., None])[..., 0].double()
    mass = probs.gather(-1, codes[..., None])[..., 0].double()
    uniform = torch.rand(codes.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (before + uniform * mass).clamp(0.0, 1.0)


def world_ks_pvalue(world: World, decoder, images: int) -> float:
    """KS p-value of the randomised PIT of ``images`` of ``decoder``'s codes against uniform (token 0 left out)."""
    codes = world.decode(decoder, images)
    values = randomised_pit(world.teacher_probabilities(codes), codes)[:, 1:].flatten()
    return float(kstest(values.numpy(), "uniform").pvalue)
