"""LlamaGen's own ``generate()`` on our weights: the reference-grade AR of the LlamaGen family and the world.

The papers that build on LlamaGen time its eager ``autoregressive/models/generate.py`` loop (gpt-fast's
shape, no ``torch.compile``). It is imported from a local checkout of FoundationVision/LlamaGen, never copied
here: ``speedup_reference.code=PATH`` (with ``baseline=both``), else ``$LANTERN_LLAMAGEN``, else ``../ref/LlamaGen``
beside the repository. Its ``Transformer`` has our state-dict layout, so our weights load strictly; one thing
is set from outside: its ``CaptionEmbedder`` always makes a 120-row ``uncond_embedding`` buffer, so a t2i
model with another condition length (the world: 16) gets a buffer of its own length before loading.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from lantern import REPO_ROOT, checks
from lantern.errors import ConfigError

ENV_VAR = "LANTERN_LLAMAGEN"
DEFAULT_FOLDER = REPO_ROOT.parent / "ref" / "LlamaGen"
ENTRY = Path("autoregressive") / "models" / "generate.py"
EXPECTED = "a local checkout of FoundationVision/LlamaGen holding autoregressive/models/generate.py"


def llamagen_folder(given=None) -> Path:
    """The checkout: ``given``, else ``$LANTERN_LLAMAGEN``, else ``../ref/LlamaGen`` beside the repository.
    ConfigError (one line, naming where it looked) when none holds LlamaGen's generate()."""
    if given is not None:
        folder = checks.path("speedup_reference.code", given, "folder", EXPECTED)
        where = f"speedup_reference.code={checks.shown(os.fspath(given), 400)}"
    else:
        folder = Path(os.environ.get(ENV_VAR) or DEFAULT_FOLDER)
        where = f"no speedup_reference.code given, ${ENV_VAR} {'set' if os.environ.get(ENV_VAR) else 'unset'}, {folder}"
    if not (folder / ENTRY).is_file():
        raise ConfigError(
            f"{where}: expected {EXPECTED} (the reference-grade AR of LlamaGen; docs/speed.md says how to get it)"
        )
    return folder


def import_llamagen(folder: Path):
    """LlamaGen's ``(ModelArgs, Transformer, generate)`` from the checkout at ``folder``."""
    root = str(folder.resolve())
    if root not in sys.path:
        sys.path.insert(0, root)  # their modules import `utils.drop_path` from the checkout's root
    try:
        from autoregressive.models.generate import generate
        from autoregressive.models.gpt import ModelArgs, Transformer
    except Exception as exc:  # noqa: BLE001 - whatever their import chain raises is one line
        raise ConfigError(f"cannot import LlamaGen's generate() from {folder}: {type(exc).__name__}: {exc}") from None
    return ModelArgs, Transformer, generate


def llamagen_model(model: torch.nn.Module, folder: Path):
    """LlamaGen's own ``Transformer`` holding ``model``'s weights (strictly), on its device and dtype, and
    their ``generate`` function."""
    model_args, transformer, generate = import_llamagen(folder)
    cfg = model.config
    args = model_args(
        dim=cfg.dim,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        vocab_size=cfg.vocab_size,
        num_classes=cfg.num_classes,
        caption_dim=cfg.caption_dim,
        cls_token_num=cfg.cls_token_num,
        model_type=cfg.model_type,
        block_size=cfg.num_image_tokens,
        norm_eps=cfg.norm_eps,
        rope_base=cfg.rope_base,
        token_dropout_p=0.0,
        resid_dropout_p=0.0,
        ffn_dropout_p=0.0,
    )
    theirs = transformer(args)
    state = model.state_dict()
    if cfg.model_type == "t2i":  # their CaptionEmbedder's buffer is 120 rows whatever cls_token_num says
        theirs.cls_embedding.uncond_embedding = torch.empty_like(state["cls_embedding.uncond_embedding"])
    theirs.load_state_dict(state, strict=True)
    weight = model.output.weight
    return theirs.to(device=weight.device, dtype=weight.dtype).eval(), generate


class LlamaGenReference:
    """The reference-grade AR of a LlamaGen bundle: their ``generate()`` over their ``Transformer`` holding the
    bundle's weights, eager, as their sample scripts run it (batched, CFG rows ``[cond; uncond]``, t2i captions
    left-padded under ``emb_masks``); greedy is their ``sample_logits=False``. Their sampling draws from
    torch's global generator, seeded per batch from its first image's key."""

    label = "LlamaGen generate()"
    batched = True

    @staticmethod
    def check(code=None) -> None:
        """ConfigError unless LlamaGen's checkout is found (:func:`llamagen_folder`), before any work."""
        llamagen_folder(code)

    def __init__(self, bundle, code=None):
        self.folder = llamagen_folder(code)
        self.model, self._generate = llamagen_model(bundle.target, self.folder)
        self.commit = _commit(self.folder)

    def generate(self, condition, sampling, seed: int) -> torch.Tensor:
        """Codes (B, N) long for ``condition`` under ``sampling`` (a SamplingConfig)."""
        greedy = sampling.temperature == 0
        torch.manual_seed(seed)
        masks = condition.mask.to(self.model.tok_embeddings.weight.dtype) if condition.values.ndim == 3 else None
        codes = self._generate(
            self.model,
            condition.values,
            self.model.config.block_size,
            emb_masks=masks,
            cfg_scale=sampling.cfg_scale,
            cfg_interval=int(sampling.cfg_interval),
            temperature=1.0 if greedy else sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            sample_logits=not greedy,
        )
        return codes.long()


def _commit(folder: Path) -> str | None:
    """The checkout's commit where it says one (a ``COMMIT`` file or ``.git/HEAD``), else None."""
    for name in ("COMMIT", ".git/HEAD"):
        path = folder / name
        if path.is_file():
            return path.read_text(encoding="utf-8").strip()[:40] or None
    return None
