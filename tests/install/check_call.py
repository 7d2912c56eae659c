"""One CPU call of the installed thdcp against plain PyTorch (run in the clean venv).

Causal GQA attention over four packed documents (lengths 37, 1, 64, 100), forward and
backward: in float32 within 2e-5, and in bf16 within FlashAttention's rule (the error at most
twice that of the same computation in plain PyTorch at bf16, plus 1e-3), both against a
float64 reference of scaled_dot_product_attention per document.
"""
import sys

import torch

import thdcp

LENGTHS, Q_HEADS, KV_HEADS, HEAD_DIM = [37, 1, 64, 100], 4, 2, 64


def reference(q, k, v, cu):
    """SDPA per document, causal, K/V heads repeated for GQA (in the inputs' dtype)."""
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        qs, ks, vs = (t[s:e].transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
        out[s:e] = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1)
    return out


def forward_backward(fn, tensors, dout):
    tensors = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*tensors)
    out.backward(dout.to(out.dtype))
    return [out.detach().double()] + [t.grad.double() for t in tensors]


def main():
    torch.manual_seed(0)
    cu = torch.tensor([0] + list(torch.tensor(LENGTHS).cumsum(0)), dtype=torch.int32)
    rows = int(cu[-1])
    q = torch.randn(rows, Q_HEADS, HEAD_DIM, dtype=torch.float64)
    k = torch.randn(rows, KV_HEADS, HEAD_DIM, dtype=torch.float64)
    v = torch.randn(rows, KV_HEADS, HEAD_DIM, dtype=torch.float64)
    dout = torch.randn(rows, Q_HEADS, HEAD_DIM, dtype=torch.float64)
    exact = forward_backward(lambda *t: reference(*t, cu), (q, k, v), dout)
    names = ["out", "dq", "dk", "dv"]
    failed = False
    for dtype in (torch.float32, torch.bfloat16):
        inputs = [t.to(dtype) for t in (q, k, v)]
        got = forward_backward(lambda *t: thdcp.attention(*t, cu, window=(-1, 0)), inputs, dout)
        plain = forward_backward(lambda *t: reference(*t, cu), inputs, dout)
        for name, g, p, x in zip(names, got, plain, exact):
            error = (g - x).abs().max().item()
            bound = 2e-5 if dtype == torch.float32 else 2 * (p - x).abs().max().item() + 1e-3
            ok = error <= bound
            failed |= not ok
            print("%-8s %-4s max error %.2e (bound %.2e) %s" % (str(dtype).split(".")[1], name, error, bound,
                                                               "ok" if ok else "FAIL"))
    print("thdcp %s from %s" % (thdcp.__version__, thdcp.__file__))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
