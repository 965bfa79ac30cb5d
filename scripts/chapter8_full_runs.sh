#!/usr/bin/env bash
# Chapter 8's full runs on a GPU machine. Each run writes its record with
# lib.utils.write_record under book/results/08-training-<run>/: metrics.json (metrics,
# configuration, samples, wall time, GPU, torch and Triton versions, commit, command), one
# CSV per curve and curves.png; the chapter shows them. Checkpoints go to
# $CHECKPOINTS/08-training-<run>/ (default /tmp/tfs-checkpoints), one at each evaluation;
# RESUME=1 continues interrupted runs from the newest intact one. Then the training-step
# benchmark (eager vs compiled, with and without activation checkpointing: speed, MFU,
# peak memory).
#
#   scripts/chapter8_full_runs.sh            # every GPU of this machine (torchrun when > 1)
#   RUNS="gpt t5" RESUME=1 scripts/chapter8_full_runs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export TFS_PROFILE=full
n_gpus=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$n_gpus" -eq 0 ]; then
    echo "no CUDA GPU here: the full runs are meant for a GPU (on a CPU: python -m lib.runs --run gpt --profile smoke)" >&2
    exit 1
elif [ "$n_gpus" -gt 1 ]; then
    launch=(torchrun --standalone --nproc_per_node="$n_gpus" -m lib.runs --)
else
    launch=(python -m lib.runs)
fi
resume=()
if [ "${RESUME:-0}" = 1 ]; then
    resume=(--resume)
fi
for run in ${RUNS:-gpt bert t5}; do
    "${launch[@]}" --run "$run" --profile full \
        --checkpoint-dir "${CHECKPOINTS:-/tmp/tfs-checkpoints}/08-training-$run" "${resume[@]}"
done
python bench/bench_training.py --profile full --compile | tee book/results/08-training-bench.txt
