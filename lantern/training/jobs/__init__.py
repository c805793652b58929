"""Training jobs: one entry function each (``train(cfg) -> report``), called by ``scripts/train_*.py``."""
