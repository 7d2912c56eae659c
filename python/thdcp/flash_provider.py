"""thdcp as a provider of PyTorch's flash attention, through the hook PyTorch 2.11 offers
(torch.nn.attention.register_flash_attention_impl / activate_flash_attention_impl).

Importing thdcp registers the provider "thdcp" and activates nothing (PyTorch asks providers
not to). After

    torch.nn.attention.activate_flash_attention_impl("thdcp")

the CUDA kernels of aten::_flash_attention_forward / _flash_attention_backward are thdcp's for
the calls thdcp takes: ragged self-attention (cumulative lengths given, the same tensor for
queries and keys) with no dropout, which is what torch.nn.attention.varlen.varlen_attn sends
(and SDPA on jagged nested tensors with the flash backend, when queries and keys share their
offsets). Every other call (dense SDPA, cross-attention, dropout) goes to the kernel PyTorch
had, unchanged. restore_flash_attention_impl() undoes it.
"""
import logging
import warnings
from typing import Optional

import torch

from . import arguments, call_shapes
from .ops import _kernel_ready, attention

log = logging.getLogger(__name__)

NAME = "thdcp"
_OP = "flash_provider"
_FORWARD = "aten::_flash_attention_forward"
_BACKWARD = "aten::_flash_attention_backward"


def available() -> bool:
    """Whether the installed PyTorch has the provider hook (torch 2.11 has it)."""
    import torch.nn.attention as nn_attention

    return hasattr(nn_attention, "register_flash_attention_impl") and hasattr(torch.library, "get_kernel")


class _Handle:
    """What activate_flash_attention_impl keeps: the registrations, removed by
    restore_flash_attention_impl."""

    def __init__(self, library: torch.library.Library):
        self.library: Optional[torch.library.Library] = library

    def remove(self) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None


def install(dispatch_key: str = "CUDA") -> _Handle:
    """Registers thdcp's kernels for dispatch_key (PyTorch's activate_flash_attention_impl("thdcp")
    calls this with "CUDA"; the CPU tests pass "CPU", where PyTorch has no flash kernel, to run
    PyTorch's own varlen_attn through thdcp's CPU backend). Returns the handle whose remove()
    unregisters them."""
    originals = (_original_kernel(_FORWARD, dispatch_key), _original_kernel(_BACKWARD, dispatch_key))
    library = torch.library.Library("aten", "IMPL", dispatch_key)  # noqa: TOR901 (overriding is the point)

    def forward(keyset, *args, **kwargs):
        return _forward(originals[0], keyset, *args, **kwargs)

    def backward(keyset, *args, **kwargs):
        return _backward(originals[1], keyset, *args, **kwargs)

    with warnings.catch_warnings():
        # Overriding PyTorch's kernel is what activating a provider asks for; the dispatcher's
        # warning about it would only alarm.
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        library.impl("_flash_attention_forward", forward, dispatch_key, with_keyset=True, allow_override=True)
        library.impl("_flash_attention_backward", backward, dispatch_key, with_keyset=True, allow_override=True)
    return _Handle(library)


def _original_kernel(op: str, dispatch_key: str):
    try:
        return torch.library.get_kernel(op, dispatch_key)
    except RuntimeError:  # no kernel for this key (the CPU): calls thdcp does not take fail
        return None


def declined(query, key, cum_seq_q, cum_seq_k, dropout_p) -> Optional[str]:
    """Why a call stays with PyTorch's kernel, or None when thdcp takes it. Decided from what
    the forward and the backward both see, so the two always agree; host metadata only."""
    if cum_seq_q is None or cum_seq_k is None:
        return "dense call (no cumulative lengths)"
    if dropout_p != 0.0:
        return "dropout_p=%g" % dropout_p
    if query.shape[0] != key.shape[0] or not call_shapes.same_tensor(cum_seq_q, cum_seq_k):
        return "cross-attention (cum_seq_q and cum_seq_k are different tensors)"
    return None


def _hand_back(original, keyset, why, args, kwargs):
    if original is None:
        raise NotImplementedError("thdcp.%s: PyTorch has no kernel of its own here for a call thdcp does not take "
                                  "(%s)" % (_OP, why))
    log.info("thdcp: %s; PyTorch's own flash kernel runs it", why)
    return original.call_boxed(keyset, *args, **kwargs)


def _window(is_causal, window_size_left, window_size_right):
    window = (-1 if window_size_left is None else window_size_left,
              -1 if window_size_right is None else window_size_right)
    return call_shapes.flash_window(_OP, bool(is_causal), window, "(window_size_left, window_size_right)")


def _forward(original, keyset, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
             return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None, seqused_k=None,
             alibi_slopes=None):
    why = declined(query, key, cum_seq_q, cum_seq_k, dropout_p)
    if why is not None:
        return _hand_back(original, keyset, why,
                          (query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                           return_debug_mask),
                          dict(scale=scale, window_size_left=window_size_left, window_size_right=window_size_right,
                               seqused_k=seqused_k, alibi_slopes=alibi_slopes))
    # The backward sees none of these, so a call that has them cannot go to either kernel
    # consistently: refused, with the way back to PyTorch's kernel.
    back = "call torch.nn.attention.restore_flash_attention_impl() to use PyTorch's kernel"
    if return_debug_mask:
        call_shapes.refuse(_OP, "return_debug_mask", return_debug_mask, "pass False, or " + back)
    if seqused_k is not None:
        call_shapes.refuse(_OP, "seqused_k", seqused_k, "pass None, or " + back)
    if alibi_slopes is not None:
        call_shapes.refuse(_OP, "alibi_slopes", alibi_slopes, "pass None, or " + back)
    out, lse = attention(query, key, value, cum_seq_q, window=_window(is_causal, window_size_left, window_size_right),
                         softmax_scale=scale, return_lse=True)
    # What PyTorch's flash kernel returns besides: a zero RNG state and offset (no dropout),
    # an empty debug mask.
    rng_state = torch.zeros((2,), dtype=torch.uint64, device=query.device)
    philox_offset = torch.zeros((), dtype=torch.uint64, device=query.device)
    return out, lse, rng_state, philox_offset, query.new_empty((0,))


def _backward(original, keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
              dropout_p, is_causal, rng_state, unused, *, scale=None, window_size_left=None, window_size_right=None):
    why = declined(query, key, cum_seq_q, cum_seq_k, dropout_p)
    if why is not None:
        return _hand_back(original, keyset, why,
                          (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                           is_causal, rng_state, unused),
                          dict(scale=scale, window_size_left=window_size_left, window_size_right=window_size_right))
    left, right = _window(is_causal, window_size_left, window_size_right)
    # The autograd formula of thdcp.attention, on the forward's saved tensors.
    dq, dk, dv, _ = torch.ops.thdcp.attention_backward(_kernel_ready(grad_out), query, key, value, out, logsumexp,
                                                      cum_seq_q, cum_seq_q, left, right,
                                                      arguments.softmax_scale(_OP, scale), True)
    return dq, dk, dv


def register() -> bool:
    """Registers the provider "thdcp" with PyTorch (no activation). Returns False, doing
    nothing, on a PyTorch without the hook."""
    if not available():
        return False
    torch.nn.attention.register_flash_attention_impl(NAME, register_fn=install)
    return True
