"""thdcp.te.DotProductAttention: TransformerEngine's DotProductAttention call shape for the THD
format (its constructor, set_context_parallel_group and forward arguments) over
thdcp.attention, and over thdcp.cp_attention when a CP group of more than one rank is set.

    attn = thdcp.te.DotProductAttention(32, 128, num_gqa_groups=8, attn_mask_type="padding_causal")
    out = attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=m, max_seqlen_kv=m)   # [T, H*D]

The padded layout is explicit: pad_between_seqs is never inferred. TransformerEngine infers
it: from tensor identity today, so a value-equal copy of the offsets takes its padded path
(TransformerEngine #3487), and before that from values that ignored tail padding, which
computed wrong results (#3331).
"""
import math
import warnings
from typing import Optional, Sequence, Tuple

import torch

from . import arguments, call_shapes
from .cp import cp_attention
from .ops import attention

_OP = "te.DotProductAttention"
_CAUSAL = ("causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right")
_FULL = ("no_mask", "padding")


def mask_window(op: str, attn_mask_type: str, window_size: Optional[Sequence[int]]) -> Tuple[int, int]:
    """TransformerEngine's (attn_mask_type, window_size) as thdcp's window, by its rules
    (check_set_window_size): a causal type takes (-1, 0) or (W, 0), and turns (-1, -1) or
    (W, R != 0) into (W, 0) with a warning; "no_mask" / "padding" take (-1, -1) or (W >= 0,
    R >= 0), and turn (-1, 0) into (-1, -1) with a warning. In THD the padding is always
    cu_seqlens', so "causal" and "padding_causal" are one mask (TransformerEngine itself
    asks for the padding forms with THD), and for self-attention "bottom_right" changes
    nothing."""
    mask = _mask_type(op, attn_mask_type)
    if window_size is None:
        return (-1, 0) if mask in _CAUSAL else (-1, -1)
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError("thdcp.%s: window_size=%s; pass (left, right) or None"
                         % (op, call_shapes.describe(window_size)))
    left = arguments.integer(op, "window_size[0]", window_size[0], -1, arguments.INT32_MAX)
    right = arguments.integer(op, "window_size[1]", window_size[1], -1, arguments.INT32_MAX)
    if mask in _CAUSAL:
        if (left, right) == (-1, -1) or (left >= 0 and right != 0):
            warnings.warn("thdcp.%s: window_size=%s with attn_mask_type=%r; taken as (%d, 0), as TransformerEngine "
                          "does" % (op, (left, right), mask, left))
            return left, 0
        if right != 0:
            raise ValueError("thdcp.%s: window_size=%s does not fit attn_mask_type=%r: pass (-1, 0) or (W >= 0, 0)"
                             % (op, (left, right), mask))
        return left, 0
    if (left, right) == (-1, 0):
        warnings.warn("thdcp.%s: window_size=(-1, 0) with attn_mask_type=%r; taken as (-1, -1), as TransformerEngine "
                      "does: use a causal attn_mask_type for a causal mask" % (op, mask))
        return -1, -1
    if (left, right) != (-1, -1) and (left < 0 or right < 0):
        raise ValueError("thdcp.%s: window_size=%s does not fit attn_mask_type=%r: pass (-1, -1) or (W >= 0, R >= 0)"
                         % (op, (left, right), mask))
    return left, right


def _mask_type(op: str, attn_mask_type: str) -> str:
    if not isinstance(attn_mask_type, str):
        raise ValueError("thdcp.%s: attn_mask_type=%s; pass a string such as 'padding_causal'"
                         % (op, call_shapes.describe(attn_mask_type)))
    mask = attn_mask_type.replace(",", "_")
    if mask == "causal_padding":
        mask = "padding_causal"
    if mask == "arbitrary":
        call_shapes.refuse(op, "attn_mask_type", attn_mask_type,
                           "thdcp's masks are windows on positions within each sequence, not a mask tensor: "
                           "pass 'padding_causal' or 'padding' with a window_size")
    if mask not in _CAUSAL + _FULL:
        raise ValueError("thdcp.%s: attn_mask_type=%r is not a TransformerEngine mask type: pass one of %s"
                         % (op, attn_mask_type, ", ".join(repr(m) for m in _CAUSAL + _FULL)))
    return mask


