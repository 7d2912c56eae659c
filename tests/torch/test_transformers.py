"""thdcp.integrations.transformers on tiny random-init Llama, Qwen3 and Mistral models (head dims
64 and 128, GQA and MQA, sliding windows) against the same weights in float64, document by
document, within FlashAttention's rule:

    max |thdcp - ref| <= 2 * max |sdpa - ref| + eps

ref: attn_implementation="sdpa" in float64 on each document alone (batch 1, no mask); sdpa:
attn_implementation="sdpa" on the same batch at the same dtype; eps: one rounding step of the
dtype at the reference's scale. Checked: the logits and the loss of every document, and every
parameter's gradient, for packed batches (position_ids from DataCollatorWithFlattening, its
cu_seq_lens kwargs, several packed rows) and padded ones (right and left). Then what is refused,
with the message that says what to change. CPU: float32 and bf16; with a GPU, CUDA in bf16 and
fp16 as well. Each comparison prints its numbers (pytest -s shows them).
"""
import copy

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip(
    "transformers", reason="Hugging Face transformers is not installed (CI installs transformers==5.17.0: "
                           "pip install transformers==5.17.0)")
hf = pytest.importorskip("thdcp.integrations.transformers")

from transformers import DataCollatorWithFlattening, LlamaConfig, MistralConfig, Qwen3Config  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

VOCAB = 96
LENGTHS = [13, 1, 29, 7, 20]  # a one-token document; several longer than the windows


def model_config(name):
    common = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  max_position_embeddings=256, use_cache=False, attention_dropout=0.0)
    if name == "llama":  # head dim 64, GQA 4:2
        return LlamaConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=64, **common)
    if name == "qwen3-window":  # head dim 128, GQA 2:1; layer 0 full, layer 1 a sliding window of 8
        return Qwen3Config(num_attention_heads=2, num_key_value_heads=1, head_dim=128, use_sliding_window=True,
                           sliding_window=8, max_window_layers=1, **common)
    if name == "mistral-window":  # head dim 64, MQA 4:1, every layer a sliding window of 6
        return MistralConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=64, sliding_window=6, **common)
    raise ValueError(name)


MODELS = ["llama", "qwen3-window", "mistral-window"]
FORMS = ["packed", "packed-kwargs", "packed-rows", "right-padded", "left-padded"]


def dtypes(device):
    return [torch.float32, torch.bfloat16] if device == "cpu" else [torch.bfloat16, torch.float16]


def documents():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in LENGTHS]


def batch_of(form, docs):
    """Model inputs for `form` and, per document, (row, first column) where its tokens are."""
    if form in ("packed", "packed-kwargs"):
        collator = DataCollatorWithFlattening(return_flash_attn_kwargs=form == "packed-kwargs")
        batch = collator([{"input_ids": d.tolist()} for d in docs])
        batch.pop("labels")
        places, start = [], 0
        for d in docs:
            places.append((0, start))
            start += len(d)
        return dict(batch), places
    if form == "packed-rows":  # two rows, each a packed run of documents, the second one padded at its end
        rows = [docs[:2], docs[2:]]
        width = max(sum(len(d) for d in row) for row in rows) + 3
        ids = torch.zeros(2, width, dtype=torch.long)
        positions = torch.arange(width).repeat(2, 1)  # the tail continues its last document's count
        places = []
        for r, row in enumerate(rows):
            start = 0
            for d in row:
                ids[r, start:start + len(d)] = d
                positions[r, start:start + len(d)] = torch.arange(len(d))
                places.append((r, start))
                start += len(d)
            positions[r, start:] = torch.arange(width - start) + len(row[-1])
        return dict(input_ids=ids, position_ids=positions), places
    width = max(len(d) for d in docs) + 2
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros(len(docs), width, dtype=torch.long)
    places = []
    for r, d in enumerate(docs):
        start = 0 if form == "right-padded" else width - len(d)
        ids[r, start:start + len(d)] = d
        mask[r, start:start + len(d)] = 1
        places.append((r, start))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # what generate() gives left-padded rows
    return dict(input_ids=ids, attention_mask=mask, position_ids=positions), places


def loss_of(logits_per_doc, docs):
    """Next-token cross entropy of each document (float64) and their sum over the token count."""
    losses = [F.cross_entropy(logits.double()[:-1], d[1:].to(logits.device), reduction="sum")
              for logits, d in zip(logits_per_doc, docs)]
    count = sum(len(d) - 1 for d in docs)
    return losses, sum(losses) / count


