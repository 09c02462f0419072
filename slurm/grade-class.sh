#!/usr/bin/env bash
# Grade a class on a Slurm cluster, from the course's root on a login node:
#
#   slurm/grade-class.sh SUBMISSIONS N [OUT]
#
# submits a job array of N tasks, task K grading shard K/N of SUBMISSIONS (`grader grade
# --shard K/N`, every task with the same seed) into OUT/shards/K, then one job that starts when
# every task has ended (however it ended) and merges them into OUT (`grader merge`), writing the
# class's reports exactly as one unsharded run would. OUT defaults to build/grades/<the folder
# graded>. The course's environment (.venv/, or PYTHON=...) and the submissions must be on a
# filesystem the compute nodes share. Resources per task are in slurm/grade-shard.sbatch;
# sbatch reads further options from SBATCH_* variables (SBATCH_PARTITION, SBATCH_ACCOUNT...).
# SEED=... fixes the seed (default: a random one, printed); DEVICE=cuda grades on the nodes' GPU
# (default cpu: every task grades on one kind of device, whatever node it lands on).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ] || ! [ "$2" -ge 1 ] 2>/dev/null; then
    echo "usage: slurm/grade-class.sh SUBMISSIONS N [OUT]   (N: the number of array tasks)" >&2
    exit 2
fi
subs=$1 n=$2 out=${3:-build/grades/$(basename "$(realpath "$1")")}
seed=${SEED:-$(( (RANDOM << 15 | RANDOM) ))}
python=${PYTHON:-.venv/bin/python} device=${DEVICE:-cpu}
if [ -e "$out/shards" ]; then  # (shards of an earlier run would be merged with these)
    echo "$out/shards exists, from an earlier run: remove it, or give another OUT" >&2
    exit 2
fi
mkdir -p "$out/slurm"
array=$(sbatch --parsable --job-name=grade-shard --array="1-$n" \
    --output="$out/slurm/shard-%a.log" slurm/grade-shard.sbatch "$python" "$subs" "$n" "$seed" \
    "$out/shards" "$device")
merge=$(sbatch --parsable --job-name=grade-merge --dependency="afterany:${array%%;*}" \
    --output="$out/slurm/merge.log" \
    --wrap="$(printf '%q' "$python") -m grader merge $(printf '%q' "$out")/shards/* --out $(printf '%q' "$out")")
echo "seed $seed, $device: job array ${array%%;*} grades $subs in $n shards; job ${merge%%;*} merges" \
    "them into $out (logs: $out/slurm/)"
