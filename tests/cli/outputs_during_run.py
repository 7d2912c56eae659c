#!/usr/bin/env python3
"""outputs_during_run.py CASE THDCP WORKDIR: what `thdcp run` leaves when its outputs are
disturbed while staged (issue 28, class 5). The test-only hook THDCP_TEST_PAUSE_BEFORE_COMMIT
holds the staged outputs before the commit (until a signal or the end of its standard input);
the test then
  sigint:   sends SIGINT (a new --save directory and a --json file staged): the process ends by
            SIGINT and leaves nothing, no DIR.tmp-*, no run.json.tmp;
  sigterm:  sends SIGTERM (--save into an existing directory holding an older q.npy): the
            process ends by SIGTERM; the directory holds exactly what it held;
  changed:  makes the --json path a directory: exit 2 naming it, and --save was not
            committed either (all outputs or none).
"""
import os
import shutil
import signal
import subprocess
import sys

case, thdcp, work = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
save = os.path.join(work, "saved")
json_file = os.path.join(work, "run.json")
if case == "sigterm":
    os.makedirs(save)
    with open(os.path.join(save, "q.npy"), "w") as f:
        f.write("older run")
before = sorted(os.listdir(work))
env = dict(os.environ, THDCP_TEST_PAUSE_BEFORE_COMMIT="60")
command = [thdcp, "run", "--backend", "cpu", "--tokens", "64", "--cp", "2", "--heads", "1:1", "--head-dim", "8",
           "--save", save, "--json", json_file]
proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        text=True)


def fail(message):
    print("FAIL:", message)
    proc.kill()
    sys.exit(1)


lines = []
for line in proc.stderr:
    lines.append(line)
    if "test hook: outputs staged" in line:
        break
else:
    fail("the hook line never came; stderr:\n" + "".join(lines))
staged = sorted(os.listdir(work))
print("staged:", staged, sorted(os.listdir(save)) if os.path.isdir(save) else "")
if case == "sigint":
    proc.send_signal(signal.SIGINT)
elif case == "sigterm":
    proc.send_signal(signal.SIGTERM)
elif case == "changed":
    os.makedirs(json_file)
    proc.stdin.close()  # the hook goes on
else:
    fail("unknown case " + case)
try:
    rest = proc.stderr.read()
    code = proc.wait(timeout=60)
except subprocess.TimeoutExpired:
    fail("still running 60 s after the signal")
print(rest.strip())
left = sorted(os.listdir(work))
print("exit", code, "left:", left)
if case in ("sigint", "sigterm"):
    expected = -signal.SIGINT if case == "sigint" else -signal.SIGTERM
    if code != expected:
        fail("expected to end by signal %d, got exit %s" % (-expected, code))
    if left != before:
        fail("left behind: %s (before the run: %s)" % (left, before))
    if case == "sigterm":
        inside = sorted(os.listdir(save))
        with open(os.path.join(save, "q.npy")) as f:
            older = f.read()
        if inside != ["q.npy"] or older != "older run":
            fail("the existing --save directory changed: %s, q.npy %r" % (inside, older[:20]))
else:
    if code != 2:
        fail("expected exit 2, got %s" % code)
    if "run.json': changed during the run" not in rest or "nothing was written" not in rest:
        fail("the message does not name run.json and say that nothing was written")
    if left != ["run.json"] or os.listdir(json_file):
        fail("left behind: %s" % left)
print("ok:", case)