def run(model, implementation, inputs, places, docs):
    """Logits of every document, their losses and the parameter gradients of the mean loss."""
    model.set_attn_implementation(implementation)
    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    logits = model(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}).logits
    per_doc = [logits[r, s:s + len(d)] for (r, s), d in zip(places, docs)]
    losses, mean = loss_of(per_doc, docs)
    mean.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return [x.detach() for x in per_doc], [x.detach() for x in losses], grads


_REFERENCES = {}


def reference(name, device, dtype, model, docs):
    """float64 sdpa on each document alone, from the weights of `model` (at dtype)."""
    key = (name, device, dtype)
    if key not in _REFERENCES:
        ref = copy.deepcopy(model).double()
        ref.set_attn_implementation("sdpa")
        ref.zero_grad(set_to_none=True)
        count = sum(len(d) - 1 for d in docs)
        logits, losses = [], []
        for d in docs:
            out = ref(input_ids=d.to(device)[None]).logits[0]
            loss = F.cross_entropy(out[:-1], d[1:].to(device), reduction="sum")
            (loss / count).backward()
            logits.append(out.detach())
            losses.append(loss.detach())
        grads = {n: p.grad.detach().clone() for n, p in ref.named_parameters()}
        _REFERENCES[key] = (logits, losses, grads)
    return _REFERENCES[key]


def tiny_model(name, device, dtype):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(name), attn_implementation="thdcp")
    return model.to(device=device, dtype=dtype).train()


def check(label, got, low, ref, dtype, report):
    error = (got.double() - ref).abs().max().item()
    baseline = (low.double() - ref).abs().max().item()
    eps = torch.finfo(dtype).eps * max(ref.abs().max().item(), 1e-30)
    bound = 2 * baseline + eps
    report.append((label, error, bound))
    return error <= bound


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", MODELS)
def test_logits_losses_and_gradients_match_float64_per_document(device, name, form):
    docs = documents()
    inputs, places = batch_of(form, docs)
    for dtype in dtypes(device):
        model = tiny_model(name, device, dtype)
        ref_logits, ref_losses, ref_grads = reference(name, device, dtype, model, docs)
        sdpa_logits, sdpa_losses, sdpa_grads = run(model, "sdpa", inputs, places, docs)
        logits, losses, grads = run(model, "thdcp", inputs, places, docs)
        report = []
        for i in range(len(docs)):
            check("logits[doc %d]" % i, logits[i], sdpa_logits[i], ref_logits[i], dtype, report)
            check("loss[doc %d]" % i, losses[i], sdpa_losses[i], ref_losses[i], dtype, report)
        for param in ref_grads:
            check("grad %s" % param, grads[param], sdpa_grads[param], ref_grads[param], dtype, report)
        failed = [r for r in report if r[1] > r[2]]
        worst = max(report, key=lambda r: r[1] / r[2])
        print("%s %s %s %s: %d checks, worst %s: error %.2e <= bound %.2e (%.0f%% of it)"
              % (name, form, device, str(dtype).replace("torch.", ""), len(report), worst[0], worst[1], worst[2],
                 100 * worst[1] / worst[2]))
        assert not failed, "errors past 2 x sdpa's + eps: %s" % failed[:5]


def test_keys_and_values_from_a_kv_cache_give_the_same_bits(device):
    # With config.use_cache (Llama's default) transformers makes a KV cache in training too and
    # hands over K/V head-major from it; thdcp still reads the documents from position_ids.
    dtype = dtypes(device)[-1]
    model = tiny_model("llama", device, dtype)
    inputs, _ = batch_of("packed", documents())
    inputs = {k: v.to(device) for k, v in inputs.items()}
    without_cache = model(**inputs, use_cache=False).logits
    with_cache = model(**inputs, use_cache=True).logits
    assert torch.equal(with_cache, without_cache)


# ---- registration, the mask function, the layouts without a model ----

def test_register_makes_thdcp_an_attention_and_a_mask_implementation():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    assert AttentionInterface._global_mapping["thdcp"] is hf.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["thdcp"] is hf.padding_mask
    assert hf.register("thdcp-under-another-name") == "thdcp-under-another-name"
    assert AttentionMaskInterface._global_mapping["thdcp-under-another-name"] is hf.padding_mask
    model = AutoModelForCausalLM.from_config(model_config("llama"), attn_implementation="thdcp")
    assert model.config._attn_implementation == "thdcp"


