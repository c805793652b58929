"""The embedded world's own small CLIP: its open_clip architecture, its batches and its objective.

The world scores prompt-image agreement with a CLIP trained here on Fashion-MNIST, in place of
OpenAI's ViT-B/32 (which has never seen 32x32 gray garments). It is a plain open_clip ``CLIP``: a
tiny ViT over the 16 8x8 patches of the 32x32 image and a small causal text transformer, registered by
the JSON file ``lantern-fashion-clip.json`` (open_clip names a model after its config file's stem)
and loaded by :class:`lantern.metrics.clip.CLIPScore` like any other open_clip model. The text
tower keeps open_clip's 49408-token BPE vocabulary so that open_clip's bundled ``SimpleTokenizer``
works offline; its token embedding (49408 x text width) is most of the file.

Batches pair each train image with one of the 7 caption templates of its class, drawn at random,
with the LANTERN prefix ``"A photo depicts "`` on about half of them, so both CLIP-score
conventions (prefixed and plain captions) see captions they were trained on. Images are fed
exactly as open_clip's ``preprocess`` for this config feeds them at scoring time: the 28x28 garment
centred on a black 32x32 canvas, three equal channels, ``x / 255`` normalised with OpenAI's mean
and std (a 32x32 image passes open_clip's resize and centre crop unchanged). Training adds small
shifts and left-right flips.

Objective: the symmetric InfoNCE of CLIP with open_clip's learnable ``logit_scale`` (clamped to
100, as open_clip does). With 10 classes, a batch of 256 holds about 25 images and 25 captions of
every class, and plain InfoNCE would push each image away from the captions of its own class
that happen to belong to other images: false negatives, since every caption of a class describes
every image of it. By default the targets are therefore soft: each image's target distribution
is uniform over the batch's captions of its class, and each caption's over the batch's images of
its class (``same_class_targets=False`` gives the plain identity targets). The model thus learns
to put every caption of a class nearest to every image of that class, which is exactly what a
CLIP score of the world's class captions asks of it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from lantern import checks
from lantern.errors import ConfigError
from lantern.metrics.clip import CONVENTIONS
from lantern.models.world.fashion_mnist import CLASS_NAMES, NUM_CLASSES, all_captions
from lantern.training.classifier import training_batch

MODEL_NAME = "lantern-fashion-clip"
CONFIG_NAME = f"{MODEL_NAME}.json"
WEIGHTS_NAME = "clip.safetensors"
RESOLUTION = 32
PREFIX = CONVENTIONS["lantern"][0]  # "A photo depicts "
MAX_LOGIT_SCALE = math.log(100.0)
# open_clip's default preprocessing statistics (PreprocessCfg: OpenAI's mean and std, per RGB channel).
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_config(
    embed_dim: int = 64,
    vision_width: int = 96,
    vision_layers: int = 4,
    patch_size: int = 8,
    vision_head_width: int = 32,
    text_width: int = 64,
    text_heads: int = 4,
    text_layers: int = 3,
    context_length: int = 32,
) -> dict:
    """The open_clip architecture config (the content of ``lantern-fashion-clip.json``).

    A ViT over ``patch_size`` patches of the 32x32 image (``(32 / patch_size)^2`` tokens plus the
    class token) and a causal text transformer over ``context_length`` BPE tokens, both projected
    to ``embed_dim``. ``vocab_size`` stays 49408, the vocabulary of open_clip's ``SimpleTokenizer``.
    """
    values = {
        "embed_dim": embed_dim,
        "vision_width": vision_width,
        "vision_layers": vision_layers,
        "patch_size": patch_size,
        "vision_head_width": vision_head_width,
        "text_width": text_width,
        "text_heads": text_heads,
        "text_layers": text_layers,
        "context_length": context_length,
    }
    for name, value in values.items():
        checks.integer(f"CLIP {name}", value, 1)
    if RESOLUTION % patch_size:
        raise ConfigError(f"CLIP patch_size must divide the image size {RESOLUTION}, got {patch_size}")
    if vision_width % vision_head_width or text_width % text_heads:
        raise ConfigError(
            f"CLIP widths must split into heads: vision {vision_width} / head width {vision_head_width}, "
            f"text {text_width} / {text_heads} heads"
        )
    return {
        "embed_dim": embed_dim,
        "vision_cfg": {
            "image_size": RESOLUTION,
            "layers": vision_layers,
            "width": vision_width,
            "head_width": vision_head_width,
            "patch_size": patch_size,
        },
        "text_cfg": {
            "context_length": context_length,
            "vocab_size": 49408,
            "width": text_width,
            "heads": text_heads,
            "layers": text_layers,
        },
    }


def build_clip(config: Mapping):
    """A randomly initialised open_clip ``CLIP`` of ``config`` (no I/O), in train mode."""
    import open_clip

    return open_clip.CLIP(**copy.deepcopy(dict(config)))


def caption_table() -> list[str]:
    """All training captions (140): entry ``p * 70 + label * 7 + t`` is template ``t`` of ``label``,
    prefixed with ``"A photo depicts "`` when ``p`` is 1."""
    plain = [c for label in range(NUM_CLASSES) for c in all_captions(label)]  # (70,)
    return plain + [PREFIX + c for c in plain]


def tokenize_captions(captions: Sequence[str], context_length: int) -> torch.Tensor:
    """int64 token ids (N, context_length) of ``captions`` by open_clip's ``SimpleTokenizer``.

    Raises ConfigError when a caption would be cut short.
    """
    from open_clip.tokenizer import SimpleTokenizer

    tokenizer = SimpleTokenizer(context_length=context_length)
    longest = max(len(tokenizer.encode(c)) + 2 for c in captions)  # + start and end tokens
    if longest > context_length:
        raise ConfigError(f"CLIP context_length {context_length} is too short for the captions ({longest} tokens)")
    return tokenizer(list(captions))  # (N, context_length)


def normalize_pixels(gray: torch.Tensor) -> torch.Tensor:
    """Gray (B, 1, H, W) in [0, 1] -> (B, 3, H, W) normalised as open_clip's ``preprocess`` does."""
    mean = torch.tensor(IMAGE_MEAN, dtype=gray.dtype).view(1, 3, 1, 1)
    std = torch.tensor(IMAGE_STD, dtype=gray.dtype).view(1, 3, 1, 1)
    return (gray.expand(-1, 3, -1, -1) - mean) / std  # (B, 3, H, W)


