"""Runs `thdcp run ...` and checks that its peak resident memory (which it reports from
getrusage) stays within its own estimate, made before the run, plus a margin:
    check_memory.py RATIO SLACK_MIB THDCP ARGS...
With cp ranks in one process, a rank that kept its own copy of the global outputs (issue 10,
class 3) takes cp times their size and breaks this bound."""
import re
import subprocess
import sys

ratio, slack = float(sys.argv[1]), float(sys.argv[2])
run = subprocess.run(sys.argv[3:], capture_output=True, text=True)
print(run.stdout[-2000:], run.stderr[-2000:])
if run.returncode != 0:
    sys.exit(f"thdcp exited with {run.returncode}")
m = re.search(r"host memory: peak ([0-9.]+) MiB \(estimated ([0-9.]+) MiB", run.stdout)
if not m:
    sys.exit("no 'host memory' line in the output")
peak, estimate = float(m.group(1)), float(m.group(2))
limit = ratio * estimate + slack
print(f"peak {peak:.1f} MiB, estimate {estimate:.1f} MiB, limit {limit:.1f} MiB")
sys.exit(0 if peak <= limit else f"peak {peak:.1f} MiB exceeds {ratio} x estimate + {slack} MiB = {limit:.1f} MiB")
