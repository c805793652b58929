"""The authors' own code a model family is checked and timed against, beside ours on identical weights.

For LlamaGen: jadohu/LANTERN's HF-layout port and drafter. :mod:`lantern.models.llamagen.reference_layout`
turns our target and drafter into the layout their code loads (pure tensor work, no import of their code);
:mod:`lantern.models.llamagen.reference_code` imports their package from a local snapshot and builds their
models from the converted weights. The benchmark that times both sides is :mod:`lantern.run.bench.against_reference`
(``scripts/bench_against_reference.py``); it reaches the family's pieces through this module only.
"""

from lantern.models.llamagen import reference_code, reference_layout

__all__ = ["reference_code", "reference_layout"]
