"""thdcp.te.DotProductAttention, TransformerEngine's THD arguments (issue 29): the bits of
thdcp.attention with the translated arguments (output [T, H*D], max_logit, gradients), the
float64 reference, the mask types and TransformerEngine's window rules, pad_between_seqs
explicit, tensor-parallel head counts, what is refused, and the CP group: one rank runs on the
CPU through gloo; more ranks map onto thdcp.cp_attention (checked here by its arguments, and on
GPUs by tests/torch/cp_worker.py)."""
import math
import warnings

import pytest
import torch

import thdcp
from reference import assert_close_to_reference, make_layout

te = thdcp.te


def batch(lengths=(29, 1, 50, 8), hq=4, hkv=2, d=32, pad_to=1, extra_padding=0, dtype=torch.float32, device="cpu",
          seed=0):
    cu, cu_padded = make_layout(list(lengths), pad_to=pad_to, extra_padding=extra_padding)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(int(cu_padded[-1]), h, d, generator=g).to(dtype).to(device) for h in (hq, hkv, hkv))
    return q, k, v, cu.to(device), cu_padded.to(device)


# (attn_mask_type, window_size, thdcp's window)
MASKS = [("padding_causal", None, (-1, 0)), ("causal", (16, 0), (16, 0)), ("padding", None, (-1, -1)),
         ("no_mask", (5, 3), (5, 3)), ("padding,causal", (-1, 0), (-1, 0)),
         ("padding_causal_bottom_right", (4, 0), (4, 0))]


@pytest.mark.parametrize("mask,window_size,window", MASKS)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 1)])
def test_module_is_thdcp_attention_bit_for_bit_and_matches_the_reference(device, mask, window_size, window, hq, hkv):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    d = 64
    q, k, v, cu, cu_padded = batch(hq=hq, hkv=hkv, d=d, pad_to=4, extra_padding=2, dtype=dtype, device=device)
    module = te.DotProductAttention(hq, d, num_gqa_groups=hkv, attn_mask_type=mask, window_size=window_size)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = module(*leaves, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded,
                 cu_seqlens_kv_padded=cu_padded, max_seqlen_q=50, max_seqlen_kv=50, pad_between_seqs=True)
    assert out.shape == (q.shape[0], hq * d)  # TransformerEngine's THD output
    same = [t.clone().requires_grad_() for t in (q, k, v)]
    want = thdcp.attention(*same, cu, cu_padded, window=window, softmax_scale=1.0 / math.sqrt(d))
    assert torch.equal(out, want.reshape(q.shape[0], -1))
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    grads = torch.autograd.grad(out, leaves, dout)
    for got, expected in zip(grads, torch.autograd.grad(want, same, dout.view(want.shape))):
        assert torch.equal(got, expected)
    assert_close_to_reference(out.view(want.shape), grads, q, k, v, cu, cu_padded, window, dout.view(want.shape))


def test_mask_type_spellings_and_forward_overrides():
    q, k, v, cu, _ = batch()
    layout = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu)
    causal = te.DotProductAttention(4, 32, 2, attn_mask_type="padding_causal")(q, k, v, **layout)
    for spelling in ("causal", "causal,padding", "causal_padding", "padding,causal", "causal_bottom_right"):
        assert torch.equal(te.DotProductAttention(4, 32, 2, attn_mask_type=spelling)(q, k, v, **layout), causal)
    full = te.DotProductAttention(4, 32, 2, attn_mask_type="padding")(q, k, v, **layout)
    assert torch.equal(te.DotProductAttention(4, 32, 2, attn_mask_type="no_mask")(q, k, v, **layout), full)
    module = te.DotProductAttention(4, 32, 2, attn_mask_type="padding_causal")
    # The module keeps the causal window (-1, 0), which "padding" turns into (-1, -1), warning
    # as TransformerEngine does.
    with pytest.warns(UserWarning, match="taken as"):
        assert torch.equal(module(q, k, v, attn_mask_type="padding", **layout), full)
    assert torch.equal(module(q, k, v, window_size=(3, 0), **layout),
                       thdcp.attention(q, k, v, cu, window=(3, 0), softmax_scale=1 / math.sqrt(32)).flatten(1))
    assert not torch.equal(causal, full)


@pytest.mark.parametrize("mask,window_size,window", [("padding_causal", (-1, -1), (-1, 0)),
                                                      ("causal", (5, 3), (5, 0)), ("padding", (-1, 0), (-1, -1))])
