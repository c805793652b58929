"""Models: the target-model protocol, model families (llamagen/), drafters, sampling, conditions and the world."""
