"""The two AR baselines a speed-up is measured against, as objects a run builds from ``conf/baseline/``.

- engine-grade AR (``speedup_baseline``): ours, :class:`lantern.decoding.ar.ARDecoder`, compiled like the decoder
  it is compared with (on CUDA with ``compile=reduce-overhead``: CUDA graphs). What the harness calls AR.
- reference-grade AR (``speedup_reference``, :class:`.reference.ReferenceAR`): the loop the papers time, eager:
  transformers' own ``generate()`` with the family's logits processors for the HF families, LlamaGen's own
  ``generate()`` for LlamaGen and the world. The family names its reference in its model config
  (``model.reference_ar``); nothing here names a family.

``baseline=compiled`` (the default) times the first, ``baseline=both`` both, ``baseline=reference`` the second
alone; :mod:`lantern.run.job` interleaves them with the decoder on the same prompts and seeds and records
both speed-ups (``speedup`` and ``speedup_reference``), their cost outside the decoder's steps, and in
greedy mode whether the reference's codes equal ours (:mod:`.speedups`).
"""