def test_window_sizes_that_do_not_fit_the_mask_are_changed_with_a_warning_as_transformer_engine_does(mask, window_size,
                                                                                                      window):
    with pytest.warns(UserWarning, match="as TransformerEngine does"):
        module = te.DotProductAttention(4, 32, 2, attn_mask_type=mask, window_size=window_size)
    assert module.window_size == window
    q, k, v, cu, _ = batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once, at construction
        out = module(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert torch.equal(out, thdcp.attention(q, k, v, cu, window=window, softmax_scale=1 / math.sqrt(32)).flatten(1))


def test_pad_between_seqs_is_explicit():
    q, k, v, cu, cu_padded = batch(pad_to=8, extra_padding=1)
    module = te.DotProductAttention(4, 32, 2, attn_mask_type="padding_causal")
    layout = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded, cu_seqlens_kv_padded=cu_padded)
    want = thdcp.attention(q, k, v, cu, cu_padded, softmax_scale=1 / math.sqrt(32)).flatten(1)
    assert torch.equal(module(q, k, v, pad_between_seqs=True, **layout), want)
    # TransformerEngine infers the flag from whether the padded tensors are the unpadded ones;
    # thdcp reads the rows from the padded offsets whatever the flag, and asks for it.
    with pytest.raises(ValueError, match="pad_between_seqs=None is not supported: with cu_seqlens_q_padded given, say"):
        module(q, k, v, **layout)
    with pytest.raises(ValueError, match="pad_between_seqs=True is not supported: padding between sequences needs"):
        module(q[:int(cu[-1])], k[:int(cu[-1])], v[:int(cu[-1])], cu_seqlens_q=cu, cu_seqlens_kv=cu,
               pad_between_seqs=True)
    with pytest.raises(ValueError, match="cu_seqlens_kv_padded=None is not supported"):
        module(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded, pad_between_seqs=True)
    with pytest.raises(ValueError, match="pad_between_seqs=1 is not supported|pad_between_seqs=1; pass True"):
        module(q, k, v, pad_between_seqs=1, **layout)
    # Tail padding only (TransformerEngine #3331): False, and the rows past the last sequence are 0.
    tail = torch.tensor(cu.tolist()[:-1] + [q.shape[0]], dtype=torch.int32)
    out = module(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=tail, cu_seqlens_kv_padded=tail,
                 pad_between_seqs=False)
    assert torch.equal(out, thdcp.attention(q, k, v, cu, tail, softmax_scale=1 / math.sqrt(32)).flatten(1))
    assert torch.count_nonzero(out[int(cu[-1]):]) == 0


def test_return_max_logit_softmax_scale_kv_channels_and_tensor_parallel_heads():
    q, k, v, cu, _ = batch(hq=4, hkv=2)
    # 8 query and 4 key/value heads over tp 2: this rank holds 4 and 2.
    module = te.DotProductAttention(8, (32, 32), num_gqa_groups=4, tp_size=2, softmax_scale=0.1, return_max_logit=True)
    out, max_logit = module(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=50, max_seqlen_kv=50)
    want, want_max = thdcp.attention(q, k, v, cu, softmax_scale=0.1, return_max_logit=True)
    assert torch.equal(out, want.flatten(1)) and torch.equal(max_logit, want_max)
    assert "num_attention_heads=8" in repr(module)


def test_softmax_types_are_thdcp_sinks_and_softmax_offset_learns(device):
    # "off-by-one": sinks of 0; "learnable": the module's softmax_offset as sinks, its gradient
    # thdcp's d(sinks). Both the bits of thdcp.attention(sinks=...), forward and backward.
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    d = 64 if device == "cuda" else 32  # a head dim the CUDA kernels serve
    q, k, v, cu, _ = batch(hq=4, hkv=2, d=d, dtype=dtype, device=device)
    g = torch.Generator().manual_seed(3)
    for softmax_type in ("off-by-one", "learnable"):
        module = te.DotProductAttention(4, d, num_gqa_groups=2, softmax_type=softmax_type).to(device)
        if softmax_type == "learnable":
            assert module.softmax_offset.shape == (4,) and module.softmax_offset.dtype == torch.float32
            with torch.no_grad():
                module.softmax_offset.copy_(torch.randn(4, generator=g) * 2)
            sinks = module.softmax_offset.detach().clone().requires_grad_()
        else:
            assert module.softmax_offset is None and not list(module.parameters())
            sinks = torch.zeros(4, dtype=torch.float32, device=device)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = module(*leaves, cu_seqlens_q=cu, cu_seqlens_kv=cu)
        same = [t.clone().requires_grad_() for t in (q, k, v)]
        want = thdcp.attention(*same, cu, softmax_scale=1.0 / math.sqrt(d), sinks=sinks)
        assert torch.equal(out, want.flatten(1))
        plain = thdcp.attention(*[t.detach() for t in (q, k, v)], cu, softmax_scale=1.0 / math.sqrt(d))
        assert not torch.equal(out.detach(), plain.flatten(1)), "the sinks changed nothing"
        dout = torch.randn(out.shape, generator=g).to(dtype).to(device)
        inputs = leaves + ([module.softmax_offset] if softmax_type == "learnable" else [])
        wanted = same + ([sinks] if softmax_type == "learnable" else [])
        for got, expected in zip(torch.autograd.grad(out, inputs, dout),
                                 torch.autograd.grad(want, wanted, dout.view(want.shape))):
            assert torch.equal(got, expected)


