"""What the package refuses before anything runs (issue 28): tensors on different devices, a
meta tensor among real ones included (the dispatcher would run the fake implementation and
return uninitialised memory), and integers that are not integers or do not fit what the C++
side takes (they would be truncated). Each refusal is a ValueError naming the argument, its
value or device, and the fix. All-meta calls and FakeTensorMode still propagate shapes."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import thdcp
from reference import make_layout

ops = torch.ops.thdcp
META_HINT = "deferred initialisation"


def inputs(requires_grad=True):
    cu, cu_padded = make_layout([5, 9], pad_to=2, extra_padding=1)
    tokens = int(cu_padded[-1])
    g = torch.Generator().manual_seed(28)
    q, k, v = (torch.randn(tokens, h, 16, generator=g).requires_grad_(requires_grad) for h in (2, 1, 1))
    return {"q": q, "k": k, "v": v, "cu_seqlens": cu, "cu_seqlens_padded": cu_padded}


def on_meta(tensor):
    return tensor.detach().to("meta").requires_grad_(tensor.requires_grad)


def expect_device_error(call, stray, device, reference, reference_device):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert "%s is on %s but %s is on %s: move %s to %s" % (stray, device, reference, reference_device, stray,
                                                          reference_device) in message, message
    if device == "meta":
        assert META_HINT in message, message
    return message


# ---- a meta tensor among CPU tensors ----

@pytest.mark.parametrize("name", ["cu_seqlens", "k", "cu_seqlens_padded", "v"])
def test_attention_refuses_a_meta_tensor_among_cpu_tensors(name):
    args = inputs()
    args[name] = on_meta(args[name])
    message = expect_device_error(lambda: thdcp.attention(**args), name, "meta", "q", "cpu")
    assert message.startswith("thdcp.attention:")


def test_attention_names_q_when_q_is_the_meta_tensor():
    args = inputs()
    args["q"] = on_meta(args["q"])
    expect_device_error(lambda: thdcp.attention(**args), "q", "meta", "k", "cpu")


@pytest.mark.parametrize("name", ["cu_seqlens", "k", "cu_seqlens_padded"])
def test_the_forward_op_and_its_autograd_refuse_a_meta_tensor_without_the_python_entry_point(name):
    # torch.ops.thdcp.attention_forward directly: Autograd, then the Meta key (it outranks
    # CPU), so the fake implementation is what sees the mix; it refuses instead of returning
    # uninitialised out / lse (and zero gradients after).
    args = inputs()
    args[name] = on_meta(args[name])
    call = lambda: ops.attention_forward(args["q"], args["k"], args["v"], args["cu_seqlens"],  # noqa: E731
                                         args["cu_seqlens_padded"], -1, 0, 0.0, False)
    expect_device_error(call, name, "meta", "q", "cpu")


@pytest.mark.parametrize("name", ["dout", "lse", "cu_seqlens", "k"])
def test_the_backward_op_refuses_a_meta_tensor(name):
    args = inputs(requires_grad=False)
    out, lse, _ = ops.attention_forward(args["q"], args["k"], args["v"], args["cu_seqlens"],
                                        args["cu_seqlens_padded"], -1, 0, 0.0, False)
    backward = dict(args, dout=torch.randn_like(out), out=out, lse=lse)
    backward[name] = on_meta(backward[name])
    call = lambda: ops.attention_backward(backward["dout"], backward["q"], backward["k"], backward["v"],  # noqa: E731
                                          backward["out"], backward["lse"], backward["cu_seqlens"],
                                          backward["cu_seqlens_padded"], -1, 0, 0.0, True)
    message = expect_device_error(call, name, "meta", "q", "cpu")
    assert message.startswith("thdcp.attention backward:")


def test_autograd_never_runs_a_backward_of_a_refused_forward():
    args = inputs()
    args["cu_seqlens"] = on_meta(args["cu_seqlens"])
    with pytest.raises(ValueError, match="cu_seqlens is on meta"):
        (thdcp.attention(**args) ** 2).sum().backward()
    assert all(args[n].grad is None for n in ("q", "k", "v")), "no gradient was written"


@pytest.mark.parametrize("name", ["cu_seqlens", "cu_seqlens_padded", "start_offsets"])
@pytest.mark.parametrize("door", ["rope", "op forward", "op backward"])
def test_rope_refuses_a_meta_tensor_among_cpu_tensors(name, door):
    args = inputs()
    rope_args = {"x": args["q"], "cu_seqlens": args["cu_seqlens"], "cu_seqlens_padded": args["cu_seqlens_padded"],
                 "start_offsets": torch.tensor([3, 0], dtype=torch.int32)}
    rope_args[name] = on_meta(rope_args[name])
    if door == "rope":
        call = lambda: thdcp.rope(**rope_args)  # noqa: E731
    else:
        call = lambda: ops.rope(rope_args["x"], rope_args["cu_seqlens"], rope_args["cu_seqlens_padded"],  # noqa: E731
                                rope_args["start_offsets"], 1, 0, 10000.0, 0, False, door == "op backward")
    expect_device_error(call, name, "meta", "x", "cpu")


@pytest.mark.parametrize("name", ["cu_seqlens", "k"])
def test_cp_attention_refuses_a_meta_tensor_before_making_a_communicator(name):
    # Refused on the host before anything else: no communicator (nor GPU) is needed to see it.
    args = inputs()
    args[name] = on_meta(args[name])
    expect_device_error(lambda: thdcp.cp_attention(**args), name, "meta", "q", "cpu")
    call = lambda: ops.cp_attention_forward(args["q"], args["k"], args["v"], args["cu_seqlens"],  # noqa: E731
                                            args["cu_seqlens_padded"], 0, -1, 0, 0.0, False)
    expect_device_error(call, name, "meta", "q", "cpu")


def test_cp_helpers_refuse_a_meta_layout():
    _, cu_padded = thdcp.cp_layout([5, 16], 2)
    x = torch.arange(int(cu_padded[-1]))
    for call in (lambda: thdcp.cp_rank_rows(cu_padded.to("meta"), 2, 0),
                 lambda: thdcp.cp_split(x, cu_padded.to("meta"), 2, 0),
                 lambda: ops.cp_rank_rows(cu_padded.to("meta"), 2, 0)):
        with pytest.raises(ValueError, match="cu_seqlens_padded is on meta"):
            call()


def fake_on(mode, tensor, device):
    # A fake tensor that says it is on `device` (no GPU needed): what torch.compile traces with.
    return FakeTensor(mode, torch.empty(tensor.shape, dtype=tensor.dtype, device="meta"), torch.device(device))


def test_tensors_on_two_cuda_devices_are_refused_under_fake_tensor_mode():
    # FakeTensor initialises the real device it names whenever CUDA is available: with exactly
    # one GPU, a fake cuda:1 fails inside torch before thdcp sees it.
    if torch.cuda.device_count() == 1:
        pytest.skip("one CUDA device visible: a fake cuda:1 needs none (CPU) or two")
    args = inputs(requires_grad=False)
    mode = FakeTensorMode()
    with mode:
        fake = {n: fake_on(mode, t, "cuda:0") for n, t in args.items()}
        fake["k"] = fake_on(mode, args["k"], "cuda:1")
        expect_device_error(lambda: thdcp.attention(**fake), "k", "cuda:1", "q", "cuda:0")
        call = lambda: ops.attention_forward(fake["q"], fake["k"], fake["v"], fake["cu_seqlens"],  # noqa: E731
                                             fake["cu_seqlens_padded"], -1, 0, 0.0, False)
        expect_device_error(call, "k", "cuda:1", "q", "cuda:0")


def test_tensors_on_two_gpus_are_refused():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    args = inputs(requires_grad=False)
    cuda = {n: t.to("cuda:0") for n, t in args.items()}
    cuda["q"], cuda["k"], cuda["v"] = (cuda[n].to(torch.bfloat16) for n in ("q", "k", "v"))
    cuda["cu_seqlens"] = cuda["cu_seqlens"].to("cuda:1")
    expect_device_error(lambda: thdcp.attention(**cuda), "cu_seqlens", "cuda:1", "q", "cuda:0")


# ---- shape propagation still works where every tensor is meta or fake ----

def test_an_all_meta_call_propagates_shapes_forward_and_backward():
    args = {n: on_meta(t) for n, t in inputs().items()}
    out, lse, max_logit = thdcp.attention(**args, return_lse=True, return_max_logit=True)
    tokens = args["q"].shape[0]
    assert out.device.type == "meta" and out.shape == (tokens, 2, 16)
    assert lse.shape == (2, tokens) and lse.dtype == torch.float32 and max_logit.shape == (2,)
    out.sum().backward()
    for name in ("q", "k", "v"):
        assert args[name].grad.device.type == "meta" and args[name].grad.shape == args[name].shape
    y = thdcp.rope(args["q"], args["cu_seqlens"], start_offsets=torch.zeros(2, dtype=torch.int32, device="meta"))
    assert y.device.type == "meta" and y.shape == args["q"].shape


def test_fake_tensor_mode_propagates_shapes():
    args = inputs(requires_grad=False)
    with FakeTensorMode() as mode:
        fake = {n: mode.from_tensor(t) for n, t in args.items()}
        out, lse = thdcp.attention(**fake, window=(4, 0), return_lse=True)
        assert isinstance(out, FakeTensor) and out.device.type == "cpu" and out.shape == args["q"].shape
        assert lse.shape == (2, args["q"].shape[0])
        assert thdcp.rope(fake["q"], fake["cu_seqlens"]).shape == args["q"].shape


def test_compile_takes_the_window_as_an_argument():
    # The integer checks trace: a window passed in (then changed) compiles with no graph break.
    args = inputs(requires_grad=False)

    def f(q, k, v, left):
        return thdcp.attention(q, k, v, args["cu_seqlens"], args["cu_seqlens_padded"], window=(left, 0))

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for left in (2, 3, 5):
        assert torch.equal(compiled(args["q"], args["k"], args["v"], left), f(args["q"], args["k"], args["v"], left))


# ---- integers: integers, in the range the C++ side takes ----

def test_choose_cp_size_refuses_a_size_past_int32():
    # It was cut to 32 bits: 2**32 + 1 became 1, a size not in the list.
    with pytest.raises(ValueError, match=r"choose_cp_size: sizes\[0\]=4294967297 is out of range: "
                                         r"pass an int in \[1, 2147483647\]"):
        thdcp.choose_cp_size([10], [2**32 + 1], 64)
    with pytest.raises(ValueError, match=r"sizes\[0\]=4294967297 is out of range"):
        ops.choose_cp_size([10], [2**32 + 1], 64)  # the op itself refuses too
    assert thdcp.choose_cp_size([10], [4, 2], 64) == 2


def test_default_capacity_refuses_a_cp_past_int32():
    # It gave (64, 33): cp 2**32 + 1 read as 1.
    with pytest.raises(ValueError, match=r"default_capacity: cp=4294967297 is out of range: pass an int in \[1, "):
        thdcp.default_capacity(64, 2**32 + 1)
    with pytest.raises(ValueError, match="cp=4294967297 is out of range"):
        ops.default_capacity(64, 2**32 + 1)


def test_a_fractional_window_is_refused():
    # (1.7, 0) became (1, 0).
    args = inputs()
    with pytest.raises(ValueError, match=r"attention: window\[0\] \(left\)=1.7 is not an integer: pass an int in "
                                         r"\[-1, 2147483647\]"):
        thdcp.attention(**args, window=(1.7, 0))
    with pytest.raises(ValueError, match=r"cp_attention: window\[1\] \(right\)=0.5 is not an integer"):
        thdcp.cp_attention(**args, window=(-1, 0.5))


def test_cp_attention_refuses_an_unknown_layout_before_making_a_communicator():
    args = inputs()
    with pytest.raises(ValueError, match=r"cp_attention: layout='zigzag' is not a CP layout: pass one of "
                                         r"'dual_chunk', 'contiguous'"):
        thdcp.cp_attention(**args, layout="zigzag")
    with pytest.raises(ValueError, match=r"cp_attention: cp_comm='ring' is not a CP communication: pass one of "
                                         r"'all_gather', 'all_to_all', 'a2a\+ag'"):
        thdcp.cp_attention(**args, cp_comm="ring")
    with pytest.raises(ValueError, match=r"cp_attention: cp_comm='a2a\+ag' needs a2a_size: the ranks of an all-to-all "
                                         r"group"):
        thdcp.cp_attention(**args, cp_comm="a2a+ag")
    with pytest.raises(ValueError, match=r"cp_attention: a2a_size=2 is the all-to-all group of cp_comm='a2a\+ag', not "
                                         r"of cp_comm='all_gather'"):
        thdcp.cp_attention(**args, a2a_size=2)
    with pytest.raises(ValueError, match=r"cp_attention: a2a_size=0 is out of range: pass an int in \[1, 2147483647\]"):
        thdcp.cp_attention(**args, cp_comm="a2a+ag", a2a_size=0)
    with pytest.raises(ValueError, match=r"cp_attention: reduce_dtype=torch.float16 with q of torch.float32: dK/dV "
                                         r"partial sums cross ranks in fp32 or in the tensors' dtype"):
        thdcp.cp_attention(**args, reduce_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"cp_attention: head_slices=2 with cp_comm='a2a\+ag': head slices are "
                                         r"all_to_all's and all_gather's; pass cp_comm='all_to_all' or 'all_gather', "
                                         r"or leave head_slices out"):
        thdcp.cp_attention(**args, cp_comm="a2a+ag", a2a_size=2, head_slices=2)
    with pytest.raises(ValueError, match=r"cp_attention: head_slices=0 is out of range: pass an int in \[1, "):
        thdcp.cp_attention(**args, cp_comm="all_to_all", head_slices=0)
    with pytest.raises(ValueError, match=r"cp_attention: head_slices=1.5 is not an integer"):
        thdcp.cp_attention(**args, cp_comm="all_to_all", head_slices=1.5)


def test_head_slices_that_do_not_divide_the_heads_per_rank_are_refused_naming_those_that_do():
    # Checked once the group's size is known (cp_attention calls it with comm.size).
    from thdcp import arguments
    with pytest.raises(ValueError, match=r"cp_attention: head_slices=3 with 16 query and 4 key heads per rank "
                                         r"\(32 and 8 over 2 ranks\): each slice takes as many of both; pass one of "
                                         r"1, 2, 4$"):
        arguments.head_slices_fit("cp_attention", 3, 2, 32, 8)
    arguments.head_slices_fit("cp_attention", 4, 2, 32, 8)  # 4 and 1 heads per slice
    # all_gather slices every head, not a rank's share.
    with pytest.raises(ValueError, match=r"cp_attention: head_slices=3 with 32 query and 8 key heads: each slice "
                                         r"takes as many of both; pass one of 1, 2, 4, 8$"):
        arguments.head_slices_fit("cp_attention", 3, 2, 32, 8, "all_gather")
    arguments.head_slices_fit("cp_attention", 8, 2, 32, 8, "all_gather")  # 4 and 1 heads per slice


def test_communicator_split_refuses_a_size_that_does_not_divide_it_and_a_closed_communicator():
    # Checked before any NCCL call: a stand-in with the fields split reads (no GPU needed).
    comm = thdcp.Communicator.__new__(thdcp.Communicator)
    comm.rank, comm.size, comm.device, comm.copy_engine, comm.handle = 1, 4, 0, False, 7
    with pytest.raises(ValueError, match=r"Communicator.split: size=3 does not divide this communicator's 4 ranks: "
                                         r"pass one of 1, 2, 4"):
        comm.split(3)
    with pytest.raises(ValueError, match=r"Communicator.split: size=0 is out of range: pass an int in \[1, "):
        comm.split(0)
    with pytest.raises(ValueError, match=r"Communicator.split: size=2.0 is not an integer"):
        comm.split(2.0)
    comm.handle = 0
    with pytest.raises(ValueError, match=r"Communicator.split: this communicator is closed; split an open one"):
        comm.split(2)


def test_communicator_refuses_a_copy_engine_that_is_not_a_bool():
    with pytest.raises(ValueError, match=r"Communicator: copy_engine='yes'; pass True or False"):
        thdcp.Communicator(copy_engine="yes")


# Every integer parameter of the package, each given a value that is not an integer or does
# not fit: (call, the words the message must hold).
BAD_INTEGERS = [
    (lambda a: thdcp.attention(**a, window=(2**31, 0)), r"window\[0\] \(left\)=2147483648 is out of range"),
    (lambda a: thdcp.attention(**a, window=(True, 0)), r"window\[0\] \(left\)=True is not an integer"),
    (lambda a: thdcp.rope(a["q"], a["cu_seqlens"], cp_size=2.0), r"rope: cp_size=2.0 is not an integer"),
    (lambda a: thdcp.rope(a["q"], a["cu_seqlens"], cp_rank=2**32), r"rope: cp_rank=4294967296 is out of range"),
    (lambda a: thdcp.rope(a["q"], a["cu_seqlens"], rotary_dim=True), r"rope: rotary_dim=True is not an integer"),
    (lambda a: thdcp.cp_layout([3, 1.5], 2), r"cp_layout: lengths\[1\]=1.5 is not an integer"),
    (lambda a: thdcp.cp_layout([3, -1], 2), r"cp_layout: lengths\[1\]=-1 is out of range: pass an int in \[0, "),
    (lambda a: thdcp.cp_layout([3], 2**32 + 2), r"cp_layout: cp=4294967298 is out of range"),
    (lambda a: thdcp.cp_layout([3], 2, max_seqs=2**32 + 4, max_tokens=64),
     r"cp_layout: max_seqs=4294967300 is out of range"),
    (lambda a: thdcp.cp_rank_rows(a["cu_seqlens_padded"], 1, 2**32), r"cp_rank_rows: rank=4294967296 is out of range"),
    (lambda a: thdcp.cp_split(a["q"], a["cu_seqlens_padded"], 2**32 + 1, 0), r"cp_split: cp=4294967297 is out of"),
    (lambda a: thdcp.capacity_layout([3], 1, 2**63, 4), r"capacity_layout: max_tokens=9223372036854775808 is out"),
    (lambda a: thdcp.capacity_layout([3], 1, 64, 4.0), r"capacity_layout: max_seqs=4.0 is not an integer"),
    (lambda a: thdcp.default_capacity(64.5), r"default_capacity: max_tokens=64.5 is not an integer"),
    (lambda a: thdcp.plan_capacity([[3, 4], [5.5]], 64), r"plan_capacity: batches\[1\]\[0\]=5.5 is not an integer"),
    (lambda a: thdcp.plan_capacity([[3]], 64, cp=0), r"plan_capacity: cp=0 is out of range: pass an int in \[1, "),
    (lambda a: thdcp.choose_cp_size([10], [2], 1.5), r"choose_cp_size: rows_per_rank=1.5 is not an integer"),
    (lambda a: thdcp.choose_cp_size([10], [torch.tensor(True)], 64), r"choose_cp_size: sizes\[0\]=.*is not an int"),
    (lambda a: thdcp.default_capacity(torch.tensor(64.0)), r"default_capacity: max_tokens=.*is not an integer"),
    (lambda a: thdcp.StaticBatch(2**32 + 1, 64, 4, torch.device("cpu")), r"StaticBatch: cp=4294967297 is out of"),
    (lambda a: thdcp.GraphBank(lambda b: None, warmup_runs=1.5), r"GraphBank: warmup_runs=1.5 is not an integer"),
    (lambda a: thdcp.Communicator(device=2**32), r"Communicator: device=4294967296 is out of range"),
]


@pytest.mark.parametrize("case", range(len(BAD_INTEGERS)))
def test_every_integer_parameter_refuses_non_integers_and_values_past_its_range(case):
    call, words = BAD_INTEGERS[case]
    with pytest.raises(ValueError, match=words):
        call(inputs())


def test_numpy_and_torch_integers_are_taken_their_floats_and_bools_are_not():
    np = pytest.importorskip("numpy")
    assert thdcp.default_capacity(np.int64(64), np.int32(2)) == (64, 17)
    assert thdcp.default_capacity(torch.tensor(64), 2) == (64, 17)
    assert thdcp.choose_cp_size([np.int64(10)], [np.int16(1)], torch.tensor(64, dtype=torch.int32)) == 1
    cu, cu_padded = thdcp.cp_layout([3, 5], np.int64(2), max_seqs=np.int64(4), max_tokens=16)
    assert cu.tolist() == [0, 3, 8, 8, 8] and cu_padded.tolist() == [0, 4, 12, 12, 16]
    with pytest.raises(ValueError, match=r"default_capacity: cp=.*1.0.* is not an integer"):
        thdcp.default_capacity(64, np.float64(1.0))
    with pytest.raises(ValueError, match=r"choose_cp_size: sizes\[0\]=.*is not an integer"):
        thdcp.choose_cp_size([10], [np.bool_(True)], 64)
