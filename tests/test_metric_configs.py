"""Every conf/metrics option composes and builds its metric objects without I/O (files are read in check)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import METRIC_CASES
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("name", sorted(METRIC_CASES))
def test_metric_option_composes_and_builds(name, monkeypatch, tmp_path):
    overrides, classes = METRIC_CASES[name]
    monkeypatch.setattr("lantern.metrics.fid.image_folder", lambda path: path)
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=[f"metrics={name}", *(f"{k}={v}" for k, v in overrides.items())])
    built = instantiate(cfg.metrics, _convert_="object") if name != "world" else None
    keys = set(cfg.metrics)
    assert keys == set(classes)
    for key, cls in classes.items():
        assert cfg.metrics[key]["_target_"].endswith("." + cls)
        if built is not None:
            assert type(built[key]).__name__ == cls
    if name == "lantern_coco":
        assert cfg.metrics.precision_recall.reference.path == "REF" and cfg.metrics.clip.convention == "lantern"
        assert built["precision_recall"].k == 3 and built["hps"].model == "ViT-H-14"
    if name == "sjd_coco":
        assert built["fid"].method == "sqrtm" and type(built["fid"].extractor).__name__ == "PytorchFIDInception"
    for key in keys:
        assert "interval_resamples" in cfg.metrics[key], f"{name}.{key} pins no interval"