REFUSED_AT_CONSTRUCTION = [
    (dict(attention_dropout=0.1), "attention_dropout=0.1 is not supported"),
    (dict(qkv_format="sbhd"), "qkv_format='sbhd' is not supported"),
    (dict(attention_type="cross"), "attention_type='cross' is not supported"),
    (dict(softmax_type="sink"), "softmax_type='sink' is not a TransformerEngine softmax type"),
    (dict(attn_mask_type="arbitrary"), "attn_mask_type='arbitrary' is not supported"),
    (dict(attn_mask_type="sliding"), "attn_mask_type='sliding' is not a TransformerEngine mask type"),
    (dict(window_size=(-1, 3)), "window_size=(-1, 3) does not fit attn_mask_type='causal'"),
    (dict(attn_mask_type="padding", window_size=(4, -1)), "window_size=(4, -1) does not fit"),
    (dict(num_gqa_groups=3), "num_attention_heads=4 is not a multiple of num_gqa_groups=3"),
    (dict(cp_group=[None, None]), "cp_group=[None, None] is not supported"),
    (dict(softmax_scale=0.0), "softmax_scale=0.0"),
]


@pytest.mark.parametrize("change,message", REFUSED_AT_CONSTRUCTION)
def test_constructor_refuses_by_name(change, message):
    with pytest.raises(ValueError) as error:
        te.DotProductAttention(**dict(dict(num_attention_heads=4, kv_channels=32), **change))
    assert str(error.value).startswith("thdcp.") and message in str(error.value), str(error.value)


REFUSED_IN_FORWARD = [
    (dict(attention_mask=torch.zeros(4, 1, 1, 50, dtype=torch.bool)), "attention_mask=<tensor bool [4, 1, 1, 50]>"),
    (dict(qkv_format="bshd"), "qkv_format='bshd' is not supported"),
    (dict(core_attention_bias_type="post_scale_bias"), "core_attention_bias_type='post_scale_bias' is not supported"),
    (dict(core_attention_bias=torch.zeros(1)), "core_attention_bias=<tensor float32 [1]> is not supported"),
    (dict(alibi_slopes=torch.ones(4)), "alibi_slopes=<tensor float32 [4]> is not supported"),
    (dict(inference_params=object()), "inference_params=<object object"),
    (dict(fp8_output=True), "fp8_output=True is not supported"),
    (dict(cu_seqlens_kv=None), "cu_seqlens_kv=None is not supported"),
    (dict(cu_seqlens_kv=torch.tensor([0, 29, 30, 79, 88], dtype=torch.int32)),
     "cu_seqlens_kv differs from cu_seqlens_q"),
    (dict(max_seqlen_q=50.5), "max_seqlen_q=50.5 is not an integer"),
    (dict(attn_mask_type="arbitrary"), "attn_mask_type='arbitrary' is not supported"),
    (dict(query_layer="heads"),
     "query_layer has shape [88, 2, 32]; with qkv_format='thd' this module takes [T, 4, 32]"),
    (dict(key_layer="rows"), "query_layer has 88 rows but key_layer has 80"),
]


