"""Decoding strategies over the target-model interface (one file each)."""
