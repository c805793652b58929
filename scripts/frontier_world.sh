#!/usr/bin/env bash
# The speed-against-fidelity sweep behind results/frontier_world.*: AR and `+experiment=frontier` on the world (every
# method of experiments/experiment/frontier/ at its three settings: lossy ones at their realised TV, in closed form or
# by the Monte Carlo audit over all 6 images, exact ones at TV 0), 6 images at batch 1 each with AR interleaved, then
# make_tables --frontier over all of them. Run it on an idle machine: the speed-ups are the figure.
#   bash scripts/frontier_world.sh OUT_DIR [results]
set -euo pipefail
out=${1:?usage: frontier_world.sh OUT_DIR [TABLE_DIR]}
tables=${2:-$out}
common=(num_images=6 batch_size=1 warmup=0 metrics=none wandb.mode=disabled)
sweep() { python run.py -m "${common[@]}" hydra.sweep.dir="$out/$1" "${@:2}"; }
sweep ar decoding=ar
sweep grid +experiment=frontier model=fashion_t2i tv_audit.reruns=1024 tv_audit.images=null
python scripts/make_tables.py "$out" --out "$tables" --stem frontier_world --frontier
