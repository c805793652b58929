"""Training: a generic resumable loop, the objectives of the world's models and their jobs."""
