"""PJD: Parallel Jacobi Decoding (2-D Jacobi over the token grid)."""
