"""Evaluation protocols: what a paper's numbers were measured on, pinned and checked before any work.

A protocol (``conf/protocol/NAME.yaml``, selected with ``protocol=NAME``) pins the prompts (source, selection
rule, count, order and the sha256 of the prompt list in protocol order), the reference images of FID (name,
source, preprocessing, resolution, hash), each metric's implementation and the hash of its weights file, the
image size and resize filter, the seeds, and the speed sub-protocol (prompt count, batch size, warm-up,
synchronisation). :meth:`Protocol.check` compares a composed run with the pins before the run folder is
claimed; every difference is one :class:`~lantern.errors.ConfigError` naming the value and the pin. A pin of
``sha256: null`` is a file nobody could hash where the preset was written (e.g. MS-COCO, absent offline): the
run records the hash it saw instead, and the table notes show it.

``num_images`` below the protocol's prompt count runs the first N prompts in protocol order; the record then
says ``protocol_subset: true`` and tables mark the row. ``protocol.part=speed`` is the timing sub-protocol: the
pinned batch size, warm-up and prompt count, no quality metrics; its records lend tables their latency columns
(the part is left out of the protocol's hash, so the two parts of one protocol join). Records name the protocol and the sha256 of its
resolved pins; tables join and compare runs only within one protocol (:mod:`lantern.results.baselines`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lantern import checks
from lantern.errors import ConfigError
from lantern.files import note_input

# Every field a protocol file must give, by section (a missing one is refused naming it).
FIELDS = {
    "name": None,
    "description": None,
    "prompts": ("source", "selection", "count", "order", "sha256"),
    "reference": ("name", "source", "preprocessing", "resolution", "count", "path", "sha256"),  # path: a folder or file
    "metrics": None,  # name -> {implementation, weights, sha256}
    "image": ("size", "resize"),
    "seeds": ("seed", "per_sample"),
    "speed": ("prompts", "batch_size", "warmup", "synchronise"),
}
# Upper bounds of a protocol's counts and sizes, far above every field's (COCO 2014's 30k prompts, 1024 px): a larger
# value is a typo that would run for days (the same bounds as the run's own knobs, lantern.cli.preflight).
MAX_PROMPTS, MAX_PIXELS, MAX_BATCH, MAX_WARMUP = 1_000_000, 8192, 4096, 1000
PARTS = ("quality", "speed")  # ``protocol.part``: what a run measures (optional; quality by default)
METRIC_FIELDS = ("implementation", "weights", "sha256")  # weights: the metric's file (an interpolation) or null


def _missing(name: str, node: Mapping) -> str | None:
    for section, fields in FIELDS.items():
        if section not in node:
            return section
        if fields is not None:
            if not isinstance(node[section], Mapping):
                return section
            for field in fields:
                if field not in node[section]:
                    return f"{section}.{field}"
    for metric, pin in (node.get("metrics") or {}).items():
        for field in METRIC_FIELDS:
            if not isinstance(pin, Mapping) or field not in pin:
                return f"metrics.{metric}.{field}"
    return None


def prompt_list_sha256(items: Sequence) -> str:
    """sha256 of a prompt list in order (captions or class ids), as JSON: what ``prompts.sha256`` pins."""
    return hashlib.sha256(json.dumps(list(items), ensure_ascii=False).encode("utf-8")).hexdigest()


def select(config: Mapping, key: str):
    """The value at dotted ``key`` of a resolved config (None when absent)."""
    node = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _path_of(value):
    """A configured file: a path, or a ``{_target_: ...}`` node that returns one (the world's files)."""
    if isinstance(value, Mapping) and "_target_" in value:
        from hydra.utils import instantiate

        return instantiate(value)
    return value


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol's pins (the resolved ``protocol`` node of a run config)."""

    node: dict

    @classmethod
    def from_config(cls, node: Mapping | None) -> Protocol | None:
        """The protocol of a resolved config's ``protocol`` entry (None: no protocol), its fields checked."""
        if node is None:
            return None
        if not isinstance(node, Mapping):
            raise ConfigError(f"protocol={node!r}: expected a protocol preset (conf/protocol/NAME.yaml) or none")
        name = node.get("name", "?")
        missing = _missing(name, node)
        if missing is not None:
            raise ConfigError(f"protocol {name}: the preset gives no {missing!r} (every protocol pins {missing})")
        count = checks.capped(f"protocol {name}: prompts.count", node["prompts"]["count"], 1, MAX_PROMPTS)
        checks.optional(
            checks.capped, f"protocol {name}: image.size", node["image"]["size"], 1, MAX_PIXELS
        )  # null: any
        checks.integer(f"protocol {name}: seeds.seed", node["seeds"]["seed"], 0)
        checks.integer(f"protocol {name}: speed.prompts", node["speed"]["prompts"], 1, count)
        checks.capped(f"protocol {name}: speed.batch_size", node["speed"]["batch_size"], 1, MAX_BATCH)
        checks.capped(f"protocol {name}: speed.warmup", node["speed"].get("warmup", 0), 0, MAX_WARMUP)
        reference = node["reference"]
        checks.optional(
            checks.capped, f"protocol {name}: reference.resolution", reference.get("resolution"), 1, MAX_PIXELS
        )
        checks.optional(checks.capped, f"protocol {name}: reference.count", reference.get("count"), 1, MAX_PROMPTS)
        return cls(dict(node))

    @property
    def name(self) -> str:
        return self.node["name"]

    @property
    def count(self) -> int:
        return int(self.node["prompts"]["count"])

    def sha256(self) -> str:
        """sha256 of the pins: two runs agree on the protocol when this agrees. Where a file lies on this machine
        (weights, the reference path) is left out; its pinned hash is in."""
        pins = json.loads(json.dumps(self.node, default=str))
        pins.pop("part", None)  # the quality and speed parts of one protocol are one protocol
        pins["reference"].pop("path", None)
        for pin in pins["metrics"].values():
            pin.pop("weights", None)
        return hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()

    def _pin(self, what: str, seen: str, pinned: str | None) -> None:
        if pinned is not None and seen != pinned:
            raise ConfigError(
                f"{what} has sha256 {seen[:16]}...; protocol {self.name} pins {pinned[:16]}... (another file?)"
            )

    def _file(self, key: str, path, pinned: str | None, role: str) -> str:
        """The sha256 of the configured file ``key=path``, compared with its pin (missing: one error)."""
        if path is None or path == "???":
            raise ConfigError(f"{key} is required by protocol {self.name} (pinned sha256 {pinned or 'not pinned'})")
        if not Path(str(path)).exists():
            raise ConfigError(
                f"{key}={str(path)!r}: no such file or folder (protocol {self.name} expects "
                f"{'sha256 ' + pinned[:16] + '...' if pinned else 'it'})"
            )
        seen = note_input(path, role)
        self._pin(f"{key}={str(path)!r}", seen, pinned)
        return seen

    def check_config(self, config: Mapping, num_images: int) -> None:
        """What a resolved run ``config`` alone must agree on (no prompt read, no file hashed): the seed, the image
        size, the part, the image count, the speed part's settings, each measured metric's implementation and the
        FID reference's name and count. The preflight runs it before any work; :meth:`check` runs it first."""
        name, pins = self.name, self.node
        seed = pins["seeds"]["seed"]
        if config.get("seed") != seed:
            raise ConfigError(
                f"seed={config.get('seed')!r}: protocol {name} pins seed {seed} (protocol=none to vary it)"
            )
        size, pinned = select(config, "model.image_size"), pins["image"]["size"]
        if pinned is not None and size is None:
            raise ConfigError(f"model {select(config, 'model.name')!r} states no image_size; protocol {name} needs it")
        if pinned is not None and size != pinned:
            raise ConfigError(
                f"model {select(config, 'model.name')!r} makes {size} px images; protocol {name} pins {pinned} px"
            )
        part = pins.get("part", "quality")
        checks.choice(f"protocol {name}: part", part, PARTS)
        if num_images > self.count:
            raise ConfigError(f"num_images={num_images}: protocol {name} has {self.count} prompts (at most that many)")
        if part == "speed":  # the timing sub-protocol: its batch size and warm-up, its prompt count, no metrics
            self._check_speed(config, num_images)
        for metric, pin in pins["metrics"].items() if part == "quality" else ():
            if select(config, f"metrics.{metric}") is None:
                raise ConfigError(f"protocol {name} measures {metric!r} but metrics.{metric} is not configured")
            implementation = select(config, f"metrics.{metric}._target_")
            if implementation != pin["implementation"]:
                raise ConfigError(
                    f"metrics.{metric} is {implementation!r}; protocol {name} pins {pin['implementation']!r}"
                )
        reference = pins["reference"]
        if reference["name"] is not None and part == "quality":
            configured = select(config, "metrics.fid.reference_name")
            if configured != reference["name"]:
                raise ConfigError(
                    f"metrics.fid.reference_name={configured!r}: protocol {name} compares with {reference['name']!r}"
                )
            count, taken = reference["count"], select(config, "metrics.fid.reference.count")
            if count is not None and taken is not None and taken != count:  # a shipped set cut short
                raise ConfigError(
                    f"metrics.fid.reference.count={taken!r}: protocol {name} compares with all {count} reference images"
                )

    def check(self, config: Mapping, prompts: Sequence, num_images: int) -> dict:
        """Compare a resolved run ``config`` and its prompt set with the pins; return the record's entries.

        Raises ConfigError for the first difference: another seed or image size, too many images, a metric or
        reference the protocol does not name (:meth:`check_config`), too few prompts or another prompt list, a
        missing or altered file.
        """
        self.check_config(config, num_images)
        name, pins = self.name, self.node
        part = pins.get("part", "quality")
        if len(prompts) < self.count:
            raise ConfigError(
                f"prompts {getattr(prompts, 'name', '?')!r} hold {len(prompts)} prompts; protocol {name} pins "
                f"{self.count} ({pins['prompts']['selection']})"
            )
        listed = prompt_list_sha256(list(prompts)[: self.count])
        self._pin(
            f"the first {self.count} prompts of {getattr(prompts, 'name', '?')!r}", listed, pins["prompts"]["sha256"]
        )
        seen = {"prompts": listed}
        for metric, pin in pins["metrics"].items() if part == "quality" else ():
            if pin["weights"] is not None:  # the metric's own entry, interpolated (``${metrics.clip.pretrained}``)
                path = _path_of(pin["weights"])
                seen[metric] = self._file(f"metrics.{metric} weights", path, pin["sha256"], f"{metric} weights")
        reference = pins["reference"]
        if reference["name"] is not None and part == "quality" and reference["path"] is not None:
            path = _path_of(reference["path"])  # the FID reference folder (interpolated) or the shipped file
            seen["reference"] = self._file("the FID reference", path, reference["sha256"], "fid reference")
            _check_folder("the FID reference", path, reference["resolution"], reference["count"], name)
        return {
            "protocol": name,
            "protocol_sha256": self.sha256(),
            "protocol_subset": num_images < (self.count if part == "quality" else pins["speed"]["prompts"]),
            "protocol_part": part,
            "protocol_inputs": seen,
        }

    def _check_speed(self, config: Mapping, num_images: int) -> None:
        speed, name = self.node["speed"], self.name
        for key, pinned in (("batch_size", speed["batch_size"]), ("warmup", speed["warmup"])):
            if config.get(key) != pinned:
                raise ConfigError(f"{key}={config.get(key)!r}: the speed part of protocol {name} pins {key} {pinned}")
        if num_images > speed["prompts"]:
            raise ConfigError(
                f"num_images={num_images}: the speed part of protocol {name} times its first {speed['prompts']} prompts"
            )
        if config.get("metrics"):
            raise ConfigError(f"the speed part of protocol {name} measures no quality: set metrics=none")


def _check_folder(key: str, path, resolution: int | None, count: int | None, name: str) -> None:
    """A reference folder holds the protocol's number of images, the first at its resolution (another
    protocol's folder is refused)."""
    folder = Path(str(path))
    if not folder.is_dir():
        return
    images = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not images:
        raise ConfigError(f"{key}={str(path)!r} holds no images")
    if count is not None and len(images) != count:
        raise ConfigError(f"{key}={str(path)!r} holds {len(images)} images; protocol {name} compares with {count}")
    first = images[0]
    if resolution is None:  # a raw set (SJD's val2017): sizes vary
        return
    from PIL import Image

    with Image.open(first) as image:
        if image.size != (resolution, resolution):
            raise ConfigError(
                f"{key}={str(path)!r} holds {image.size[0]}x{image.size[1]} images ({first.name}); "
                f"protocol {name} compares at {resolution}x{resolution}"
            )
