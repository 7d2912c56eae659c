"""The argument checks every door of the package goes through: the operators' entry points
(attention, rope, cp_attention), their fake implementations, and the host helpers.

- Tensors on one device. A meta tensor among real ones is refused: the dispatcher picks the
  highest-priority backend of all the inputs and Meta outranks CPU and CUDA, so such a call
  would run the fake implementation and return uninitialised memory. The fake
  implementations compute only when every tensor is on one device (all meta, or all fake
  tensors of one device under FakeTensorMode / torch.compile). Only host metadata
  (tensor.device) is read: nothing syncs or allocates, so the checks trace and capture.
- Integers that are integers (Python ints, numpy and one-element CPU torch integers; never a
  bool or a float such as 1.7) inside the range the C++ side takes, so nothing is truncated
  on the way (a CP size of 2**32 + 1 is not 1).

Bad input raises ValueError naming the argument, its value and what to pass, as the C++
side's argument errors do.
"""
import operator
from typing import Iterable, List, Optional, Sequence, Tuple

import torch

INT32_MAX = 2**31 - 1  # C++ int: CP sizes, ranks, max_seqs, window sides
INT64_MAX = 2**63 - 1  # C++ int64_t: token and row counts, document lengths


def check_devices(op: str, tensors: Sequence[Tuple[str, Optional[torch.Tensor]]]) -> None:
    """Refuses tensors on different devices. tensors: (name, tensor or None) pairs, the first
    the one the others follow (q, x)."""
    reference_name, reference = tensors[0]
    device = reference.device
    for name, tensor in tensors[1:]:
        if tensor is None or tensor.device == device:
            continue
        if device.type == "meta":  # the reference is the stray one: name it
            _device_error(op, reference_name, device, name, tensor.device)
        _device_error(op, name, tensor.device, reference_name, device)


def _device_error(op: str, name: str, device: torch.device, reference_name: str, reference: torch.device):
    hint = " (a tensor left on meta by deferred initialisation?)" if device.type == "meta" else ""
    raise ValueError("thdcp.%s: %s is on %s but %s is on %s: move %s to %s%s"
                     % (op, name, device, reference_name, reference, name, reference, hint))


def check_host_tensor(op: str, name: str, tensor: torch.Tensor) -> None:
    """Refuses a meta tensor where the values are read on the host (a layout)."""
    if tensor.device.type == "meta":
        raise ValueError("thdcp.%s: %s is on meta and has no values to read: pass the real tensor "
                         "(a tensor left on meta by deferred initialisation?)" % (op, name))


def integer(op: str, name: str, value, low: int, high: int) -> int:
    """value as a Python int, refused (ValueError) unless it is an integer in [low, high]."""
    if type(value) is int:  # the common case, cheap
        number = value
    elif isinstance(value, torch.SymInt):  # a dynamic int under torch.compile: guards, no sync
        number = value
    else:
        number = _as_int(op, name, value, low, high)
    if number < low or number > high:
        raise ValueError("thdcp.%s: %s=%s is out of range: pass an int in [%d, %d]" % (op, name, number, low, high))
    return number


def _as_int(op: str, name: str, value, low: int, high: int) -> int:
    refused = isinstance(value, bool) or type(value).__name__ in ("bool", "bool_")
    if isinstance(value, torch.Tensor):
        # Reading a device tensor would synchronise (and break a capture).
        refused = refused or value.dtype == torch.bool or value.device.type != "cpu"
    if not refused:
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise ValueError("thdcp.%s: %s=%r is not an integer: pass an int in [%d, %d]" % (op, name, value, low, high))


def integers(op: str, name: str, values: Iterable, low: int, high: int) -> List[int]:
    """Each of values through integer(), named name[i]."""
    return [integer(op, "%s[%d]" % (name, i), value, low, high) for i, value in enumerate(values)]


def cp_size(op: str, value, name: str = "cp") -> int:
    return integer(op, name, value, 1, INT32_MAX)


def lengths(op: str, values: Iterable, name: str = "lengths") -> List[int]:
    """Document lengths (tokens, >= 0)."""
    return integers(op, name, values, 0, INT64_MAX)


# The CP communications cp_attention runs.
CP_COMMS = ("all_gather", "all_to_all", "a2a+ag")


def cp_comm(op: str, value, name: str = "cp_comm") -> str:
    """The name of a CP communication cp_attention runs: "all_gather", "all_to_all" or "a2a+ag"."""
    if not isinstance(value, str) or value not in CP_COMMS:
        raise ValueError("thdcp.%s: %s=%r is not a CP communication: pass one of %s"
                         % (op, name, value, ", ".join(repr(choice) for choice in CP_COMMS)))
    return value


def a2a_size(op: str, value, comm_name: str) -> int:
    """a2a+ag's all-to-all group (ranks, >= 1), which it needs; None with the other
    communications (which take 1). The group's size is checked by a2a_groups once known."""
    if comm_name != "a2a+ag":
        if value is not None:
            raise ValueError("thdcp.%s: a2a_size=%r is the all-to-all group of cp_comm='a2a+ag', not of cp_comm=%r: "
                             "pass cp_comm='a2a+ag', or leave a2a_size out" % (op, value, comm_name))
        return 1
    if value is None:
        raise ValueError("thdcp.%s: cp_comm='a2a+ag' needs a2a_size: the ranks of an all-to-all group, a divisor of "
                         "the group's size and of both head counts" % op)
    return integer(op, "a2a_size", value, 1, INT32_MAX)


