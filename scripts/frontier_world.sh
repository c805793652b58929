#!/usr/bin/env bash
# The speed-against-fidelity sweep behind results/frontier_world.*: every lossy method over its knob on the
# world, and the lossless ones it is measured against, 6 images at batch 1 each (a small sweep: the machine it
# was made on is shared), then make_tables --frontier over all of them.
#   bash scripts/frontier_world.sh OUT_DIR [results]
# IMAGES (default 6) and WARMUP (untimed batches per run, default 0) size the sweep; AR is interleaved with every
# run (the default baseline). The idle-machine rerun of results/frontier_world.* (results/README.md):
#   IMAGES=20 WARMUP=1 bash scripts/frontier_world.sh ../runs/frontier results
set -euo pipefail
out=${1:?usage: frontier_world.sh OUT_DIR [TABLE_DIR]}
tables=${2:-$out}
common=(num_images="${IMAGES:-6}" batch_size=1 warmup="${WARMUP:-0}" metrics=none wandb.mode=disabled)
sweep() { python run.py -m "${common[@]}" hydra.sweep.dir="$out/$1" "${@:2}"; }
sweep exact decoding=ar,sjd,eagle
sweep lantern decoding=lantern delta=0.1,0.2,0.4
sweep lantern_pp decoding=lantern_pp lambda=1.5,3.0,6.0
sweep gsd decoding=gsd gsd_radius=3,7,15
sweep sjd_pp decoding=sjd_pp sjd_pp_threshold=0.3,0.5,0.8
sweep vvs decoding=vvs skip_interval=2,5,10
sweep sjd_pac decoding=sjd_pac tree_width=1,3,4
python scripts/make_tables.py "$out" --out "$tables" --stem frontier_world --frontier
