"""The authors' LANTERN code (jadohu/LANTERN) beside ours on identical weights.

:mod:`lantern.reference.convert` turns our LlamaGen-layout target and drafter into the HF layout their
code loads (pure tensor work, no import of their code); :mod:`lantern.reference.theirs` imports their
package from a local snapshot and builds their models from the converted weights. The benchmark that
times both sides is :mod:`lantern.run.against_reference` (``scripts/bench_against_reference.py``).
"""