def head_slices(op: str, value, comm_name: str) -> int:
    """Head slices (>= 1: each slice's communication runs beside another slice's attention)
    of all_to_all and all_gather; None takes 1. Whether they divide the heads is checked once
    the group's size is known (head_slices_fit)."""
    if value is None:
        return 1
    slices = integer(op, "head_slices", value, 1, INT32_MAX)
    if slices != 1 and comm_name not in ("all_to_all", "all_gather"):
        raise ValueError("thdcp.%s: head_slices=%d with cp_comm=%r: head slices are all_to_all's and all_gather's; "
                         "pass cp_comm='all_to_all' or 'all_gather', or leave head_slices out"
                         % (op, slices, comm_name))
    return slices


def head_slices_fit(op: str, slices: int, cp: int, q_heads: int, kv_heads: int, comm_name: str = "all_to_all") -> None:
    """Each head slice takes as many query and key heads: under all_to_all of a rank's
    (q_heads / cp, kv_heads / cp), under all_gather of all of them. Slices must divide both."""
    per_rank = comm_name == "all_to_all"
    q, kv = (q_heads // cp, kv_heads // cp) if per_rank else (q_heads, kv_heads)
    if q % slices != 0 or kv % slices != 0:
        fits = [n for n in range(1, kv + 1) if q % n == 0 and kv % n == 0]
        where = (" per rank (%d and %d over %d ranks)" % (q_heads, kv_heads, cp)) if per_rank else ""
        raise ValueError("thdcp.%s: head_slices=%d with %d query and %d key heads%s: each slice takes as many of "
                         "both; pass one of %s" % (op, slices, q, kv, where, ", ".join(str(n) for n in fits)))


def reduce_dtype(op: str, value, q: torch.Tensor) -> str:
    """cp_attention's reduce_dtype: None or torch.float32 (dK/dV partial sums cross ranks in
    fp32) or q's dtype (half the reduce-scatter's bytes); its name for the ops."""
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    if value is None or value is torch.float32:
        return "fp32"
    if value is not q.dtype or value not in names:
        raise ValueError("thdcp.%s: reduce_dtype=%r with q of %s: dK/dV partial sums cross ranks in fp32 or in the "
                         "tensors' dtype; pass None (fp32), torch.float32 or %s" % (op, value, q.dtype, q.dtype))
    return names[value]


def a2a_groups(op: str, size: int, cp: int, q_heads: int, kv_heads: int) -> None:
    """a2a+ag runs cp = a2a_size x ag_size ranks and shards the heads over each all-to-all
    group: a2a_size must divide all three."""
    if cp % size != 0 or q_heads % size != 0 or kv_heads % size != 0:
        fits = [n for n in range(1, cp + 1) if cp % n == 0 and q_heads % n == 0 and kv_heads % n == 0]
        raise ValueError("thdcp.%s: a2a_size=%d with %d ranks, %d query and %d key heads: a2a+ag runs cp = a2a_size x "
                         "ag_size ranks and shards the heads over each all-to-all group, so a2a_size must divide all "
                         "three; pass one of %s" % (op, size, cp, q_heads, kv_heads, fits))


def cp_layout(op: str, value, name: str = "layout") -> str:
    """The name of a CP layout (how the rows are split over the ranks): one of the names the
    C++ library gives (torch.ops.thdcp.cp_layouts(): "dual_chunk", "contiguous")."""
    choices = torch.ops.thdcp.cp_layouts()
    if not isinstance(value, str) or value not in choices:
        raise ValueError("thdcp.%s: %s=%r is not a CP layout: pass one of %s"
                         % (op, name, value, ", ".join(repr(choice) for choice in choices)))
    return value


def window(op: str, value: Sequence[int]) -> Tuple[int, int]:
    """(left, right) keys visible around each query, -1 unbounded."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(
            "thdcp.%s: window=%r; pass (left, right): (-1, 0) causal, (-1, -1) full, (L, 0) causal sliding window"
            % (op, value)
        )
    return (integer(op, "window[0] (left)", value[0], -1, INT32_MAX),
            integer(op, "window[1] (right)", value[1], -1, INT32_MAX))


def softmax_scale(op: str, value: Optional[float]) -> float:
    if value is None:
        return 0.0  # the kernels use 1/sqrt(head_dim)
    scale = float(value)
    if not scale > 0.0:
        raise ValueError("thdcp.%s: softmax_scale=%r; pass a positive scale or None for 1/sqrt(head_dim)"
                         % (op, value))
    return scale


def sinks(op: str, value, q: torch.Tensor, name: str = "sinks") -> torch.Tensor:
    """Attention sinks as the operators take them: a float32 tensor of one logit per query head
    ([Hq], q's heads) on q's device, made contiguous (autograd passes the gradient through).
    Reads metadata only, so it traces and captures."""
    if not isinstance(value, torch.Tensor):
        raise ValueError("thdcp.%s: %s=%r is not a tensor: pass None or a torch.float32 tensor of one logit per "
                         "query head" % (op, name, type(value).__name__))
    if value.dtype != torch.float32:
        raise ValueError("thdcp.%s: %s has dtype %s: pass a torch.float32 tensor (%s.float())"
                         % (op, name, value.dtype, name))
    heads = q.shape[1] if q.dim() == 3 else None
    if value.dim() != 1 or (heads is not None and value.shape[0] != heads):
        raise ValueError("thdcp.%s: %s has shape %s but q has %s query heads: pass one logit per query head, "
                         "shape (%s,)" % (op, name, tuple(value.shape), heads, heads))
    if value.device != q.device:
        _device_error(op, name, value.device, "q", q.device)
    return value.contiguous()
