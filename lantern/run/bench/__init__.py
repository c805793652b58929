"""The benchmarks, each building its decoders from the same conf/ configs ``run.py`` uses.

- :mod:`.speculative` (``scripts/bench_speculative.py``): every mode against AR on the same prompts and seeds;
- :mod:`.ar` (``scripts/bench_ar.py``): the AR decoder's tokens/s, and LlamaGen's own ``generate()`` beside it;
- :mod:`.gpu_check` (``scripts/gpu_check.py``): eager and compiled AR, exact and LANTERN chains on one device;
- :mod:`.against_reference` (``scripts/bench_against_reference.py``): our decoders against the authors' code;
- :mod:`.common`: what they share (one timed call, what a decoder ran with, the output check).
"""
