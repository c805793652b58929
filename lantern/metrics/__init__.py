"""Image-quality and prompt-faithfulness metrics: offline FID and the Fashion-MNIST classifier."""

from lantern.metrics.classifier import (
    FashionClassifier,
    load_classifier,
    pad_to_world,
    predict,
    prompt_accuracy,
    to_classifier_input,
)
from lantern.metrics.fid import (
    FEATURE_DIM,
    FEATURE_NET_ID,
    FID_HELPER_REQUIREMENT,
    FIDStats,
    InceptionFeatures,
    StatsKey,
    clean_resize,
    compute_fid,
    fid_from_features,
    fid_from_stats,
    fid_with_cleanfid,
    frechet_distance,
    inception_path,
    reference_stats,
)

__all__ = [
    "FEATURE_DIM",
    "FEATURE_NET_ID",
    "FID_HELPER_REQUIREMENT",
    "FIDStats",
    "FashionClassifier",
    "InceptionFeatures",
    "StatsKey",
    "clean_resize",
    "compute_fid",
    "fid_from_features",
    "fid_from_stats",
    "fid_with_cleanfid",
    "frechet_distance",
    "inception_path",
    "load_classifier",
    "pad_to_world",
    "predict",
    "prompt_accuracy",
    "reference_stats",
    "to_classifier_input",
]
