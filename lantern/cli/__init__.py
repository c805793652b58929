"""Entry-point behaviour: one-line errors and exit codes, Hydra error messages, preflight checks."""