def clip_batch(
    images: torch.Tensor,
    labels: torch.Tensor,
    indices: torch.Tensor,
    augment: bool = True,
    max_shift: int = 2,
    prefix_prob: float = 0.5,
    templates: int = 7,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch ``(pixels (B, 3, 32, 32), labels (B,), caption ids (B,))`` from uint8 (N, 28, 28) images.

    Caption id ``p * 70 + label * 7 + t`` indexes :func:`caption_table`: template ``t`` drawn
    uniformly, prefix ``p`` with probability ``prefix_prob``. Random draws (shifts, flips, captions)
    come from the global torch generator, which the training loop checkpoints.
    """
    x, y = training_batch(images, labels, indices, augment=augment, max_shift=max_shift)  # (B, 1, 32, 32) in [-1, 1]
    pixels = normalize_pixels((x + 1.0) / 2.0)  # (B, 3, 32, 32)
    template = torch.randint(0, templates, (len(y),))  # (B,)
    prefixed = (torch.rand(len(y)) < prefix_prob).long()  # (B,)
    caption_ids = prefixed * (NUM_CLASSES * templates) + y * templates + template  # (B,)
    return pixels, y, caption_ids


def soft_clip_loss(
    image_emb: torch.Tensor,
    text_emb: torch.Tensor,
    labels: torch.Tensor,
    logit_scale: torch.Tensor,
    same_class_targets: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric InfoNCE of unit-norm image (B, E) and text (B, E) embeddings; returns ``(loss, logits)``.

    ``logits`` (B, B) is ``logit_scale.exp() * image @ text.T``. With ``same_class_targets`` the
    target of each row (image -> captions) and column (caption -> images) is uniform over the
    pairs whose labels (B,) agree; otherwise it is the diagonal (open_clip's ``ClipLoss``).
    """
    logits = logit_scale.exp() * image_emb @ text_emb.T  # (B, B)
    if same_class_targets:
        same = (labels[:, None] == labels[None, :]).to(logits.dtype)  # (B, B), symmetric
        targets = same / same.sum(dim=1, keepdim=True)  # (B, B), rows sum to 1
    else:
        targets = torch.eye(len(labels), dtype=logits.dtype, device=logits.device)  # (B, B)
    image_loss = F.cross_entropy(logits, targets)
    text_loss = F.cross_entropy(logits.T, targets)  # the targets are symmetric in the labels
    return (image_loss + text_loss) / 2, logits


class ContrastiveObjective:
    """CLIP step for :class:`lantern.training.loop.Trainer`: ``(pixels, labels, caption ids) -> (loss, logs)``.

    The text tower encodes the whole caption table (140 captions, ``tokens`` (140, context_length))
    once per step and each batch item picks its caption's row: the same gradient as encoding the
    batch's captions one by one, at a fraction of the cost. ``after_step`` clamps the logit scale.
    """

    def __init__(self, model, tokens: torch.Tensor, same_class_targets: bool = True) -> None:
        """Wrap an open_clip ``model`` and the caption table's ``tokens``; no I/O."""
        self.model = model
        self.tokens = tokens
        self.same_class_targets = bool(same_class_targets)

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """Loss, in-batch retrieval accuracy (image -> caption of the right class) and the logit scale."""
        device = self.model.logit_scale.device
        pixels, labels, caption_ids = (t.to(device) for t in batch)
        image_emb = self.model.encode_image(pixels, normalize=True)  # (B, E)
        table_emb = self.model.encode_text(self.tokens.to(device), normalize=True)  # (140, E)
        text_emb = table_emb[caption_ids]  # (B, E)
        loss, logits = soft_clip_loss(image_emb, text_emb, labels, self.model.logit_scale, self.same_class_targets)
        with torch.no_grad():
            acc = (labels[logits.argmax(dim=1)] == labels).float().mean()
        return loss, {"acc": acc, "scale": self.model.logit_scale.detach().exp()}

    def after_step(self, step: int) -> None:
        """Clamp ``logit_scale`` to [0, ln 100] after each optimizer step, as open_clip's training does."""
        with torch.no_grad():
            self.model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)