def test_padding_mask_passes_padding_on_and_nothing_else():
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    padded = torch.tensor([[True, True, False], [True, True, True]])
    assert hf.padding_mask(2, 3, 3, mask_function=causal_mask_function, attention_mask=padded) is padded
    assert hf.padding_mask(2, 3, 3, mask_function=sliding_window_causal_mask_function(4),
                           attention_mask=torch.ones(2, 3, dtype=torch.bool)) is None
    assert hf.padding_mask(2, 3, 3, mask_function=causal_mask_function, attention_mask=None) is None


class _Attention(torch.nn.Module):
    is_causal = True


def qkv(batch=2, length=6, hq=4, hkv=2, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, h, length, d, generator=g) for h in (hq, hkv, hkv)]


def sdpa_per_row(q, k, v, mask, causal=True):
    """torch's SDPA on each row's valid tokens alone (the row is one document); 0 at padding."""
    out = torch.zeros(q.shape[0], q.shape[2], q.shape[1], q.shape[3], dtype=q.dtype)
    for b in range(q.shape[0]):
        rows = mask[b].nonzero().flatten()
        o = F.scaled_dot_product_attention(q[b:b + 1, :, rows], k[b:b + 1, :, rows], v[b:b + 1, :, rows],
                                           is_causal=causal, enable_gqa=True)
        out[b, rows] = o[0].transpose(0, 1)
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_padded_rows_with_holes_attend_as_their_valid_tokens_alone(causal):
    q, k, v = qkv()
    mask = torch.tensor([[False, True, True, False, True, False], [True, True, True, True, True, True]])
    out, weights = hf.attention_forward(_Attention(), q, k, v, mask, is_causal=causal)
    assert weights is None and out.shape == (2, 6, 4, 64)
    torch.testing.assert_close(out, sdpa_per_row(q, k, v, mask, causal), rtol=1e-5, atol=1e-5)


def test_rows_without_mask_or_positions_are_one_document_each():
    q, k, v = qkv(length=5)
    out, _ = hf.attention_forward(_Attention(), q, k, v, None)
    torch.testing.assert_close(out, sdpa_per_row(q, k, v, torch.ones(2, 5, dtype=torch.bool)), rtol=1e-5, atol=1e-5)


def test_cu_seq_lens_shorter_than_the_rows_leave_a_padded_tail():
    q, k, v = qkv(batch=1, length=8)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    out, _ = hf.attention_forward(_Attention(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu.clone())
    mask = torch.zeros(1, 8, dtype=torch.bool)
    for s, e in ((0, 3), (3, 6)):
        mask[:] = False
        mask[0, s:e] = True
        torch.testing.assert_close(out[:, s:e], sdpa_per_row(q, k, v, mask)[:, s:e], rtol=1e-5, atol=1e-5)
    assert torch.all(out[:, 6:] == 0)


def test_context_parallel_positions_restart_per_padded_document():
    cu_padded = torch.tensor([0, 4, 12, 16], dtype=torch.int32)
    assert hf.cp_position_ids(cu_padded).tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]


@pytest.mark.parametrize("cp", [1, 2, 3])
def test_context_parallel_rows_map_onto_the_unpadded_packed_batch(cp):
    import thdcp

    lengths = [5, 1, 12, 7]
    cu, cu_padded = thdcp.cp_layout(lengths, cp)
    packed = torch.cat([torch.arange(n) + 100 * b for b, n in enumerate(lengths)])  # token ids: doc, position
    padded = torch.full((int(cu_padded[-1]),), -1)
    for b, n in enumerate(lengths):
        padded[int(cu_padded[b]):int(cu_padded[b]) + n] = packed[int(cu[b]):int(cu[b + 1])]
    seen = []
    for rank in range(cp):
        local, where = hf.cp_packed_rows(cu, cu_padded, cp, rank)
        rows = thdcp.cp_split(padded, cu_padded, cp, rank)
        assert torch.equal(rows[local], packed[where]) and torch.all(rows[rows >= 0] == rows[local])
        seen += where.tolist()
    assert sorted(seen) == list(range(sum(lengths)))


# ---- what is refused ----

REFUSED = [
    (dict(dropout=0.1), "attention dropout"),
    (dict(softcap=30.0), "softcapping"),
    (dict(s_aux=torch.zeros(3)), r"s_aux has shape \(3,\) but q has 4 query heads"),
    (dict(s_aux=torch.zeros(4, dtype=torch.int32)), "attention sinks are a floating-point tensor"),
    (dict(output_attentions=True), "output_attentions"),
    (dict(position_bias=torch.zeros(1, 4, 6, 6)), "position bias"),
    (dict(is_causal=False, sliding_window=4), "sliding window without causality"),
    (dict(sliding_window=0), "sliding_window=0"),
    (dict(cu_seq_lens_q=torch.tensor([0, 6], dtype=torch.int32)), "both cu_seq_lens_q and cu_seq_lens_k"),
    (dict(cu_seq_lens_q=torch.tensor([0, 2, 12], dtype=torch.int32),
          cu_seq_lens_k=torch.tensor([0, 3, 12], dtype=torch.int32)), "differs from cu_seq_lens_k"),
    (dict(attention_mask=torch.ones(2, 1, 6, 6, dtype=torch.bool)), "4D and float masks"),
    (dict(attention_mask=torch.zeros(2, 6)), "4D and float masks"),
    (dict(thdcp_cp=object()), "ContextParallel"),
]


