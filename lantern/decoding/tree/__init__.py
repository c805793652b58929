"""Tree speculative decoding: draft structures, the drafter session, the walk with a rule, the step and its decoder."""
