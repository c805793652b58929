"""lantern: a harness for plain AR and speculative decoding of visual autoregressive models."""

from omegaconf import OmegaConf

from lantern.records import REPO_ROOT

# `${lantern_root:}` in configs: the repository root, for paths that must not depend on the working
# directory (the experiments/ search path). Registered on import so run.py, scripts and tests agree.
OmegaConf.register_new_resolver("lantern_root", lambda: str(REPO_ROOT), replace=True)
