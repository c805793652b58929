"""Speculative Jacobi decoding (SJD) and grouped speculative decoding (GSD): the step, the groups and the decoder."""
