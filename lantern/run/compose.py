"""Run configs composed from conf/ and the objects built from them, the same for ``run.py`` and the benchmarks.

A decoder's config names what it is (its class, knobs, draft structure and rule), not where the model's
files are: its ``drafter`` and its rule's ``neighbours`` are left null in ``conf/decoding/*.yaml`` and handed
in by :func:`build_decoder` from :class:`ModelParts`, which builds the model's bundle, drafter and
neighbours once each from ``cfg.model`` (so a drafter file is read once per job, however many decoders
or benchmark rows share it; the neighbours take the bundle's codebook, so the tokenizer file is read once too).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property

from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from lantern import REPO_ROOT
from lantern.errors import ConfigError


def compose_config(overrides: list[str], config_name: str = "config"):
    """conf/ composed with ``overrides`` as ``python run.py OVERRIDES`` composes it (not resolved)."""
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "conf")):
        return compose(config_name, overrides=list(overrides))


def resolved_config(overrides: list[str]) -> dict:
    """The run config ``run.py`` would compose from ``overrides``, resolved (a bad value: one ConfigError)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(compose_config(overrides), resolve=True, throw_on_missing=True)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - an override Hydra cannot compose is bad input
        raise ConfigError(f"cannot compose {' '.join(overrides)!r}: {str(exc).splitlines()[0]}") from exc


class ModelParts:
    """A model config's bundle, drafter and neighbours, each built when first asked for and then kept.

    ``drafter`` / ``neighbours`` given here are used as they are (the benchmarks' random targets bring
    their own); otherwise they come from ``model.drafter`` / ``model.neighbours``.
    """

    def __init__(self, model, bundle=None, drafter=None, neighbours=None):
        self.model = model
        for name, given in (("bundle", bundle), ("drafter", drafter), ("neighbours", neighbours)):
            if given is not None:
                self.__dict__[name] = given  # what cached_property would have stored

    @cached_property
    def bundle(self):
        return instantiate(self.model.bundle)

    @cached_property
    def drafter(self):
        if self.model.get("drafter") is None:
            raise ConfigError(f"model {self.model.get('name')!r} has no drafter; this decoder needs one")
        return instantiate(self.model.drafter)

    @cached_property
    def neighbours(self):
        node = self.model.get("neighbours")
        if node is None:
            raise ConfigError(f"model {self.model.get('name')!r} has no codebook neighbours; this rule needs them")
        if node.get("vq_ckpt") is not None:  # the bundle's tokenizer holds that codebook: no second read of its file
            return instantiate(node, vq_ckpt=None, codebook=self.bundle.codebook().float().cpu())
        return instantiate(node)


def build_decoder(node, parts: ModelParts, **kwargs):
    """The decoder of a ``decoding`` (or ``speedup_baseline``) config node, with the drafter and neighbours
    it asks for (a ``drafter`` key; a ``neighbours`` key in its ``acceptance``) taken from ``parts``.
    ``kwargs`` go to its constructor (e.g. ``guard``)."""
    if "drafter" in node:
        kwargs["drafter"] = parts.drafter
    acceptance = node.get("acceptance")
    if isinstance(acceptance, Mapping) and "neighbours" in acceptance:
        kwargs["acceptance"] = {"neighbours": parts.neighbours}
    return instantiate(node, **kwargs)
