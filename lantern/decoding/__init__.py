"""Decoders: plain AR, tree speculative decoding (tree/) and Jacobi decoding (jacobi/), over one decode loop."""
