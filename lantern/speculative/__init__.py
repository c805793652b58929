"""Speculative decoding building blocks that are independent of the decoder loop.

``neighbours`` builds and caches codebook nearest-neighbour tables; ``relaxation`` fixes the law a
node samples from within a TV budget (LANTERN, LANTERN++); ``acceptance`` holds the exact candidate
tests and their composition with a relaxation; ``reference`` reproduces the authors' LANTERN rule;
``draft`` grows draft trees; ``verify`` walks a tree with a rule; ``drafter`` is the EAGLE-style drafter.
"""
