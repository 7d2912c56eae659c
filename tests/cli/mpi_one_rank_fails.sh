#!/usr/bin/env bash
# mpi_one_rank_fails.sh CASE MPIEXEC NP_FLAG THDCP SAMPLE_LENGTHS: under mpirun, one rank of two
# fails before the run while the other is ready (issue 28, class 4). The job must end within
# 60 s (before: the ready rank waited in its first collective forever), mpirun exits 2, the
# failing rank's message is printed once, tagged with its rank, and no rank ran the job.
#   CASE rank0 / rank1: that rank's command line says --tokens 0 (MPMD: -np 1 A : -np 1 B);
#   CASE output: both say --json /nonexistent/run.json, which only rank 0 checks and writes;
#   CASE command: rank 1 runs `thdcp plan`, which has no collective; rank 0 says so.
set -u
case=$1; mpiexec=$2; np=$3; thdcp=$4; sample=$5
good=(run --backend cpu --tokens 64 --heads 1:1 --head-dim 8)
bad=(run --backend cpu --tokens 0 --heads 1:1 --head-dim 8)
regex="--tokens '0': must be in \[1, 2147483647\]"
tag="(rank 1)"
case $case in
  rank0) command=("$np" 1 "$thdcp" "${bad[@]}" : "$np" 1 "$thdcp" "${good[@]}"); tag="(rank 0)" ;;
  rank1) command=("$np" 1 "$thdcp" "${good[@]}" : "$np" 1 "$thdcp" "${bad[@]}") ;;
  output) command=("$np" 2 "$thdcp" "${good[@]}" --json /nonexistent/run.json)
          regex="--json '/nonexistent/run.json': its directory '/nonexistent' does not exist"; tag="(rank 0)" ;;
  command) command=("$np" 1 "$thdcp" "${good[@]}" : "$np" 1 "$thdcp" plan --lengths "$sample")
           regex="rank 1 ran a command that takes no part in this run's collectives"; tag="(rank 0)" ;;
  *) echo "unknown case $case"; exit 1 ;;
esac
start=$(date +%s)
output=$(timeout 60 "$mpiexec" "${command[@]}" 2>&1)
status=$?
elapsed=$(( $(date +%s) - start ))
printf '%s\n' "$output" | grep -v '^ \|^--\|^$' | tail -n 6
if [ "$status" -eq 124 ]; then echo "FAIL: still running after 60 s (a rank waits for one that stopped)"; exit 1; fi
if [ "$status" -ne 2 ]; then echo "FAIL: expected exit code 2, got $status"; exit 1; fi
count=$(printf '%s\n' "$output" | grep -c -- "$regex")
if [ "$count" -ne 1 ]; then echo "FAIL: the message /$regex/ was printed $count times, not once"; exit 1; fi
if ! printf '%s\n' "$output" | grep -- "$regex" | grep -qF "thdcp: error $tag: "; then
  echo "FAIL: the message is not tagged $tag"; exit 1
fi
if printf '%s\n' "$output" | grep -q "result: "; then echo "FAIL: a rank ran the job"; exit 1; fi
# The ranks agreed and exited; none had to end the job with MPI_Abort.
if printf '%s\n' "$output" | grep -q "MPI_ABORT"; then echo "FAIL: a rank aborted the job"; exit 1; fi
echo "ok: exit 2 after ${elapsed} s, the message printed once by $tag"
