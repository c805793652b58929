"""Training an EAGLE-style drafter against a frozen target GPT.

Alignment (see :mod:`lantern.models.drafter`): with ``T`` condition tokens and ``N`` image tokens
the target's teacher-forced final-norm states ``f`` cover positions ``0 .. T+N-2``. Drafter entry
``i = 0 .. T+N-3`` reads ``[e_{i+1}; f_i]`` (``e`` the target's input embeddings: condition
embeddings, then image-token embeddings) and estimates ``f_{i+1}``. Only entries ``i >= T-1`` are
scored: their targets ``f_T .. f_{T+N-2}`` predict image tokens ``1 .. N-1`` (token 0 always comes
from the target's own prefill). The earlier entries are context the drafter attends to.

Loss per scored entry, as in EAGLE: ``SmoothL1(f_hat, f) + ce_weight * CE`` where CE is the cross
entropy of the target head's distribution at ``f_hat`` against its distribution at ``f``. Training
features get uniform noise (``noise`` wide, centred) so the drafter tolerates its own errors.

Everything here is generic over the target's condition: ``values`` are whatever
:meth:`Transformer.embed_condition` takes (class ids (C,) or caption states (C, T, C')) and
``masks`` (C, T) their condition masks.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lantern.decoding.ar import ARDecoder
from lantern.errors import ConfigError
from lantern.files import save_torch_atomic
from lantern.models.condition import Condition
from lantern.models.drafter import Drafter
from lantern.models.kv_cache import NoCache
from lantern.models.llamagen.gpt import Transformer, prefix_causal_mask
from lantern.models.sampling import SamplingConfig
from lantern.rng import keys_tensor
from lantern.training.gpt import draw_conditions


def drafter_pass(
    target: Transformer,
    drafter: Drafter,
    cond_emb: torch.Tensor,
    cond_mask: torch.Tensor,
    tokens: torch.Tensor,
    noise: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced drafter outputs and their targets on the scored entries.

    ``cond_emb`` (B, T, D) are condition embeddings, ``cond_mask`` (B, T) their mask, ``tokens``
    (B, N) the image tokens. The target runs without gradients. Returns ``(f_hat, f)``, both
    (B, N-1, D): the drafter's estimates at entries ``T-1 .. T+N-3`` and the target's states at
    positions ``T .. T+N-2`` (which predict image tokens ``1 .. N-1``).
    """
    with torch.no_grad():
        f = target.teacher_hidden(cond_emb, tokens, cond_mask)  # (B, T+N-1, D)
    return drafter_estimates(target, drafter, cond_emb, cond_mask, tokens, f, noise)