def parameter_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on matrices only, none on gains, biases, embeddings or the logit scale."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        skip = param.ndim < 2 or "embedding" in name or "logit_scale" in name or "class_embedding" in name
        (no_decay if skip else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@torch.no_grad()
def zero_shot_scores(image_emb: torch.Tensor, text_emb: torch.Tensor, labels: np.ndarray, templates: int = 7) -> dict:
    """Zero-shot accuracy and matched/mismatched cosines of unit-norm image (N, E) embeddings.

    ``text_emb`` (10 * templates, E) holds the unit-norm embeddings of every template of every class
    (class-major, as :func:`lantern.models.world.fashion_mnist.all_captions` lists them). A class's zero-shot
    embedding is the normalised mean of its templates'; an image is classified by the nearest one.
    Matched cosines are those of each image with its class's captions, mismatched those with the
    other classes' captions. Cosines are also reported as torchmetrics' ``100 * max(cos, 0)``.
    """
    labels_t = torch.as_tensor(labels)  # (N,)
    class_emb = F.normalize(text_emb.view(NUM_CLASSES, templates, -1).mean(dim=1), dim=-1)  # (10, E)
    preds = (image_emb @ class_emb.T).argmax(dim=1)  # (N,)
    correct = preds == labels_t  # (N,)
    cosines = (image_emb @ text_emb.T).view(len(labels_t), NUM_CLASSES, templates)  # (N, 10, T)
    matched = F.one_hot(labels_t, NUM_CLASSES).bool()  # (N, 10)
    matched_cos, mismatched_cos = cosines[matched], cosines[~matched]  # (N, T), (N * 9, T)
    return {
        "zero_shot_accuracy": float(correct.float().mean()),
        "per_class_accuracy": {
            CLASS_NAMES[c]: float(correct[labels_t == c].float().mean())
            for c in range(NUM_CLASSES)
            if (labels_t == c).any()
        },
        "matched_cosine": float(matched_cos.mean()),
        "mismatched_cosine": float(mismatched_cos.mean()),
        "matched_score_x100": float(100 * matched_cos.clamp(min=0).mean()),
        "mismatched_score_x100": float(100 * mismatched_cos.clamp(min=0).mean()),
    }
