#!/usr/bin/env bash
# The speed-against-fidelity sweep behind results/frontier_world.*: AR and `+experiment=frontier` on the world (every
# method of experiments/experiment/frontier/ at its three settings: lossy ones at their realised TV, in closed form or
# by the Monte Carlo audit over every image, exact ones at TV 0), IMAGES images at batch 1 each with AR interleaved,
# then make_tables --frontier over all of them. Run it on an idle machine: the speed-ups are the figure.
#   bash scripts/frontier_world.sh OUT_DIR [results]
# IMAGES (default 6) and WARMUP (untimed batches per run, default 0) size the sweep; AR is interleaved with every
# run (the default baseline); the Monte Carlo audit reruns each step AUDIT_RERUNS times (even, default 1024) on the
# first AUDIT_IMAGES images of each run (default: every image).
# The idle-machine rerun of results/frontier_world.* (results/README.md):
#   IMAGES=20 WARMUP=1 bash scripts/frontier_world.sh ../runs/frontier results
# Bad arguments (none, more than two, a file where a folder goes): one `error:` line, exit 2, nothing written.
set -euo pipefail
usage="bash scripts/frontier_world.sh OUT_DIR [TABLE_DIR]"
fail() { echo "error: $*" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || fail "expected OUT_DIR and an optional TABLE_DIR, got $# arguments: $usage"
folder() {  # $1: the argument's name, $2: its value; a folder, or a path whose nearest existing part is one
  local path=$2
  [ -n "$path" ] || fail "$1='': expected a folder (made if missing): $usage"
  case $path in *\\* | *'${'*) fail "$1='$2': expected a path without \\ or \${ (Hydra would read them)" ;; esac
  while [ ! -e "$path" ] && [ "$path" != "$(dirname -- "$path")" ]; do path=$(dirname -- "$path"); done
  [ -d "$path" ] || fail "$1='$2': $path is a file; expected a folder (made if missing)"
  [ -w "$path" ] || fail "$1='$2': $path is not writable; expected a folder this user can write to"
}
count() {  # $1: the variable's name, $2: its value, $3: the least allowed
  [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] && [ "$2" -le 100000 ] || fail "$1='$2': expected an integer in [$3, 100000]"
}
count IMAGES "${IMAGES:-6}" 1
count WARMUP "${WARMUP:-0}" 0
count AUDIT_RERUNS "${AUDIT_RERUNS:-1024}" 4
[ $(( ${AUDIT_RERUNS:-1024} % 2 )) -eq 0 ] || fail "AUDIT_RERUNS='$AUDIT_RERUNS': expected an even integer in [4, 100000]"
[ -z "${AUDIT_IMAGES:-}" ] || count AUDIT_IMAGES "$AUDIT_IMAGES" 1
folder OUT_DIR "$1"
folder TABLE_DIR "${2:-$1}"
out=$(realpath -m -- "$1")
tables=$(realpath -m -- "${2:-$1}")
cd "$(dirname -- "$0")/.."  # run.py and scripts/ from anywhere; the folders were made absolute above
common=(num_images="${IMAGES:-6}" batch_size=1 warmup="${WARMUP:-0}" metrics=none wandb.mode=disabled)
quoted=${out//\'/\\\'}  # quoted for Hydra: a comma or a space in the path is part of it
sweep() { python run.py -m "${common[@]}" hydra.sweep.dir="'$quoted/$1'" "${@:2}"; }
sweep ar decoding=ar
sweep grid +experiment=frontier model=fashion_t2i tv_audit.reruns="${AUDIT_RERUNS:-1024}" tv_audit.images="${AUDIT_IMAGES:-null}"
python scripts/make_tables.py "$out" --out "$tables" --stem frontier_world --frontier