def drafter_estimates(
    target: Transformer,
    drafter: Drafter,
    cond_emb: torch.Tensor,
    cond_mask: torch.Tensor,
    tokens: torch.Tensor,
    f: torch.Tensor,
    noise: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`drafter_pass` given the target's teacher-forced states ``f`` (B, T+N-1, D)."""
    batch, cond_len = cond_mask.shape
    num_tokens = tokens.shape[1]
    length = cond_len + num_tokens - 2  # drafter entries 0 .. T+N-3
    with torch.no_grad():
        embeds = torch.cat(
            [drafter.condition_inputs(target, cond_emb), target.embed_tokens(tokens[:, : num_tokens - 1])], dim=1
        )  # (B, T+N-2, D)
        features = f[:, :length]  # (B, T+N-2, D)
        if noise:
            features = features + (torch.rand_like(features) - 0.5) * noise
    entries = torch.arange(length, device=tokens.device)
    mask = prefix_causal_mask(cond_mask[:, 1:], length)  # (B, 1, T+N-2, T+N-2)
    f_hat = drafter(embeds, features, entries, entries.expand(batch, length), mask, NoCache())  # (B, T+N-2, D)
    return f_hat[:, cond_len - 1 :], f[:, cond_len:]


@torch.no_grad()
def teacher_states(
    target: Transformer,
    codes: torch.Tensor,
    caption_ids: torch.Tensor,
    states: torch.Tensor,
    masks: torch.Tensor,
    null: bool,
    batch_size: int = 250,
    progress: bool = False,
) -> torch.Tensor:
    """The target's teacher-forced final-norm states (M, T+N-1, D) of every sequence ``codes`` (M, N)
    under its one condition ``caption_ids`` (M,) (``null``: the null condition with that caption's mask),
    computed once so training steps need no target forward."""
    device = target.tok_embeddings.weight.device
    parts = []
    for start in tqdm(
        range(0, codes.shape[0], batch_size),
        desc="target states" + (" (null)" if null else ""),
        disable=not progress,
        dynamic_ncols=True,
        mininterval=1.0,
    ):
        ids = caption_ids[start : start + batch_size]  # (b,)
        values = target.null_condition(ids.shape[0]) if null else states[ids]
        cond_emb = target.embed_condition(values.to(device))  # (b, T, D)
        parts.append(
            target.teacher_hidden(cond_emb, codes[start : start + batch_size].to(device), masks[ids].to(device)).cpu()
        )
    return torch.cat(parts)


def drafter_loss(
    target: Transformer, f_hat: torch.Tensor, f: torch.Tensor, ce_weight: float = 0.1
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """EAGLE loss of drafter states ``f_hat`` against target states ``f`` (both (B, S, D)).

    Returns the scalar loss and detached logs: ``loss``, ``smooth_l1``, ``ce`` (cross entropy of the
    target head's distribution at ``f_hat`` against the one at ``f``) and ``top1`` (share of entries
    where both distributions have the same argmax).
    """
    smooth_l1 = F.smooth_l1_loss(f_hat.float(), f.float())
    with torch.no_grad():
        teacher = target.head(f)  # (B, S, V) fp32
        probs = teacher.softmax(-1)
    logits = target.head(f_hat)  # (B, S, V) fp32
    ce = -(probs * logits.log_softmax(-1)).sum(-1).mean()
    loss = smooth_l1 + ce_weight * ce
    top1 = (logits.argmax(-1) == teacher.argmax(-1)).float().mean()
    logs = {"loss": loss.detach(), "smooth_l1": smooth_l1.detach(), "ce": ce.detach(), "top1": top1}
    return loss, logs


class DrafterObjective:
    """``step_fn`` for :class:`lantern.training.loop.Trainer`: the EAGLE loss of ``drafter``.

    ``codes`` (M, N) are image token sequences; ``caption_ids`` (M, K) the ids of the K conditions
    each sequence may take (one is drawn per step); ``states`` (C, ...) and ``masks`` (C, T) the
    condition values and masks those ids index (caption states, or class ids for c2i targets).
    ``cond_dropout`` of the samples take the target's null condition (with their own mask), so the
    drafter also learns the unconditional stream CFG needs. ``noise`` is the width of the uniform
    noise added to the input features. The target is put in eval mode and frozen here. Random draws
    use the global torch generator, which the trainer checkpoints.

    ``cache_states`` (sequences with one condition each, K = 1): the target's states under each
    sequence's condition and under the null condition are computed once here (2 x M x (T+N-1) x D
    floats), so a step runs the drafter alone: the same loss, without a deep target's forward per step.
    """

    def __init__(
        self,
        target: Transformer,
        drafter: Drafter,
        codes: torch.Tensor,
        caption_ids: torch.Tensor,
        states: torch.Tensor,
        masks: torch.Tensor,
        cond_dropout: float = 0.1,
        noise: float = 0.2,
        ce_weight: float = 0.1,
        cache_states: bool = False,
        progress: bool = False,
    ):
        if caption_ids.dim() == 1:
            caption_ids = caption_ids[:, None]
        if codes.shape[0] != caption_ids.shape[0]:
            raise ConfigError(f"{codes.shape[0]} token sequences but {caption_ids.shape[0]} rows of condition ids")
        if cache_states and caption_ids.shape[1] != 1:
            raise ConfigError(
                f"cache_states needs one condition per sequence, got {caption_ids.shape[1]} (data=images: cache_states=false)"
            )
        drafter.check_target(target.config)
        self.target = target.eval().requires_grad_(False)
        self.drafter = drafter
        self.codes = codes
        self.caption_ids = caption_ids
        self.states = states
        self.masks = masks
        self.cond_dropout = cond_dropout
        self.noise = noise
        self.ce_weight = ce_weight
        self.cached = None
        if cache_states:
            self.cached = tuple(
                teacher_states(target, codes, caption_ids[:, 0], states, masks, null, progress=progress)
                for null in (False, True)
            )  # (M, T+N-1, D) each

    def __call__(self, indices: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Loss and logs of the samples ``indices`` (B,)."""
        target = self.target
        device = target.tok_embeddings.weight.device
        tokens = self.codes[indices].to(device)  # (B, N)
        values, mask, drop = draw_conditions(
            target, self.caption_ids, self.states, self.masks, indices, self.cond_dropout, device
        )
        with torch.no_grad():
            cond_emb = target.embed_condition(values)  # (B, T, D)
        if self.cached is None:
            f_hat, f = drafter_pass(target, self.drafter, cond_emb, mask, tokens, self.noise)
        else:
            conditional, unconditional = self.cached
            f = torch.where(drop.view(-1, 1, 1), unconditional[indices], conditional[indices]).to(
                device
            )  # (B, T+N-1, D)
            f_hat, f = drafter_estimates(target, self.drafter, cond_emb, mask, tokens, f, self.noise)
        return drafter_loss(target, f_hat, f, self.ce_weight)


@torch.no_grad()
def evaluate_drafter(
    target: Transformer,
    drafter: Drafter,
    codes: torch.Tensor,
    caption_ids: torch.Tensor,
    states: torch.Tensor,
    masks: torch.Tensor,
    batch_size: int = 250,
    ce_weight: float = 0.1,
) -> dict[str, float]:
    """Held-out agreement of ``drafter`` with ``target`` on ``codes`` (M, N) under conditions ``caption_ids`` (M,).

    No noise and no condition dropout. Returns the mean ``top1`` (drafter and target agree on the
    most likely next token), ``loss``, ``smooth_l1`` and ``ce`` over all scored entries, and
    ``num_samples``.
    """
    was_training = drafter.training
    drafter.eval()
    device = target.tok_embeddings.weight.device
    totals: dict[str, float] = {}
    for start in range(0, codes.shape[0], batch_size):
        tokens = codes[start : start + batch_size].to(device)  # (b, N)
        caption = caption_ids[start : start + batch_size]  # (b,)
        cond_emb = target.embed_condition(states[caption].to(device))  # (b, T, D)
        f_hat, f = drafter_pass(target, drafter, cond_emb, masks[caption].to(device), tokens)
        _, logs = drafter_loss(target, f_hat, f, ce_weight)
        for key, value in logs.items():
            totals[key] = totals.get(key, 0.0) + float(value) * tokens.shape[0]
    drafter.train(was_training)
    count = codes.shape[0]
    return {**{key: value / count for key, value in totals.items()}, "num_samples": count}


def generate_codes(
    target: Transformer,
    states: torch.Tensor,
    masks: torch.Tensor,
    caption_ids: torch.Tensor,
    sampling: SamplingConfig,
    seed: int,
    cache: str | Path,
    key: Mapping,
    batch_size: int = 250,
    progress: bool = True,
) -> torch.Tensor:
    """Token sequences (M, N) int64 sampled by ``target`` for self-distillation, cached in ``cache``.

    Sample ``i`` takes the condition ``states[caption_ids[i]]`` (mask ``masks[caption_ids[i]]``)
    and the RNG key ``keys_tensor(seed, [i])``, so it does not depend on the batch size. ``key``
    describes everything else the samples depend on (target weights, sampling, conditions); a cache
    with the same key is reused and extended, so an interrupted generation resumes where it stopped
    and a larger ``M`` only generates the new samples. The cache is rewritten after every batch.
    """
    cache = Path(cache)
    key = dict(key)
    total = caption_ids.shape[0]
    done = torch.empty(0, target.config.num_image_tokens, dtype=torch.int32)
    if cache.is_file():
        saved = torch.load(cache, map_location="cpu", weights_only=True)
        if saved.get("key") == key:
            done = saved["codes"]
    if done.shape[0] >= total:
        return done[:total].long()
    decoder = ARDecoder(sampling)
    device = target.tok_embeddings.weight.device
    parts = [done]
    with tqdm(
        total=total,
        initial=done.shape[0],
        desc="self-distillation samples",
        unit="sample",
        disable=not progress,
        dynamic_ncols=True,
        mininterval=1.0,
    ) as bar:
        for start in range(done.shape[0], total, batch_size):
            indices = range(start, min(start + batch_size, total))
            ids = caption_ids[start : indices.stop]  # (b,)
            condition = Condition(states[ids].to(device), masks[ids].to(device))
            result = decoder.generate(target, condition, keys_tensor(seed, indices, device))
            parts.append(result.codes.to("cpu", torch.int32).clone())  # (b, N)
            codes = torch.cat(parts)
            parts = [codes]
            save_torch_atomic(cache, {"key": key, "codes": codes})
            bar.update(len(indices))
    return parts[0][:total].long()