def _group_size(group) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


class DotProductAttention(torch.nn.Module):
    """transformer_engine.pytorch.DotProductAttention's arguments for qkv_format="thd",
    computed by thdcp.attention (or thdcp.cp_attention under CP): the same bits as those calls
    with the translated arguments.

    num_attention_heads, kv_channels (int, or (D_qk, D_v)), num_gqa_groups (None: MHA):
    the heads of the whole layer; with tensor parallelism (tp_size, or tp_group's size) each
    rank holds num_attention_heads / tp query and num_gqa_groups / tp key/value heads.
    attn_mask_type: "causal", "padding_causal" (the same in THD), their "_bottom_right" forms
    (the same in self-attention), "no_mask", "padding". window_size: (left, right) or None,
    checked against the mask as TransformerEngine does. softmax_scale: None for
    1/sqrt(kv_channels). return_max_logit: forward returns (out, max_logit [H]).
    softmax_type: "vanilla"; "off-by-one" (every row's softmax denominator gains exp(0 - m),
    an attention sink of 0); "learnable" (a sink per query head this rank holds, the module's
    parameter softmax_offset, float32 [H/tp], zero at construction, trained through
    thdcp's d(sinks)).
    cp_group, cp_global_ranks, cp_stream, cp_comm_type: as set_context_parallel_group.
    Taken and not needed: layer_number, sequence_parallel and get_rng_state_tracker (they
    matter for dropout), bottom_right_diagonal, name.
    Refused (ValueError naming the argument): attention_dropout > 0, qkv_format other than
    "thd" (the default here, where TransformerEngine's is "sbhd"), attention_type "cross",
    a softmax_type other than those three, attn_mask_type "arbitrary".
    """

    def __init__(
        self,
        num_attention_heads: int,
        kv_channels,
        num_gqa_groups: Optional[int] = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "thd",
        attn_mask_type: str = "causal",
        window_size: Optional[Tuple[int, int]] = None,
        bottom_right_diagonal: Optional[bool] = None,
        sequence_parallel: bool = False,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        tp_group=None,
        layer_number: Optional[int] = None,
        attention_type: str = "self",
        cp_group=None,
        cp_global_ranks: Optional[Sequence[int]] = None,
        cp_stream=None,
        cp_comm_type: str = "all_gather",
        softmax_scale: Optional[float] = None,
        softmax_type: str = "vanilla",
        return_max_logit: bool = False,
        name: Optional[str] = None,
    ) -> None:
        super().__init__()
        op = _OP
        heads = arguments.integer(op, "num_attention_heads", num_attention_heads, 1, arguments.INT32_MAX)
        groups = heads if num_gqa_groups is None else arguments.integer(op, "num_gqa_groups", num_gqa_groups, 1,
                                                                           arguments.INT32_MAX)
        if heads % groups != 0:
            raise ValueError("thdcp.%s: num_attention_heads=%d is not a multiple of num_gqa_groups=%d: pass a divisor"
                             % (op, heads, groups))
        channels = kv_channels if isinstance(kv_channels, (tuple, list)) else (kv_channels, kv_channels)
        if len(channels) != 2:
            raise ValueError("thdcp.%s: kv_channels=%r; pass the head size, or (D_qk, D_v)" % (op, kv_channels))
        self.head_dim_qk = arguments.integer(op, "kv_channels", channels[0], 1, arguments.INT32_MAX)
        self.head_dim_v = arguments.integer(op, "kv_channels", channels[1], 1, arguments.INT32_MAX)
        tp = _group_size(tp_group) if tp_group is not None else arguments.integer(op, "tp_size", tp_size, 1,
                                                                                     arguments.INT32_MAX)
        if heads % tp != 0 or groups % tp != 0:
            raise ValueError("thdcp.%s: num_attention_heads=%d and num_gqa_groups=%d do not split over tp=%d ranks"
                             % (op, heads, groups, tp))
        self.num_attention_heads, self.num_gqa_groups = heads, groups
        self.heads_per_rank, self.groups_per_rank = heads // tp, groups // tp
        if float(attention_dropout) != 0.0:
            call_shapes.refuse(op, "attention_dropout", attention_dropout,
                               "thdcp has no attention dropout: pass 0.0")
        self.qkv_format = _thd(op, qkv_format)
        self.attn_mask_type = _mask_type(op, attn_mask_type)
        self.window_size = mask_window(op, self.attn_mask_type, window_size)
        if attention_type != "self":
            call_shapes.refuse(op, "attention_type", attention_type,
                               "thdcp does self-attention only: pass 'self'")
        if softmax_type not in ("vanilla", "off-by-one", "learnable"):
            raise ValueError("thdcp.%s: softmax_type=%s is not a TransformerEngine softmax type: pass 'vanilla', "
                             "'off-by-one' or 'learnable'" % (op, call_shapes.describe(softmax_type)))
        self.softmax_type = softmax_type
        self.softmax_offset = (torch.nn.Parameter(torch.zeros(self.heads_per_rank, dtype=torch.float32))
                               if softmax_type == "learnable" else None)
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(self.head_dim_qk)
        arguments.softmax_scale(op, softmax_scale)
        self.softmax_scale = float(softmax_scale)
        self.return_max_logit = bool(return_max_logit)
        self.layer_number = layer_number
        self.cp_group = None
        self.cp_comm_type = "all_gather"
        self.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    def extra_repr(self) -> str:
        return ("num_attention_heads=%d, num_gqa_groups=%d, kv_channels=(%d, %d), attn_mask_type=%r, window_size=%s, "
                "cp_comm_type=%r" % (self.num_attention_heads, self.num_gqa_groups, self.head_dim_qk, self.head_dim_v,
                                     self.attn_mask_type, self.window_size, self.cp_comm_type))

    def set_context_parallel_group(self, cp_group, cp_global_ranks: Optional[Sequence[int]] = None, cp_stream=None,
                                   cp_comm_type: str = "all_gather") -> None:
        """The CP group of the next forwards (None: no CP). cp_comm_type for a group of more
        than one rank: "all_gather" (thdcp's AllGather CP) or "a2a" (its all-to-all CP:
        num_attention_heads and num_gqa_groups per tensor-parallel rank multiples of the group's
        size); "p2p" and "a2a+p2p" are refused. cp_global_ranks and cp_stream are taken and not
        needed (thdcp makes its communicator from the group and runs its collectives on its own
        stream)."""
        op = _OP
        if isinstance(cp_group, (list, tuple)):
            call_shapes.refuse(op, "cp_group", cp_group,
                               "thdcp's CP runs over one group: pass one process group")
        size = _group_size(cp_group) if cp_group is not None else 1
        if size > 1 and cp_comm_type not in ("all_gather", "a2a"):
            call_shapes.refuse(op, "cp_comm_type", cp_comm_type,
                               "thdcp's CP all-gathers K/V or exchanges heads all-to-all: pass 'all_gather' or 'a2a'")
        if size > 1 and cp_comm_type == "a2a":
            for name, heads in (("num_attention_heads", self.heads_per_rank), ("num_gqa_groups", self.groups_per_rank)):
                if heads % size != 0:
                    call_shapes.refuse(op, "cp_comm_type", cp_comm_type,
                                       "all-to-all CP shards the heads over the %d ranks of cp_group, but %s per "
                                       "tensor-parallel rank is %d, not a multiple of %d: pass 'all_gather'"
                                       % (size, name, heads, size))
        self.cp_group = cp_group
        self.cp_global_ranks = cp_global_ranks
        self.cp_stream = cp_stream
        self.cp_comm_type = cp_comm_type

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask=None,
        qkv_format: Optional[str] = None,
        cu_seqlens_q: Optional[torch.Tensor] = None,
        cu_seqlens_kv: Optional[torch.Tensor] = None,
        cu_seqlens_q_padded: Optional[torch.Tensor] = None,
        cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
        max_seqlen_q: Optional[int] = None,
        max_seqlen_kv: Optional[int] = None,
        attn_mask_type: Optional[str] = None,
        window_size: Optional[Tuple[int, int]] = None,
        bottom_right_diagonal: Optional[bool] = None,
        checkpoint_core_attention: bool = False,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: Optional[torch.Tensor] = None,
        alibi_slopes: Optional[torch.Tensor] = None,
        fast_zero_fill: bool = True,
        inference_params=None,
        pad_between_seqs: Optional[bool] = None,
        fp8_output: bool = False,
    ):
        """query_layer [T, H/tp, D_qk], key_layer [T, G/tp, D_qk], value_layer [T, G/tp, D_v]:
        the whole batch, or under CP this rank's rows in dual-chunk order (thdcp.cp_split).
        cu_seqlens_q, cu_seqlens_kv: int32 [B + 1] valid lengths (the global layout under
        CP), one layout (self-attention). cu_seqlens_q_padded, cu_seqlens_kv_padded: where
        each sequence sits, last entry T (under CP every padded length a multiple of 2 cp).
        pad_between_seqs: say it whenever padded offsets are passed: True when sequences have
        padding rows after them, False when only the tail is padded; either way thdcp reads
        the rows from the padded offsets and attends the valid ones, and padding rows come
        out 0. None is taken only with no padded offsets. max_seqlen_q / _kv: ints or None,
        not needed. qkv_format, attn_mask_type, window_size: override the constructor's.
        Taken and not needed: checkpoint_core_attention (the backward keeps only q, k, v, out
        and the LSE), fast_zero_fill (padding rows are always 0), bottom_right_diagonal.
        Returns out [T, H/tp * D_v] (TransformerEngine's THD output), and max_logit [H/tp]
        when the module was made with return_max_logit.
        """
        op = _OP
        _thd(op, self.qkv_format if qkv_format is None else qkv_format)
        self._refuse_unsupported(attention_mask, core_attention_bias_type, core_attention_bias, alibi_slopes,
                                 inference_params, fp8_output)
        self._check_heads(query_layer, key_layer, value_layer)
        cu_seqlens, cu_seqlens_padded = self._layout(query_layer, key_layer, cu_seqlens_q, cu_seqlens_kv,
                                                     cu_seqlens_q_padded, cu_seqlens_kv_padded, pad_between_seqs)
        call_shapes.max_seqlens(op, (("max_seqlen_q", max_seqlen_q), ("max_seqlen_kv", max_seqlen_kv)), optional=True)
        mask = self.attn_mask_type if attn_mask_type is None else _mask_type(op, attn_mask_type)
        window = mask_window(op, mask, self.window_size if window_size is None else window_size)
        options = dict(window=window, softmax_scale=self.softmax_scale, return_max_logit=self.return_max_logit,
                       sinks=self._sinks(query_layer))
        if self.cp_group is not None and _group_size(self.cp_group) > 1:
            if self.cp_comm_type == "a2a":
                options["cp_comm"] = "all_to_all"
            result = cp_attention(query_layer, key_layer, value_layer, cu_seqlens,
                                  cu_seqlens if cu_seqlens_padded is None else cu_seqlens_padded,
                                  group=self.cp_group, **options)
        else:
            result = attention(query_layer, key_layer, value_layer, cu_seqlens, cu_seqlens_padded, **options)
        out, max_logit = result if self.return_max_logit else (result, None)
        out = out.reshape(out.shape[0], -1)
        return (out, max_logit) if self.return_max_logit else out

    def _sinks(self, query_layer):
        """The attention sinks of softmax_type: None, zeros ("off-by-one"), or the learnable
        softmax_offset (the caller moves the module to the inputs' device, as for any layer)."""
        if self.softmax_type == "off-by-one":
            return torch.zeros(self.heads_per_rank, dtype=torch.float32, device=query_layer.device)
        return self.softmax_offset

    def _refuse_unsupported(self, attention_mask, core_attention_bias_type, core_attention_bias, alibi_slopes,
                            inference_params, fp8_output):
        op = _OP
        if attention_mask is not None:
            call_shapes.refuse(op, "attention_mask", attention_mask,
                               "in THD the sequences are cu_seqlens_q's: pass None")
        if core_attention_bias_type != "no_bias" or core_attention_bias is not None:
            name, value = ("core_attention_bias_type", core_attention_bias_type)
            if core_attention_bias_type == "no_bias":
                name, value = "core_attention_bias", core_attention_bias
            call_shapes.refuse(op, name, value, "thdcp adds no bias to the scores: pass 'no_bias' and None")
        call_shapes.no_alibi(op, alibi_slopes)
        if inference_params is not None:
            call_shapes.refuse(op, "inference_params", inference_params,
                               "thdcp has no KV cache (it is for training on packed batches): pass None")
        if fp8_output:
            call_shapes.refuse(op, "fp8_output", fp8_output, "thdcp's output has the inputs' dtype: pass False")

    def _check_heads(self, query_layer, key_layer, value_layer):
        for name, tensor, heads, head_dim in (("query_layer", query_layer, self.heads_per_rank, self.head_dim_qk),
                                              ("key_layer", key_layer, self.groups_per_rank, self.head_dim_qk),
                                              ("value_layer", value_layer, self.groups_per_rank, self.head_dim_v)):
            if tensor.dim() != 3 or tensor.shape[1] != heads or tensor.shape[2] != head_dim:
                raise ValueError(
                    "thdcp.%s: %s has shape %s; with qkv_format='thd' this module takes [T, %d, %d] "
                    "(num_attention_heads, num_gqa_groups and kv_channels as constructed, per tensor-parallel rank)"
                    % (_OP, name, list(tensor.shape), heads, head_dim))

    def _layout(self, query_layer, key_layer, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                pad_between_seqs):
        """(cu_seqlens, cu_seqlens_padded or None) from TransformerEngine's four layout tensors."""
        op = _OP
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            missing = "cu_seqlens_q" if cu_seqlens_q is None else "cu_seqlens_kv"
            call_shapes.refuse(op, missing, None, "qkv_format='thd' needs the valid lengths: pass int32 [B + 1] "
                               "prefix sums (the same tensor for both)")
        cu_seqlens = call_shapes.self_attention(op, query_layer, key_layer, cu_seqlens_q, cu_seqlens_kv,
                                                ("query_layer", "key_layer", "cu_seqlens_q", "cu_seqlens_kv"))
        if pad_between_seqs is not None and not isinstance(pad_between_seqs, bool):
            raise ValueError("thdcp.%s: pad_between_seqs=%s; pass True, False or None"
                             % (op, call_shapes.describe(pad_between_seqs)))
        if cu_seqlens_q_padded is None and cu_seqlens_kv_padded is None:
            if pad_between_seqs:
                call_shapes.refuse(op, "pad_between_seqs", pad_between_seqs,
                                   "padding between sequences needs where they sit: pass cu_seqlens_q_padded and "
                                   "cu_seqlens_kv_padded (the same tensor), or pad_between_seqs=False")
            return cu_seqlens, None
        if cu_seqlens_q_padded is None or cu_seqlens_kv_padded is None:
            missing = "cu_seqlens_q_padded" if cu_seqlens_q_padded is None else "cu_seqlens_kv_padded"
            call_shapes.refuse(op, missing, None, "thdcp does self-attention only: pass cu_seqlens_q_padded and "
                               "cu_seqlens_kv_padded, the same tensor, or neither")
        if pad_between_seqs is None:
            call_shapes.refuse(op, "pad_between_seqs", None,
                               "with cu_seqlens_q_padded given, say pad_between_seqs=True (padding after sequences) "
                               "or False (tail padding only): thdcp infers nothing from which tensors were passed")
        cu_seqlens_padded = call_shapes.one_layout(op, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                                                   ("cu_seqlens_q_padded", "cu_seqlens_kv_padded"))
        return cu_seqlens, cu_seqlens_padded


def _thd(op: str, qkv_format) -> str:
    if qkv_format != "thd":
        call_shapes.refuse(op, "qkv_format", qkv_format,
                           "thdcp takes packed sequences: pass 'thd' ([T, H, D] tensors with cu_seqlens)")
    return qkv_format
