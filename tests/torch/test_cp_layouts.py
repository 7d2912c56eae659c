"""The CP layout helpers under both layouts (dual_chunk, contiguous) and cp in 1..4:
cp_layout's offsets, cp_rank_rows against a row map computed here in Python from the
definitions, cp_split / cp_merge round trips, and the refusals (ValueError naming the value
and the rule). CPU tensors only: the helpers read the layout on the host."""
import pytest
import torch

import thdcp

LAYOUTS = ["dual_chunk", "contiguous"]
CP_SIZES = [1, 2, 3, 4]

# Document lengths: zero-length and one-token documents, lengths that no 2*cp divides, a
# single document, one long document among short ones.
LENGTHS = [
    [5, 16, 1],
    [0, 7, 13, 2, 0],
    [1],
    [24],
    [3, 100, 9, 1, 1, 31],
]


def ceil_to(value, multiple):
    return -(-value // multiple) * multiple


def expected_layout(lengths, cp, layout):
    """(cu_seqlens, cu_seqlens_padded) from the definitions: dual chunk pads every document to a
    multiple of 2*cp; contiguous pads none but the last, to make the rows a multiple of cp."""
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    if layout == "contiguous":
        return cu, cu[:-1] + [ceil_to(cu[-1], cp)]
    padded = [0]
    for length in lengths:
        padded.append(padded[-1] + ceil_to(length, 2 * cp))
    return cu, padded


def expected_rank_rows(cu_seqlens_padded, cp, rank, layout):
    """Rank `rank`'s global rows in its local order, from the definitions (DESIGN.md sections 3
    and 10): dual chunk, chunks rank and 2cp-1-rank of P/(2cp) rows of each document in
    order; contiguous, rows [rank T/cp, (rank+1) T/cp)."""
    offsets = [int(v) for v in cu_seqlens_padded]
    if layout == "contiguous":
        per_rank = offsets[-1] // cp
        return list(range(rank * per_rank, (rank + 1) * per_rank))
    rows = []
    for start, end in zip(offsets, offsets[1:]):
        chunk = (end - start) // (2 * cp)
        for c in (rank, 2 * cp - 1 - rank):
            rows += range(start + c * chunk, start + (c + 1) * chunk)
    return rows


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cp", CP_SIZES)
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
def test_cp_layout_gives_the_offsets_of_the_definition(lengths, cp, layout):
    cu, cu_padded = thdcp.cp_layout(lengths, cp, layout=layout)
    assert cu.dtype == cu_padded.dtype == torch.int32
    want_cu, want_padded = expected_layout(lengths, cp, layout)
    assert cu.tolist() == want_cu
    assert cu_padded.tolist() == want_padded
    total = int(cu_padded[-1])
    assert total % cp == 0
    if layout == "contiguous":
        # No per-document padding: only the buffer's tail, fewer than cp rows.
        assert cu_padded[:-1].tolist() == cu[:-1].tolist()
        assert 0 <= total - sum(lengths) < cp


def test_cp_layout_defaults_to_dual_chunk():
    assert [t.tolist() for t in thdcp.cp_layout([5, 9], 3)] == [[0, 5, 14], [0, 6, 18]]
    assert [t.tolist() for t in thdcp.cp_layout([5, 9], 3, layout="contiguous")] == [[0, 5, 14], [0, 5, 15]]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cp", CP_SIZES)
@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
def test_rank_rows_split_and_merge_follow_the_layout(lengths, cp, layout):
    _, cu_padded = thdcp.cp_layout(lengths, cp, layout=layout)
    total = int(cu_padded[-1])
    x = torch.randn(total, 2, 3, generator=torch.Generator().manual_seed(total * 10 + cp))
    parts = []
    for rank in range(cp):
        want = expected_rank_rows(cu_padded, cp, rank, layout)
        rows = thdcp.cp_rank_rows(cu_padded, cp, rank, layout=layout)
        assert rows.dtype == torch.int64 and rows.tolist() == want
        part = thdcp.cp_split(x, cu_padded, cp, rank, layout=layout)
        assert torch.equal(part, x[want])
        parts.append(part)
    assert torch.equal(thdcp.cp_merge(parts, cu_padded, layout=layout), x)


@pytest.mark.parametrize("cp", CP_SIZES)
def test_contiguous_takes_any_document_padding(cp):
    # Documents padded as a caller likes (here 5 rows each past the first): only T % cp matters.
    cu_padded = torch.tensor([0, 3, 10, 10 + 2 * cp - 2, 12 * cp], dtype=torch.int32)
    x = torch.arange(12 * cp * 2).view(-1, 2)
    parts = [thdcp.cp_split(x, cu_padded, cp, rank, layout="contiguous") for rank in range(cp)]
    for rank, part in enumerate(parts):
        assert part.tolist() == x[12 * rank:12 * (rank + 1)].tolist()
    assert torch.equal(thdcp.cp_merge(parts, cu_padded, layout="contiguous"), x)


def test_the_layouts_differ():
    # One layout's rows are not the other's: [8] at cp = 2 has 4 rows per rank either way.
    cu_padded = torch.tensor([0, 8], dtype=torch.int32)
    assert thdcp.cp_rank_rows(cu_padded, 2, 0).tolist() == [0, 1, 6, 7]
    assert thdcp.cp_rank_rows(cu_padded, 2, 0, layout="contiguous").tolist() == [0, 1, 2, 3]


X = torch.zeros(12, 2)
DUAL_PADDED = torch.tensor([0, 4, 12], dtype=torch.int32)  # P = 4, 8: fine at cp = 2 (2*cp = 4)

# (call, the words the ValueError must hold)
BAD_LAYOUT_NAMES = [
    (lambda: thdcp.cp_layout([3, 4], 2, layout="ring"), r"cp_layout: layout='ring' is not a CP layout: pass one of "
                                                        r"'dual_chunk', 'contiguous'"),
    (lambda: thdcp.cp_rank_rows(DUAL_PADDED, 2, 0, layout="DualChunk"), r"cp_rank_rows: layout='DualChunk' is not"),
    (lambda: thdcp.cp_split(X, DUAL_PADDED, 2, 0, layout=None), r"cp_split: layout=None is not a CP layout"),
    (lambda: thdcp.cp_merge([X[:6], X[6:]], DUAL_PADDED, layout=1), r"cp_merge: layout=1 is not a CP layout"),
    (lambda: torch.ops.thdcp.cp_rank_rows(DUAL_PADDED, 2, 0, "ring"), r"layout='ring' is not a CP layout: pass one "
                                                                      r"of 'dual_chunk', 'contiguous'"),
    (lambda: torch.ops.thdcp.make_layout([3], 2, "ring"), r"layout='ring' is not a CP layout"),
]


@pytest.mark.parametrize("case", range(len(BAD_LAYOUT_NAMES)))
def test_an_unknown_layout_is_refused_by_name(case):
    call, words = BAD_LAYOUT_NAMES[case]
    with pytest.raises(ValueError, match=words):
        call()


def test_a_layout_that_does_not_fit_is_refused_with_its_rule():
    # Contiguous: 11 rows do not cut into 4 equal pieces.
    odd_rows = torch.tensor([0, 5, 11], dtype=torch.int32)
    for name, call in (("cp_rank_rows", lambda: thdcp.cp_rank_rows(odd_rows, 4, 0, layout="contiguous")),
                       ("cp_split", lambda: thdcp.cp_split(torch.zeros(11), odd_rows, 4, 1, layout="contiguous")),
                       ("cp_merge", lambda: thdcp.cp_merge([torch.zeros(2)] * 4, odd_rows, layout="contiguous"))):
        # Named by the call made, not by the op underneath.
        with pytest.raises(ValueError, match=r"^thdcp\.%s: the batch has 11 rows, not a multiple of cp=4" % name):
            call()
    # Dual chunk: a padded length of 6 is not a multiple of 2*cp = 4 (contiguous takes it).
    padded_six = torch.tensor([0, 6, 14], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_padded\[1\]-cu_seqlens_padded\[0\]=6 is not a multiple of "
                                         r"2\*cp=4"):
        thdcp.cp_split(torch.zeros(14), padded_six, 2, 0)
    assert thdcp.cp_rank_rows(padded_six, 2, 1, layout="contiguous").tolist() == list(range(7, 14))
    # A rank past the group's, under either layout.
    for layout in LAYOUTS:
        with pytest.raises(ValueError, match=r"cp=2, rank=2"):
            thdcp.cp_rank_rows(DUAL_PADDED, 2, 2, layout=layout)


def test_capacity_forms_of_both_layouts_and_merge_needs_parts():
    # Contiguous: the documents unpadded, then placeholders, the last absorbing the rows.
    cu, cu_padded = thdcp.cp_layout([3, 5], 2, max_seqs=4, max_tokens=64, layout="contiguous")
    assert cu.tolist() == [0, 3, 8, 8, 8] and cu_padded.tolist() == [0, 3, 8, 8, 64]
    with pytest.raises(ValueError, match=r"capacity.max_tokens=63 is not a multiple of cp=2"):
        thdcp.cp_layout([3, 5], 2, max_seqs=4, max_tokens=63, layout="contiguous")
    with pytest.raises(ValueError, match=r"the batch has 8 tokens but capacity.max_tokens=6"):
        thdcp.cp_layout([3, 5], 2, max_seqs=4, max_tokens=6, layout="contiguous")
    # The dual-chunk capacity form (what the default gives).
    cu, cu_padded = thdcp.cp_layout([3, 5], 2, max_seqs=4, max_tokens=64, layout="dual_chunk")
    assert cu.tolist() == [0, 3, 8, 8, 8] and cu_padded.tolist() == [0, 4, 12, 12, 64]
    with pytest.raises(ValueError, match="cp_merge: parts is empty"):
        thdcp.cp_merge([], DUAL_PADDED)
    with pytest.raises(ValueError, match=r"make_contiguous_layout needs at least one length"):
        thdcp.cp_layout([], 2, layout="contiguous")
