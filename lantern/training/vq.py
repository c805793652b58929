"""Training objective and evaluation of a VQ tokenizer.

Objective per batch: ``l1 * |x - x_hat| + mse * (x - x_hat)^2 + codebook * ||sg[z] - e||^2
+ commitment * beta * ||z - sg[e]||^2`` (beta = 0.25 inside :meth:`VQModel.quantize_latents`).

Codebook usage is the property the embedded world cares about most: many near-neighbour codes
make next-token distributions flat, as with the real LlamaGen tokenizer. Codes that no batch has
chosen for ``restart_every`` steps are re-seeded from recent encoder outputs, picked k-means++
style (probability proportional to the squared distance to the nearest live or already re-seeded
code). Latents that are already quantised exactly, such as the flat background of Fashion-MNIST,
are thus never picked, and the new codes spread over the poorly covered regions of the latent
space.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from lantern import checks
from lantern.errors import ConfigError
from lantern.models.vq_model import VQModel


def image_batch(dataset: Sequence, indices: torch.Tensor) -> torch.Tensor:
    """Stack the images of ``dataset[i]`` (items ``(image, ...)`` or bare images) -> (B, C, H, W)."""
    images = []
    for i in indices.tolist():
        item = dataset[i]
        images.append(item[0] if isinstance(item, tuple) else item)
    return torch.stack(images)


class VQObjective:
    """The VQ training step for :class:`lantern.training.Trainer`, with dead-code restarts.

    Called on a batch of images (B, C, H, W) in [-1, 1]; returns ``(loss, logs)``. Its
    ``after_step`` performs the restarts and its ``state_dict`` (usage counts and the buffer of
    recent latents) is checkpointed by the trainer, so resumed runs restart the same codes.

    Arguments:
        model: the tokenizer being trained.
        l1_weight, mse_weight, codebook_weight, commitment_weight: loss weights.
        restart_every: re-seed codes unused for this many steps (0 disables restarts).
        restart_until: no restarts after this step (None: until the end), so the decoder can
            settle on the final codebook.
        restart_min_count: a code chosen fewer times than this since the last restart is dead.
        buffer_size: number of recent (normalised) encoder outputs kept as restart candidates.
    """

    def __init__(
        self,
        model: VQModel,
        *,
        l1_weight: float = 1.0,
        mse_weight: float = 1.0,
        codebook_weight: float = 1.0,
        commitment_weight: float = 1.0,
        restart_every: int = 100,
        restart_until: int | None = None,
        restart_min_count: int = 1,
        buffer_size: int = 32768,
    ) -> None:
        """Set the weights and allocate the usage counters and latent buffer (on the model's device)."""
        restart_every = checks.integer("restart.every", restart_every, 0)
        restart_min_count = checks.integer("restart.min_count", restart_min_count, 1)
        buffer_size = checks.integer("restart.buffer_size", buffer_size, 1)
        self.model = model
        self.weights = {
            "l1": float(l1_weight),
            "mse": float(mse_weight),
            "codebook": float(codebook_weight),
            "commitment": float(commitment_weight),
        }
        self.restart_every = restart_every
        self.restart_until = restart_until
        self.restart_min_count = restart_min_count
        device = model.quantize.embedding.weight.device
        cfg = model.config
        self.counts = torch.zeros(cfg.codebook_size, dtype=torch.long, device=device)  # (K,) since last restart
        self.buffer = torch.zeros(buffer_size, cfg.codebook_embed_dim, device=device)  # (M, D) recent latents
        self.filled = 0
        self.position = 0

    def __call__(self, images: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One forward pass on images (B, C, H, W) -> (total loss, per-term logs)."""
        model = self.model
        x = images.to(model.quantize.embedding.weight.device)
        z = model.latents(x)  # (B, D, h, w)
        z_q, codes, q_losses = model.quantize_latents(z)
        recon = model.decoder(model.post_quant_conv(z_q))  # (B, C, H, W)
        terms = {
            "l1": (recon - x).abs().mean(),
            "mse": F.mse_loss(recon, x),
            "codebook": q_losses["codebook"],
            "commitment": q_losses["commitment"],
        }
        loss = sum(self.weights[k] * v for k, v in terms.items())
        with torch.no_grad():
            self.counts += torch.bincount(codes.reshape(-1), minlength=self.counts.numel())
            flat = z.detach().permute(0, 2, 3, 1).reshape(-1, z.shape[1]).float()  # (B*h*w, D)
            if model.config.l2_norm:
                flat = F.normalize(flat, p=2, dim=-1)
            self._push(flat)
        return loss, {k: v.detach() for k, v in terms.items()}

    def _push(self, latents: torch.Tensor) -> None:
        size = self.buffer.shape[0]
        latents = latents[-size:]
        n = latents.shape[0]
        idx = (self.position + torch.arange(n, device=self.buffer.device)) % size
        self.buffer[idx] = latents
        self.position = (self.position + n) % size
        self.filled = min(size, self.filled + n)

    def after_step(self, step: int) -> dict[str, float]:
        """Restart dead codes every ``restart_every`` steps; returns the restart logs on those steps."""
        if not self.restart_every or step % self.restart_every:
            return {}
        if self.restart_until is not None and step > self.restart_until:
            return {}
        usage = float((self.counts > 0).float().mean())
        restarted = self.restart_dead_codes()
        return {"train_usage": usage, "restarted": float(restarted)}

    @torch.no_grad()
    def restart_dead_codes(self) -> int:
        """Re-seed every code used fewer than ``restart_min_count`` times; returns how many were re-seeded.

        The counts are reset afterwards. New raw rows get the median norm of the live rows so their
        Adam updates move them at the same angular speed as the others.
        """
        quantize = self.model.quantize
        dead = torch.nonzero(self.counts < self.restart_min_count).flatten()  # (n_dead,)
        self.counts.zero_()
        if dead.numel() == 0 or self.filled == 0:
            return 0
        weight = quantize.embedding.weight  # (K, D) raw rows
        alive = torch.ones(weight.shape[0], dtype=torch.bool, device=weight.device)
        alive[dead] = False
        data = self.buffer[: self.filled]  # (M, D)
        book = quantize.codebook().float()  # (K, D), normalised if l2_norm
        if alive.any():
            live = book[alive]  # (K_alive, D)
            d2 = torch.cat(
                [torch.cdist(chunk, live).min(dim=1).values.pow(2) for chunk in data.split(4096)]
            )  # (M,) squared distance to the nearest live code
            scale = weight[alive].norm(dim=1).median()
        else:
            d2 = torch.ones(data.shape[0], device=data.device)
            scale = weight.norm(dim=1).median()
        chosen = []
        for _ in range(dead.numel()):
            total = d2.sum()
            if not total > 1e-12:
                break
            pick = torch.multinomial(d2 / total, 1)  # (1,)
            centre = data[pick]  # (1, D)
            chosen.append(centre)
            d2 = torch.minimum(d2, (data - centre).pow(2).sum(dim=1))
        if not chosen:
            return 0
        new = torch.cat(chosen)  # (n, D)
        if self.model.config.l2_norm:
            new = F.normalize(new, p=2, dim=-1) * scale
        weight[dead[: new.shape[0]]] = new.to(weight.dtype)
        return new.shape[0]

    def state_dict(self) -> dict[str, Any]:
        """Usage counts, latent buffer and its write position (for exact resumption)."""
        return {
            "counts": self.counts.cpu(),
            "buffer": self.buffer.cpu(),
            "filled": self.filled,
            "position": self.position,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if tuple(state["buffer"].shape) != tuple(self.buffer.shape):
            raise ConfigError(
                f"restart buffer shape {tuple(state['buffer'].shape)} in the checkpoint does not match "
                f"{tuple(self.buffer.shape)}"
            )
        self.counts.copy_(state["counts"])
        self.buffer.copy_(state["buffer"])
        self.filled = int(state["filled"])
        self.position = int(state["position"])


@torch.no_grad()
def evaluate_vq(model: VQModel, images: torch.Tensor | Sequence, batch_size: int = 500) -> dict[str, float]:
    """Reconstruction quality and codebook usage of ``model`` on ``images``.

    ``images`` is a tensor (N, C, H, W) in [-1, 1] or a dataset whose items start with such an
    image. Images go through encode -> codes -> decode_codes. Returns ``mse`` (mean squared error
    in [-1, 1] units), ``psnr`` (dB, peak-to-peak 2), ``codes_used`` (distinct codes chosen),
    ``codebook_usage`` (codes_used / codebook_size), ``perplexity`` (exp of the code-frequency
    entropy), ``num_images`` and ``num_tokens``.
    """
    was_training = model.training
    model.eval()
    device = model.quantize.embedding.weight.device
    size = model.config.codebook_size
    hist = torch.zeros(size, dtype=torch.long, device=device)
    sq_err = 0.0
    n_pixels = 0
    total = len(images)
    try:
        for start in range(0, total, batch_size):
            idx = torch.arange(start, min(start + batch_size, total))
            if isinstance(images, torch.Tensor):
                x = images[idx]
            else:
                x = image_batch(images, idx)
            x = x.to(device)  # (b, C, H, W)
            codes = model.encode(x)  # (b, h, w)
            recon = model.decode_codes(codes)  # (b, C, H, W)
            sq_err += float((recon.float() - x.float()).pow(2).sum())
            n_pixels += x.numel()
            hist += torch.bincount(codes.reshape(-1), minlength=size)
    finally:
        model.train(was_training)
    mse = sq_err / max(1, n_pixels)
    freq = hist.double() / max(1, int(hist.sum()))
    entropy = -(freq[freq > 0] * freq[freq > 0].log()).sum()
    used = int((hist > 0).sum())
    return {
        "mse": mse,
        "psnr": float(10.0 * torch.log10(torch.tensor(4.0 / mse))) if mse > 0 else float("inf"),
        "codes_used": used,
        "codebook_usage": used / size,
        "perplexity": float(entropy.exp()),
        "num_images": total,
        "num_tokens": int(hist.sum()),
    }
