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

Everything here is generic over the target's condition: a step reads condition embeddings, masks,
codes and the target's states from the feature shards of :mod:`lantern.training.drafter_features`,
so training runs the drafter and the target's frozen head only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lantern.models.drafter import Drafter
from lantern.models.kv_cache import NoCache
from lantern.models.llamagen.gpt import prefix_causal_mask
from lantern.training.shards import ShardStore

FEATURE_NAMES = ["hidden", "cond", "mask", "codes"]


def drafter_pass(target, drafter, cond_emb, cond_mask, tokens, noise: float = 0.0):
    """Teacher-forced drafter outputs and their targets on the scored entries.

    ``cond_emb`` (B, T, D) are condition embeddings, ``cond_mask`` (B, T) their mask, ``tokens``
    (B, N) the image tokens. The target runs without gradients. Returns ``(f_hat, f)``, both
    (B, N-1, D): the drafter's estimates at entries ``T-1 .. T+N-3`` and the target's states at
    positions ``T .. T+N-2`` (which predict image tokens ``1 .. N-1``).
    """
    with torch.no_grad():
        f = target.teacher_hidden(cond_emb, tokens, cond_mask)  # (B, T+N-1, D)
    return drafter_estimates(target, drafter, cond_emb, cond_mask, tokens, f, noise)


def drafter_estimates(target, drafter, cond_emb, cond_mask, tokens, f, noise: float = 0.0, draws=None):
    """:func:`drafter_pass` given the target's teacher-forced states ``f`` (B, T+N-1, D).

    ``noise`` is the width of the uniform noise added to the input features; ``draws`` (B, T+N-2, D)
    uniforms in [0, 1) give it (drawn here from the global generator when None).
    """
    batch, cond_len = cond_mask.shape
    num_tokens = tokens.shape[1]
    length = cond_len + num_tokens - 2  # drafter entries 0 .. T+N-3
    module = drafter.module if hasattr(drafter, "module") else drafter  # DistributedDataParallel wraps it
    with torch.no_grad():
        embeds = torch.cat(
            [module.condition_inputs(target, cond_emb), target.embed_tokens(tokens[:, : num_tokens - 1])], dim=1
        )  # (B, T+N-2, D)
        features = f[:, :length]  # (B, T+N-2, D)
        if noise:
            if draws is None:
                draws = torch.rand_like(features)
            features = features + (draws.to(features) - 0.5) * noise
    entries = torch.arange(length, device=tokens.device)
    mask = prefix_causal_mask(cond_mask[:, 1:], length)  # (B, 1, T+N-2, T+N-2)
    f_hat = drafter(embeds, features, entries, entries.expand(batch, length), mask, NoCache())  # (B, T+N-2, D)
    return f_hat[:, cond_len - 1 :], f[:, cond_len:]


def drafter_loss(target, f_hat: torch.Tensor, f: torch.Tensor, ce_weight: float = 0.1, top_k: int = 5):
    """EAGLE loss of drafter states ``f_hat`` against target states ``f`` (both (B, S, D)).

    Returns the scalar loss and detached logs: ``loss``, ``smooth_l1``, ``ce`` (cross entropy of the
    target head's distribution at ``f_hat`` against the one at ``f``), ``top1`` (share of entries where
    both distributions have the same argmax) and ``top{k}`` (the target's argmax is among the drafter's
    ``top_k`` most likely tokens).
    """
    smooth_l1 = F.smooth_l1_loss(f_hat.float(), f.float())
    with torch.no_grad():
        teacher = target.head(f)  # (B, S, V) fp32
        probs = teacher.softmax(-1)
    logits = target.head(f_hat)  # (B, S, V) fp32
    ce = -(probs * logits.log_softmax(-1)).sum(-1).mean()
    loss = smooth_l1 + ce_weight * ce
    with torch.no_grad():
        best = teacher.argmax(-1, keepdim=True)  # (B, S, 1)
        top1 = (logits.argmax(-1, keepdim=True) == best).float().mean()
        topk = (logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices == best).any(-1).float().mean()
    logs = {"loss": loss.detach(), "smooth_l1": smooth_l1.detach(), "ce": ce.detach(), "top1": top1}
    logs[f"top{top_k}"] = topk
    return loss, logs


