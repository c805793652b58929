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
from lantern.models.target import prefix_causal_mask
from lantern.training.shards import ShardStore

FEATURE_NAMES = ["hidden", "cond", "mask", "codes"]


def drafter_estimates(target, drafter, cond_emb, cond_mask, tokens, f, noise: float = 0.0, draws=None, taps=None):
    """Teacher-forced drafter outputs and their targets on the scored entries, given the condition embeddings
    ``cond_emb`` (B, T, D), their mask ``cond_mask`` (B, T), the image tokens ``tokens`` (B, N) and the target's
    teacher-forced states ``f`` (B, T+N-1, D). Returns ``(f_hat, f)``, both (B, N-1, D): the drafter's estimates
    at entries ``T-1 .. T+N-3`` and the target's states at positions ``T .. T+N-2``.

    ``noise`` is the width of the uniform noise added to the target features the drafter reads; ``draws``
    (B, T+N-2, F) uniforms in [0, 1) give it (drawn here from the global generator when None). ``taps``
    (B, T+N-1, F): the target's tapped layer states, for a drafter that fuses them (EAGLE-3 style).
    """
    return unrolled_estimates(target, drafter, cond_emb, cond_mask, tokens, f, 1, noise, draws, taps)[0]


def unrolled_mask(cond_mask: torch.Tensor, length: int, steps: int) -> torch.Tensor:
    """Attention mask (B, 1, K*L, K*L) of a training-time test over ``steps`` = K unrolled drafts.

    Block ``k`` (0-based) holds the drafter's ``k``-th pass over the ``L`` entries; entry ``i`` of block
    ``k`` reads its own estimate from block ``k - 1`` at entry ``i - 1``, as a node at draft depth ``k``
    does while decoding. It sees what such a node sees: entries up to ``i - k`` from block 0 (computed on
    the target's features: the accepted prefix) and, for ``j = 1 .. k``, entry ``i - k + j`` of block ``j``
    (its draft ancestors). Entry ``i`` of block ``k`` is a real draft only when ``i - k >= T - 1`` (the
    chain starts at or after the entry that reads image token 0); other rows repeat block 0's row, so their
    outputs equal block 0's and are not scored. Block 0 is the teacher-forced mask.
    """
    batch, cond_len = cond_mask.shape
    base = prefix_causal_mask(cond_mask[:, 1:], length)  # (B, 1, L, L)
    device = cond_mask.device
    full = torch.zeros(batch, 1, steps * length, steps * length, dtype=torch.bool, device=device)
    full[..., :length, :length] = base
    entry = torch.arange(length, device=device)
    real_keys = base[:, :, -1:, :]  # (B, 1, 1, L): the last row sees every real column
    for k in range(1, steps):
        rows = slice(k * length, (k + 1) * length)
        drafted = entry >= cond_len - 1 + k  # (L,)
        prefix = (entry[None, :] <= entry[:, None] - k) & real_keys  # (B, 1, L, L)
        full[..., rows, :length] = torch.where(drafted[:, None], prefix, base)
        for j in range(1, k + 1):
            ancestor = (entry[None, :] == entry[:, None] - k + j) & drafted[:, None]  # (L, L)
            full[..., rows, j * length : (j + 1) * length] = ancestor
    return full


