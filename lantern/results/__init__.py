"""Results: the run record, provenance, speed-up baselines and joins, and the tables rendered from them."""