def feature_batch(store: ShardStore, rows: torch.Tensor, device) -> tuple[torch.Tensor, ...]:
    """Condition embeddings (B, T, D), masks (B, T), codes (B, N) and states (B, T+N-1, D), fp32, of ``rows``."""
    batch = store.read(rows, FEATURE_NAMES)
    return (
        batch["cond"].to(device, torch.float32),
        batch["mask"].to(device),
        batch["codes"].to(device, torch.long),
        batch["hidden"].to(device, torch.float32),
    )


class FeatureObjective:
    """``step_fn`` for :class:`lantern.training.loop.Trainer`: the EAGLE loss of ``drafter`` on feature rows.

    Called with a global batch of positions (B,) into ``rows`` (the training rows of ``store``). Under
    torchrun each rank computes the loss of its contiguous share of the batch (``rank``, ``ranks``);
    ``drafter`` is then the DistributedDataParallel wrapper, which averages the gradients, so a step
    equals the single-process step on the whole batch up to reduction order. The feature noise of the
    whole batch is drawn on every rank from the global generator (checkpointed by the trainer), so the
    draws do not depend on the number of ranks. The target is frozen and only its head is used.
    """

    def __init__(
        self, target, drafter, store: ShardStore, rows: torch.Tensor, noise=0.2, ce_weight=0.1, rank=0, ranks=1
    ):
        self.target = target.eval().requires_grad_(False)
        self.drafter = drafter
        self.store = store
        self.rows = rows
        self.noise = float(noise)
        self.ce_weight = float(ce_weight)
        self.rank, self.ranks = int(rank), int(ranks)
        self.length = target.config.cls_token_num + target.config.num_image_tokens - 2
        self.dim = target.config.dim

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Loss and logs of this rank's share of the batch ``positions`` (B,)."""
        draws = torch.rand(positions.shape[0], self.length, self.dim) if self.noise else None  # (B, T+N-2, D)
        share = positions.shape[0] // self.ranks
        mine = slice(self.rank * share, (self.rank + 1) * share)
        device = self.target.input_embeddings().device
        cond_emb, mask, codes, f = feature_batch(self.store, self.rows[positions[mine]], device)
        f_hat, f = drafter_estimates(
            self.target,
            self.drafter,
            cond_emb,
            mask,
            codes,
            f,
            self.noise,
            None if draws is None else draws[mine].to(device),
        )
        return drafter_loss(self.target, f_hat, f, self.ce_weight)


@torch.no_grad()
def evaluate_features(
    target, drafter: Drafter, store: ShardStore, rows: torch.Tensor, batch_size=64, ce_weight=0.1, top_k=5
):
    """Held-out agreement of ``drafter`` with ``target`` on the feature ``rows`` of ``store`` (no noise).

    Returns the means over rows of ``top1``, ``top{k}``, ``loss``, ``smooth_l1`` and ``ce``, and ``rows``.
    """
    was_training = drafter.training
    drafter.eval()
    device = target.input_embeddings().device
    totals: dict[str, float] = {}
    for start in range(0, rows.numel(), batch_size):
        chunk = rows[start : start + batch_size]
        cond_emb, mask, codes, f = feature_batch(store, chunk, device)
        f_hat, f = drafter_estimates(target, drafter, cond_emb, mask, codes, f)
        _, logs = drafter_loss(target, f_hat, f, ce_weight, top_k)
        for key, value in logs.items():
            totals[key] = totals.get(key, 0.0) + float(value) * chunk.numel()
    drafter.train(was_training)
    count = max(1, rows.numel())
    return {**{key: value / count for key, value in totals.items()}, "rows": int(rows.numel())}
