"""Speculative decoding building blocks that are independent of drafters and trees.

``neighbours`` builds and caches codebook nearest-neighbour tables; ``acceptance`` holds the
vectorised acceptance rules (exact, greedy, LANTERN, LANTERN++) over batches of candidate rows.
"""