@pytest.mark.parametrize("change,message", REFUSED_IN_FORWARD)
def test_forward_refuses_by_name(change, message):
    q, k, v, cu, _ = batch()
    args = dict(query_layer=q, key_layer=k, value_layer=v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    change = dict(change)
    if change.get("query_layer") == "heads":
        change["query_layer"] = q[:, :2]
    if change.get("key_layer") == "rows":
        change.update(key_layer=k[:80], value_layer=v[:80])
    args.update(change)
    with pytest.raises(ValueError) as error:
        te.DotProductAttention(4, 32, 2)(**args)
    assert str(error.value).startswith("thdcp.te.DotProductAttention: ") and message in str(error.value), \
        str(error.value)


def test_a_cp_group_of_one_rank_runs_single_device_attention_on_the_cpu():
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed, not yet initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        q, k, v, cu, cu_padded = batch(pad_to=2)
        module = te.DotProductAttention(4, 32, 2, attn_mask_type="padding_causal")
        # Megatron hands over its configured comm type even at CP size 1: nothing to refuse.
        module.set_context_parallel_group(dist.group.WORLD, [0], None, cp_comm_type="p2p")
        out = module(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded,
                     cu_seqlens_kv_padded=cu_padded, pad_between_seqs=True)
        assert torch.equal(out, thdcp.attention(q, k, v, cu, cu_padded, softmax_scale=1 / math.sqrt(32)).flatten(1))
    finally:
        dist.destroy_process_group()


def test_a_cp_group_of_several_ranks_maps_onto_cp_attention(monkeypatch):
    # thdcp's CP runs over NCCL on GPUs (tests/torch/cp_worker.py runs this module there); here
    # the call it makes is checked: this rank's rows, the global layout, the group, the mask.
    calls = []

    def recording_cp_attention(q, k, v, cu_seqlens, cu_seqlens_padded, **options):
        calls.append((q, k, v, cu_seqlens, cu_seqlens_padded, options))
        out = q.new_ones((q.shape[0], q.shape[1], v.shape[2]))
        return (out, torch.zeros(q.shape[1])) if options["return_max_logit"] else out

    monkeypatch.setattr(te, "_group_size", lambda group: 2)
    monkeypatch.setattr(te, "cp_attention", recording_cp_attention)
    group = object()
    with pytest.raises(ValueError, match="cp_comm_type='p2p' is not supported: .*pass 'all_gather' or 'a2a'"):
        te.DotProductAttention(4, 32, 2, cp_group=group, cp_comm_type="p2p")
    with pytest.raises(ValueError, match=r"cp_comm_type='a2a\+p2p' is not supported"):
        te.DotProductAttention(4, 32, 2).set_context_parallel_group(group, [0, 1], None, "a2a+p2p")
    # a2a: all-to-all CP, heads per rank multiples of the group's size.
    with pytest.raises(ValueError, match="cp_comm_type='a2a' is not supported: all-to-all CP shards the heads over "
                                         "the 2 ranks of cp_group, but num_gqa_groups per tensor-parallel rank is 1"):
        te.DotProductAttention(4, 32, 1).set_context_parallel_group(group, [0, 1], None, "a2a")
    a2a = te.DotProductAttention(4, 32, 2, attn_mask_type="padding_causal", cp_group=group, cp_comm_type="a2a")
    module = te.DotProductAttention(4, 32, 2, attn_mask_type="padding_causal", window_size=(64, 0))
    module.set_context_parallel_group(group, [0, 1], None, "all_gather")
    cu, cu_padded = thdcp.cp_layout([29, 1, 50], 2)
    rows = int(cu_padded[-1]) // 2
    q, k, v = (torch.randn(rows, h, 32) for h in (4, 2, 2))
    out = module(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded,
                 cu_seqlens_kv_padded=cu_padded, pad_between_seqs=True)
    assert out.shape == (rows, 4 * 32)
    (cq, ck, cv, c_cu, c_padded, options), = calls
    assert cq is q and ck is k and cv is v and c_cu is cu and c_padded is cu_padded
    assert options == dict(group=group, window=(64, 0), softmax_scale=1 / math.sqrt(32), return_max_logit=False,
                           sinks=None)
    # No padded offsets: the valid lengths are the layout (each a multiple of 2 cp).
    module(q, k, v, cu_seqlens_q=cu_padded, cu_seqlens_kv=cu_padded)
    assert calls[1][3] is cu_padded and calls[1][4] is cu_padded
    # cp_comm_type="a2a" is cp_attention's all-to-all CP, on the same rows and layout.
    a2a(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded, cu_seqlens_kv_padded=cu_padded,
        pad_between_seqs=True)
    assert calls[2][5]["cp_comm"] == "all_to_all" and calls[2][0] is q and calls[2][4] is cu_padded
