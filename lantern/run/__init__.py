"""Running jobs: the generation job, run folders and locks, sweeps, prompts, distributed runs and W&B."""
