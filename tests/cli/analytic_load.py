"""`thdcp run --load` on a case whose result is known in closed form.

Every key equals the same vector, so every visible key gets the same score s = scale * q.k
and the softmax is uniform over the n_i keys query i sees:
    out_i = mean of v_j over visible j,   lse_i = s_i + log(n_i),
    dv_j  = sum over queries i that see j of dout_i / n_i,
    dS_ij = (dout_i . v_j - dout_i . out_i) / n_i,  dq_i = scale * k * sum_j dS_ij = 0,
    dk_j  = scale * sum_i dS_ij q_i.
The layout (lengths 5, 7, 3, 1 back to back) is not aligned to 2*cp, so thdcp must re-pad it
and map every output back. Usage: analytic_load.py THDCP WORKDIR
"""
import math
import os
import random
import subprocess
import sys

import npy_min

thdcp, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
inp, out_dir = os.path.join(work, "in"), os.path.join(work, "out")
os.makedirs(inp, exist_ok=True)

lengths = [5, 7, 3, 1]
window_left, window_right = 3, 1
H, HKV, D = 2, 1, 8
T = sum(lengths)
rng = random.Random(5)
key = [rng.uniform(-1, 1) for _ in range(D)]
q = [[[rng.uniform(-1, 1) for _ in range(D)] for _ in range(H)] for _ in range(T)]
k = [[list(key) for _ in range(HKV)] for _ in range(T)]
v = [[[rng.uniform(-1, 1) for _ in range(D)] for _ in range(HKV)] for _ in range(T)]
dout = [[[rng.uniform(-1, 1) for _ in range(D)] for _ in range(H)] for _ in range(T)]
# Round to float32 so Python and thdcp start from the same numbers.
f32 = lambda x: __import__("struct").unpack("<f", __import__("struct").pack("<f", x))[0]
for t in (q, k, v, dout):
    for row in t:
        for head in row:
            head[:] = [f32(x) for x in head]
flat = lambda t: [x for row in t for head in row for x in head]
npy_min.write(os.path.join(inp, "q.npy"), "<f4", (T, H, D), flat(q))
npy_min.write(os.path.join(inp, "k.npy"), "<f4", (T, HKV, D), flat(k))
npy_min.write(os.path.join(inp, "v.npy"), "<f4", (T, HKV, D), flat(v))
npy_min.write(os.path.join(inp, "dout.npy"), "<f4", (T, H, D), flat(dout))
cu = [0]
for n in lengths:
    cu.append(cu[-1] + n)
npy_min.write(os.path.join(inp, "cu_seqlens.npy"), "<i8", (len(cu),), cu)

run = subprocess.run([thdcp, "run", "--load", inp, "--cp", "2", "--window", "%d,%d" % (window_left, window_right),
                      "--save", out_dir, "--check"], capture_output=True, text=True)
print(run.stdout[-600:], run.stderr[-600:])
if run.returncode != 0:
    sys.exit("thdcp run failed with exit code %d" % run.returncode)

scale = 1.0 / math.sqrt(D)
dot = lambda a, b: sum(x * y for x, y in zip(a, b))
exp_out = [[[0.0] * D for _ in range(H)] for _ in range(T)]
exp_lse = [[0.0] * T for _ in range(H)]
exp_dq = [[[0.0] * D for _ in range(H)] for _ in range(T)]
exp_dk = [[[0.0] * D for _ in range(HKV)] for _ in range(T)]
exp_dv = [[[0.0] * D for _ in range(HKV)] for _ in range(T)]
for b, n in enumerate(lengths):
    start = cu[b]
    for h in range(H):
        for i in range(n):
            seen = [j for j in range(n) if i - window_left <= j <= i + window_right]
            o = [sum(v[start + j][0][d] for j in seen) / len(seen) for d in range(D)]
            exp_out[start + i][h] = o
            exp_lse[h][start + i] = scale * dot(q[start + i][h], key) + math.log(len(seen))
            delta = dot(dout[start + i][h], o)
            for j in seen:
                ds = (dot(dout[start + i][h], v[start + j][0]) - delta) / len(seen)
                for d in range(D):
                    exp_dv[start + j][0][d] += dout[start + i][h][d] / len(seen)
                    exp_dk[start + j][0][d] += scale * ds * q[start + i][h][d]

failures = []
def check(name, expected, atol):
    descr, shape, got = npy_min.read(os.path.join(out_dir, name + ".npy"))
    want = flat(expected) if isinstance(expected[0][0], list) else [x for row in expected for x in row]
    if len(got) != len(want):
        failures.append("%s: %d values, expected %d (shape %s)" % (name, len(got), len(want), shape))
        return
    worst = max(abs(a - b) for a, b in zip(got, want))
    print("%-4s shape %-12s max |thdcp - closed form| = %.3g" % (name, shape, worst))
    if not worst <= atol:
        failures.append("%s: max error %.3g over %.3g" % (name, worst, atol))

check("out", exp_out, 1e-5)
check("lse", exp_lse, 1e-5)
check("dq", exp_dq, 1e-5)
check("dk", exp_dk, 1e-5)
check("dv", exp_dv, 1e-5)
if failures:
    sys.exit("\n".join(failures))
print("analytic case: PASS")