@pytest.mark.parametrize("kwargs,message", REFUSED, ids=[m for _, m in REFUSED])
def test_what_thdcp_does_not_do_is_refused_with_what_to_change(kwargs, message):
    q, k, v = qkv()
    kwargs = dict(kwargs)
    mask = kwargs.pop("attention_mask", None)
    with pytest.raises(ValueError, match=message):
        hf.attention_forward(_Attention(), q, k, v, mask, **kwargs)


def test_a_key_longer_than_the_query_is_refused_as_generation_or_cross_attention():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="KV cache and cross-attention are not supported"):
        hf.attention_forward(_Attention(), q[:, :, :1], k, v, None)


def test_mask_patterns_thdcp_cannot_express_are_refused_not_dropped():
    from transformers.masking_utils import and_masks, causal_mask_function, chunked_causal_mask_function, or_masks

    with pytest.raises(ValueError, match="chunked_overlay"):
        hf.padding_mask(1, 8, 8, mask_function=chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long)))

    def image_tokens(batch_idx, head_idx, q_idx, kv_idx):
        return kv_idx < 2

    with pytest.raises(ValueError, match="or_mask"):
        hf.padding_mask(1, 8, 8, mask_function=or_masks(causal_mask_function, image_tokens))
    with pytest.raises(ValueError, match="image_tokens"):
        hf.padding_mask(1, 8, 8, mask_function=and_masks(causal_mask_function, image_tokens))


def test_a_model_with_attention_dropout_refuses_to_train_and_runs_in_eval():
    config = model_config("llama")
    config.attention_dropout = 0.1
    model = AutoModelForCausalLM.from_config(config, attn_implementation="thdcp").train()
    ids = torch.randint(0, VOCAB, (1, 8))
    with pytest.raises(ValueError, match="set config.attention_dropout = 0.0"):
        model(input_ids=ids)
    model.eval()
    model(input_ids=ids)


def test_context_parallel_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the CP example under torchrun covers ContextParallel")
    with pytest.raises(ValueError, match="needs one CUDA GPU per rank and none is visible"):
        hf.ContextParallel([5, 7])


# ---- gpt-oss: attention sinks (s_aux) ----

def test_gpt_oss_sinks_logits_and_gradients_match_eager_float64_per_document():
    # A tiny gpt-oss (sinks per head, layer 0 a sliding window of 6, layer 1 full) packed by
    # position_ids, against transformers' eager attention in float64 on each document alone.
    from transformers import GptOssConfig
    config = GptOssConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                          num_experts_per_tok=2, sliding_window=6, max_position_embeddings=256, use_cache=False,
                          attention_dropout=0.0)
    torch.manual_seed(0)
    # experts_implementation="eager": the grouped-GEMM experts take no float64.
    model = AutoModelForCausalLM.from_config(config, attn_implementation="thdcp",
                                             experts_implementation="eager").float().train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0.0, 2.0)  # sinks that take a visible share of each row
    docs = documents()
    inputs, places = batch_of("packed", docs)
    logits, losses, grads = run(model, "thdcp", inputs, places, docs)
    ref = copy.deepcopy(model).double()
    ref.set_attn_implementation("eager")
    ref.zero_grad(set_to_none=True)
    count = sum(len(d) - 1 for d in docs)
    for d, got, loss in zip(docs, logits, losses):
        out = ref(input_ids=d[None]).logits[0]
        want = F.cross_entropy(out[:-1], d[1:], reduction="sum")
        (want / count).backward()
        torch.testing.assert_close(got.double(), out.detach(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-5)
    sink_names = [n for n in grads if n.endswith("sinks")]
    assert len(sink_names) == 2
    for name, p in ref.named_parameters():
        assert grads[name].abs().max() > 0 or p.grad.abs().max() == 0, name
        torch.testing.assert_close(grads[name].double(), p.grad, rtol=1e-3, atol=1e-5, msg=lambda m: name + ": " + m)
