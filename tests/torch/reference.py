"""Float64 PyTorch references for the thdcp torch tests: attention per document on absolute
positions (the mask rule of DESIGN.md section 2) and RoPE."""
import math
import random

import torch


def make_layout(lengths, pad_to=1, extra_padding=0, placeholders=0, generator=None):
    """cu_seqlens, cu_seqlens_padded (int32 CPU) for documents of `lengths`, each padded to a
    multiple of pad_to plus `extra_padding` rows, then `placeholders` zero-length entries."""
    cu, cu_padded = [0], [0]
    for n in lengths:
        padded = -(-n // pad_to) * pad_to + extra_padding if n > 0 else 0
        cu.append(cu[-1] + n)
        cu_padded.append(cu_padded[-1] + padded)
    for _ in range(placeholders):
        cu.append(cu[-1])
        cu_padded.append(cu_padded[-1])
    return torch.tensor(cu, dtype=torch.int32), torch.tensor(cu_padded, dtype=torch.int32)


def attention_reference(q, k, v, cu, cu_padded, window, scale=None, sinks=None):
    """out [T, Hq, D_v] and lse [Hq, T] in float64; padding rows 0 / -inf. The scale defaults
    to 1/sqrt(D_qk). sinks: None or [Hq] logits, a column appended to each row's scores for
    the softmax and dropped before the values (gpt-oss)."""
    q, k, v = q.double(), k.double(), v.double()
    tokens, hq, d = q.shape
    hkv = k.shape[1]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = q.new_zeros((tokens, hq, v.shape[2]))
    lse = torch.full((hq, tokens), -math.inf, dtype=torch.float64, device=q.device)
    left, right = window
    for b in range(len(cu) - 1):
        start, n = int(cu_padded[b]), int(cu[b + 1] - cu[b])
        if n == 0:
            continue
        qs, ks, vs = q[start:start + n], k[start:start + n], v[start:start + n]
        scores = torch.einsum("ihd,jhd->hij", qs, ks) * scale
        i = torch.arange(n, device=q.device).view(n, 1)
        j = torch.arange(n, device=q.device).view(1, n)
        allowed = torch.ones(n, n, dtype=torch.bool, device=q.device)
        if left >= 0:
            allowed &= j >= i - left
        if right >= 0:
            allowed &= j <= i + right
        scores = scores.masked_fill(~allowed, -math.inf)
        if sinks is not None:
            sink_column = sinks.double().to(q.device).view(hq, 1, 1).expand(hq, n, 1)
            row_lse = torch.logsumexp(torch.cat([scores, sink_column], dim=-1), dim=-1)
        else:
            row_lse = torch.logsumexp(scores, dim=-1)  # [h, n]
        probs = torch.exp(scores - row_lse.unsqueeze(-1)).nan_to_num(0.0)
        out[start:start + n] = torch.einsum("hij,jhd->ihd", probs, vs)
        lse[:, start:start + n] = row_lse
    return out, lse


def assert_close_to_reference(out, grads, q, k, v, cu, cu_padded, window, dout):
    """A call's out [T, Hq, D_v] and its gradients of q, k, v (for dout) against
    attention_reference in float64: within 1e-5 for float32 inputs and 2e-2 for 16-bit ones
    (gradients 4x that). Returns the reference LSE [Hq, T]."""
    ref_in = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref, ref_lse = attention_reference(*ref_in, cu.cpu(), cu_padded.cpu(), window)
    tol = 1e-5 if q.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double().cpu(), ref.detach(), rtol=tol, atol=tol)
    for got, expected in zip(grads, torch.autograd.grad(ref, ref_in, dout.double().cpu())):
        torch.testing.assert_close(got.double().cpu(), expected, rtol=tol, atol=tol * 4)
    return ref_lse


def rope_reference(x, cu, cu_padded, theta=10000.0, rotary_dim=0, interleaved=False, positions=None):
    """RoPE of a whole-batch tensor in float64: position = row - sequence start."""
    x = x.double()
    tokens, heads, d = x.shape
    r = d if rotary_dim == 0 else rotary_dim
    if positions is None:
        positions = torch.zeros(tokens, dtype=torch.float64)
        for b in range(len(cu) - 1):
            start, end = int(cu_padded[b]), int(cu_padded[b + 1])
            positions[start:end] = torch.arange(end - start, dtype=torch.float64)
    inv_freq = torch.tensor([theta ** (-2.0 * i / r) for i in range(r // 2)], dtype=torch.float64)
    angle = positions.view(-1, 1).to(torch.float32).double() * inv_freq.view(1, -1)  # [T, r/2]
    cos, sin = angle.cos().unsqueeze(1), angle.sin().unsqueeze(1)
    y = x.clone()
    if interleaved:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
        y[..., 0:r:2] = x1 * cos - x2 * sin
        y[..., 1:r:2] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., : r // 2], x[..., r // 2: r]
        y[..., : r // 2] = x1 * cos - x2 * sin
        y[..., r // 2: r] = x2 * cos + x1 * sin
    return y


def random_lengths(rng: random.Random, count, low=1, high=80):
    return [rng.randint(low, high) for _ in range(count)]
