"""lantern: a harness for plain AR and speculative decoding of visual autoregressive models.

The package is built in layers; each imports only the ones before it (``tests/test_layout.py`` checks):

    errors, checks, rng, files      ground helpers
    models/                         the target-model protocol, families (llamagen/), drafters, sampling, the world
    rules/                          acceptance rules: exact candidate tests, relaxations, LANTERN's rules
    decoding/                       decoders: AR, tree speculative (tree/), Jacobi (jacobi/), one decode loop
    metrics/, results/              quality metrics; run records, joins and tables
    training/                       training loops, objectives and jobs
    run/                            the generation job, run folders, sweeps, prompts, distributed runs
    cli/                            entry-point behaviour: one-line errors, Hydra, preflight
"""

from pathlib import Path

from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[1]

# `${lantern_root:}` in configs: the repository root, for paths that must not depend on the working
# directory (the experiments/ search path). Registered on import so run.py, scripts and tests agree.
OmegaConf.register_new_resolver("lantern_root", lambda: str(REPO_ROOT), replace=True)
