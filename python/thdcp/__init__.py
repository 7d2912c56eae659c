"""thdcp: attention over packed variable-length sequences (the THD layout), with context
parallelism and CUDA graphs, for PyTorch.

    import thdcp
    out = thdcp.attention(q, k, v, cu_seqlens)            # causal, [T, H, D] tensors
    out = thdcp.attention(q, k, v, cu_seqlens, window=(4096, 0))

The operators are registered with TORCH_LIBRARY (torch.ops.thdcp.*), with fake
implementations and autograd formulas, so they trace under torch.compile(fullgraph=True) and
run inside torch.cuda.graph. CUDA tensors run the CUDA kernels; CPU tensors run the reference
backend.

Familiar call shapes over the same attention: thdcp.varlen_attn (PyTorch's varlen_attn),
thdcp.flash_attn_varlen_func (FlashAttention's), thdcp.te.DotProductAttention
(TransformerEngine's THD arguments); torch.nn.attention.activate_flash_attention_impl("thdcp")
hands PyTorch's own varlen_attn to thdcp.
"""
import ctypes as _ctypes
import os as _os

import torch as _torch

_LIBRARY = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "libthdcp_torch.so")
if not _os.path.exists(_LIBRARY):
    raise ImportError(
        "thdcp: the native library %s is missing: install the package with "
        "'pip install .' from the thdcp repository (README, PyTorch)" % _LIBRARY
    )
# The C++ runtime into the global scope first, so that the library's references to it bind
# there: on some machines the module also carries weak copies of std::ostream members, and a
# module loaded RTLD_LOCAL that binds to those gets private facet ids and crashes formatting
# a number (seen on the GPU machine: every error message with a number in it).
try:
    _ctypes.CDLL("libstdc++.so.6", mode=_ctypes.RTLD_GLOBAL)
except OSError:
    pass
_torch.ops.load_library(_LIBRARY)

from .ops import attention, rope  # noqa: E402
from .cp import Communicator, cp_attention, cp_layout, cp_merge, cp_rank_rows, cp_split  # noqa: E402
from .graphs import GraphBank, StaticBatch  # noqa: E402
from .planning import CapacityPlan, capacity_layout, choose_cp_size, default_capacity, plan_capacity  # noqa: E402
from .varlen import varlen_attn  # noqa: E402
from .flash_attn import flash_attn_varlen_func  # noqa: E402
from . import te  # noqa: E402
from . import flash_provider as _flash_provider  # noqa: E402

_flash_provider.register()  # torch.nn.attention.activate_flash_attention_impl("thdcp") turns it on

__version__ = "0.2.0"


def built_with_cuda() -> bool:
    """Whether the CUDA operators were built (PyTorch with CUDA and thdcp's CUDA parts)."""
    return bool(_torch.ops.thdcp.built_with_cuda())


__all__ = [
    "attention",
    "rope",
    "Communicator",
    "cp_attention",
    "cp_layout",
    "cp_merge",
    "cp_rank_rows",
    "cp_split",
    "GraphBank",
    "StaticBatch",
    "CapacityPlan",
    "capacity_layout",
    "choose_cp_size",
    "default_capacity",
    "plan_capacity",
    "built_with_cuda",
    "varlen_attn",
    "flash_attn_varlen_func",
    "te",
]
