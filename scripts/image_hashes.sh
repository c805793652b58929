#!/usr/bin/env bash
# The sha256 of every PNG that 27 decoder settings write for 4 world images (seed 0, batch $BATCH, default 2),
# one line per image, sorted: a refactor that claims to change no output must leave this list byte for byte
# unchanged.
#   scripts/image_hashes.sh OUT > before.sha             # on the commit before (a worktree), then after:
#   scripts/image_hashes.sh OUT2 > after.sha && diff before.sha after.sha   # no output: every image is the same file
set -euo pipefail
out=${1:?usage: scripts/image_hashes.sh OUT}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
settings=(
  "ar|decoding=ar"
  "ar_greedy|decoding=ar temperature=0"
  "eagle_chain|decoding=eagle"
  "eagle_greedy|decoding=eagle temperature=0"
  "eagle_dynamic|decoding=eagle draft=dynamic_tree"
  "eagle_static_sampled|decoding=eagle draft=static_tree draft.candidates=sampled"
  "lantern|decoding=lantern"
  "lantern_det|decoding=lantern draft.candidates=deterministic"
  "lantern_dynamic|decoding=lantern draft=dynamic_tree"
  "lantern_greedy|decoding=lantern temperature=0"
  "lantern_ref|decoding=lantern semantics=reference draft.candidates=deterministic"
  "lantern_ref_greedy|decoding=lantern semantics=reference temperature=0"
  "lantern_ref_sampled|decoding=lantern semantics=reference delta=0.4"
  "lantern_pp|decoding=lantern_pp"
  "lantern_pp_det|decoding=lantern_pp draft.candidates=deterministic"
  "sjd|decoding=sjd"
  "sjd_greedy|decoding=sjd temperature=0"
  "sjd_reuse_horizon|decoding=sjd reuse=0.3 init=horizon"
  "gsd|decoding=gsd"
  "gsd_greedy|decoding=gsd temperature=0"
  "sjd_mc|decoding=sjd coupling=mc"
  "sjd_gumbel|decoding=sjd coupling=gumbel"
  "sjd_pp|decoding=sjd_pp"
  "vvs|decoding=vvs"
  "vvs_bounded|decoding=vvs semantics=bounded skip_interval=null"
  "zipar|decoding=zipar window=4"
  "eagle_static_paths|decoding=eagle draft=static_paths"
)
for entry in "${settings[@]}"; do
  name=${entry%%|*}
  # shellcheck disable=SC2086
  python run.py ${entry#*|} num_images=4 batch_size="${BATCH:-2}" speedup_baseline=null metrics=none wandb.mode=disabled \
    hydra.run.dir="$out/$name" > "$out/$name.log" 2>&1 || { echo "error: $name failed, see $out/$name.log" >&2; exit 1; }
done
(cd "$out" && find . -name '*.png' ! -name grid.png | sort | xargs sha256sum)