def unrolled_estimates(
    target, drafter, cond_emb, cond_mask, tokens, f, steps: int = 1, noise: float = 0.0, draws=None, taps=None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A training-time test (EAGLE-3): the drafter unrolled on its own estimates for ``steps`` passes.

    Pass 0 reads the target's features (its final-norm states ``f``, or the fused ``taps``); pass ``k``
    reads, at entry ``i``, pass ``k - 1``'s output at entry ``i - 1`` (see :func:`unrolled_mask`). Pass
    ``k`` runs over the concatenation of passes ``0 .. k`` under that mask (the earlier passes are
    recomputed, identically). Returns, per pass, the estimates at its scored entries and their targets:
    pass ``k`` scores entries ``T-1+k .. T+N-3`` against ``f`` at positions ``T+k .. T+N-2``.
    """
    batch, cond_len = cond_mask.shape
    num_tokens = tokens.shape[1]
    length = cond_len + num_tokens - 2  # drafter entries 0 .. T+N-3
    module = _unwrap(drafter)
    with torch.no_grad():
        embeds = torch.cat(
            [module.condition_inputs(target, cond_emb), target.embed_tokens(tokens[:, : num_tokens - 1])], dim=1
        )  # (B, T+N-2, D)
        source = (f if taps is None else taps)[:, :length]  # (B, T+N-2, F)
        if noise:
            if draws is None:
                draws = torch.rand_like(source)
            source = source + (draws.to(source) - 0.5) * noise
    first = source if taps is None else module.target_features(source)  # (B, T+N-2, D)
    entries = torch.arange(length, device=tokens.device)
    mask = unrolled_mask(cond_mask, length, steps)  # (B, 1, K*L, K*L)
    features, outputs = [first], []
    for k in range(steps):
        width = (k + 1) * length
        out = drafter(
            embeds.repeat(1, k + 1, 1),
            torch.cat(features, dim=1),
            entries.repeat(k + 1),
            entries.repeat(k + 1).expand(batch, width),
            mask[..., :width, :width],
            NoCache(),
        )[:, k * length :]  # (B, L, D): pass k
        outputs.append(out)
        drafted = (entries >= cond_len - 1 + k + 1)[None, :, None]  # entries of pass k + 1 that read an estimate
        features.append(torch.where(drafted, torch.cat([out[:, :1], out[:, :-1]], dim=1), first))
    return [(out[:, cond_len - 1 + k :], f[:, cond_len + k :]) for k, out in enumerate(outputs)]


def drafter_loss(
    target, f_hat: torch.Tensor, f: torch.Tensor, ce_weight: float = 0.1, top_k: int = 5, feature_weight: float = 1.0
):
    """EAGLE loss of drafter states ``f_hat`` against target states ``f`` (both (B, S, D)):
    ``feature_weight * SmoothL1 + ce_weight * CE`` (EAGLE-2: 1 and 0.1; EAGLE-3 drops the regression: 0 and 1).

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
    loss = feature_weight * smooth_l1 + ce_weight * ce
    with torch.no_grad():
        best = teacher.argmax(-1, keepdim=True)  # (B, S, 1)
        top1 = (logits.argmax(-1, keepdim=True) == best).float().mean()
        topk = (logits.topk(min(top_k, logits.shape[-1]), dim=-1).indices == best).any(-1).float().mean()
    logs = {"loss": loss.detach(), "smooth_l1": smooth_l1.detach(), "ce": ce.detach(), "top1": top1}
    logs[f"top{top_k}"] = topk
    return loss, logs


def feature_batch(store: ShardStore, rows: torch.Tensor, device, taps: bool = False) -> dict[str, torch.Tensor]:
    """Condition embeddings ``cond`` (B, T, D), masks ``mask`` (B, T), ``codes`` (B, N), states ``hidden``
    (B, T+N-1, D) and, with ``taps``, the tapped layer states ``taps`` (B, T+N-1, F) of ``rows``, floats in fp32."""
    batch = store.read(rows, FEATURE_NAMES + (["taps"] if taps else []))
    return {
        name: value.to(device, torch.long if name == "codes" else (None if name == "mask" else torch.float32))
        for name, value in batch.items()
    }


def _unwrap(drafter):
    """The drafter a DistributedDataParallel wrapper holds (or the drafter itself)."""
    return drafter.module if hasattr(drafter, "module") else drafter


def _uses_taps(drafter) -> bool:
    return bool(getattr(getattr(_unwrap(drafter), "config", None), "taps", ()))


class FeatureObjective:
    """``step_fn`` for :class:`lantern.training.loop.Trainer`: the EAGLE loss of ``drafter`` on feature rows.

    Called with a global batch of positions (B,) into ``rows`` (the training rows of ``store``). Under
    torchrun each rank computes the loss of its contiguous share of the batch (``rank``, ``ranks``);
    ``drafter`` is then the DistributedDataParallel wrapper, which averages the gradients, so a step
    equals the single-process step on the whole batch up to reduction order. The feature noise of the
    whole batch is drawn on every rank from the global generator (checkpointed by the trainer), so the
    draws do not depend on the number of ranks. The target is frozen and only its head is used.

    ``steps`` > 1 is EAGLE-3's training-time test (:func:`unrolled_estimates`): the loss is the mean over
    the unrolled passes; a drafter with taps reads the target's tapped layers (the ``taps`` shard tensor).
    """

    def __init__(
        self,
        target,
        drafter,
        store: ShardStore,
        rows: torch.Tensor,
        noise=0.2,
        ce_weight=0.1,
        rank=0,
        ranks=1,
        steps: int = 1,
        feature_weight: float = 1.0,
    ):
        self.target = target.eval().requires_grad_(False)
        self.drafter = drafter
        self.store = store
        self.rows = rows
        self.noise = float(noise)
        self.ce_weight = float(ce_weight)
        self.feature_weight = float(feature_weight)
        self.steps = int(steps)
        self.rank, self.ranks = int(rank), int(ranks)
        self.taps = _uses_taps(drafter)
        self.length = target.config.cls_token_num + target.config.num_image_tokens - 2

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Loss and logs of this rank's share of the batch ``positions`` (B,)."""
        share = positions.shape[0] // self.ranks
        mine = slice(self.rank * share, (self.rank + 1) * share)
        device = self.target.input_embeddings().device
        batch = feature_batch(self.store, self.rows[positions[mine]], device, self.taps)
        width = batch["taps" if self.taps else "hidden"].shape[-1]
        # the whole batch's noise on every rank, whatever its share: the draws do not depend on the ranks
        draws = torch.rand(positions.shape[0], self.length, width)[mine].to(device) if self.noise else None
        passes = unrolled_estimates(
            self.target,
            self.drafter,
            batch["cond"],
            batch["mask"],
            batch["codes"],
            batch["hidden"],
            self.steps,
            self.noise,
            draws,
            batch.get("taps"),
        )
        total, logs = 0.0, {}
        for k, (f_hat, f) in enumerate(passes):
            loss, step_logs = drafter_loss(self.target, f_hat, f, self.ce_weight, feature_weight=self.feature_weight)
            total = total + loss / len(passes)
            if k == 0:
                logs = dict(step_logs)
            else:
                logs[f"top1_pass{k}"] = step_logs["top1"]
        logs["loss"] = total.detach()
        return total, logs


@torch.no_grad()
def evaluate_features(
    target,
    drafter: Drafter,
    store: ShardStore,
    rows: torch.Tensor,
    batch_size=64,
    ce_weight=0.1,
    top_k=5,
    feature_weight=1.0,
):
    """Held-out agreement of ``drafter`` with ``target`` on the feature ``rows`` of ``store`` (no noise,
    teacher-forced: every entry reads the target's features).

    Returns the means over rows of ``top1``, ``top{k}``, ``loss``, ``smooth_l1`` and ``ce``, and ``rows``.
    """
    was_training = drafter.training
    drafter.eval()
    device = target.input_embeddings().device
    taps = _uses_taps(drafter)
    totals: dict[str, float] = {}
    for start in range(0, rows.numel(), batch_size):
        chunk = rows[start : start + batch_size]
        batch = feature_batch(store, chunk, device, taps)
        f_hat, f = drafter_estimates(
            target, drafter, batch["cond"], batch["mask"], batch["codes"], batch["hidden"], taps=batch.get("taps")
        )
        _, logs = drafter_loss(target, f_hat, f, ce_weight, top_k, feature_weight)
        for key, value in logs.items():
            totals[key] = totals.get(key, 0.0) + float(value) * chunk.numel()
    drafter.train(was_training)
    count = max(1, rows.numel())
    return {**{key: value / count for key, value in totals.items()}, "rows": int(rows.numel())}
