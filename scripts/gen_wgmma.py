#!/usr/bin/env python3
"""Writes src/cuda/wgmma_ops.cuh: the wgmma.mma_async wrappers (sm_90a) the kernels use.

Each wrapper is one inline-asm statement with N/2 fp32 accumulator operands, which is why it
is generated rather than written by hand. Inline asm takes its instruction as a string literal
only, so each form's statement is written once, as a macro over the PTX type of A and B (spliced
in by string-literal concatenation), and expanded for the storage tag by THDCP_ASM_FOR_STORAGE
(tensor_core.cuh); the N/2 accumulators, the same for A from registers or shared memory, are a
pair of macros per N that both forms of that N splice in. Run from the repository root:
    python3 scripts/gen_wgmma.py > src/cuda/wgmma_ops.cuh
"""

# (A from shared memory?, N): the forms the kernels issue; a new form is one line here.
FORMS = [(False, 64), (False, 128), (True, 64), (True, 128)]


def operand_list(first, count, per_line):
    """'%first, ..., %(first+count-1)' split into asm string lines of per_line operands."""
    rows = []
    for row in range(first, first + count, per_line):
        rows.append(", ".join(f"%{i}" for i in range(row, min(row + per_line, first + count))))
    return rows


def wrapper_name(shared_a):
    return "WgmmaSs" if shared_a else "WgmmaRs"


def instruction_macro(shared_a, n):
    return f"THDCP_WGMMA_{'SS' if shared_a else 'RS'}_M64N{n}K16"


def macro_lines(lines):
    """lines joined as the body of a #define, the line continuations aligned."""
    width = max(len(line) for line in lines) + 1
    return "\n".join(line.ljust(width) + "\\" for line in lines[:-1]) + "\n" + lines[-1]


def accumulator_macro(n):
    return f"THDCP_WGMMA_M64N{n}_ACCUMULATORS"


def accumulator_operands_macro(n):
    return f"THDCP_WGMMA_M64N{n}_ACCUMULATOR_OPERANDS"


def accumulators(n):
    """The #defines of form N's accumulator list, which both forms of one N share: its registers
    %0 .. %(N/2 - 1) in the instruction, and its operands d[0] .. d[N/2 - 1] (read and written)."""
    regs = n // 2
    d_rows = operand_list(0, regs, 16)
    d_lines = [f'  "{"{" if i == 0 else ""}{row}{"}, " if i == len(d_rows) - 1 else ", "}"'
               for i, row in enumerate(d_rows)]
    outs = [", ".join(f'"+f"(d[{i}])' for i in range(row, row + 8)) for row in range(0, regs, 8)]
    out_lines = [f"  {row}{',' if i < len(outs) - 1 else ''}" for i, row in enumerate(outs)]
    return (f"// The m64n{n}k16 accumulators: registers in the instruction, then their operands.\n"
            + macro_lines([f"#define {accumulator_macro(n)}", *d_lines]) + "\n"
            + macro_lines([f"#define {accumulator_operands_macro(n)}", *out_lines]) + "\n")


def instruction(shared_a, n):
    """The #define of the asm statement of form (shared_a, n) over the PTX type PTX_TYPE."""
    regs = n // 2
    if shared_a:
        source, a_operand, inputs = "shared memory", f"%{regs}", '"l"(desc_a)'
        desc_b, accumulate = regs + 1, regs + 2
        transposes = f"%{regs + 3}, %{regs + 4}"
        immediates = '"n"(kTransposeA), "n"(kTransposeB)'
    else:
        source = "registers"
        a_operand = "{" + ", ".join(f"%{regs + i}" for i in range(4)) + "}"
        inputs = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])'
        desc_b, accumulate = regs + 4, regs + 5
        transposes = f"%{regs + 6}"
        immediates = '"n"(kTransposeB)'
    return f"// wgmma.mma_async m64n{n}k16, A from {source}.\n" + macro_lines([
        f"#define {instruction_macro(shared_a, n)}(PTX_TYPE)",
        "  asm volatile(",
        '      "{\\n.reg .pred p;\\n"',
        f'      "setp.ne.b32 p, %{accumulate}, 0;\\n"',
        f'      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32." PTX_TYPE "." PTX_TYPE " "',
        f"      {accumulator_macro(n)}",
        f'      "{a_operand}, %{desc_b}, p, 1, 1, {transposes};\\n}}\\n"',
        f"      : {accumulator_operands_macro(n)}",
        f'      : {inputs}, "l"(desc_b), "r"(accumulate), {immediates})',
    ]) + "\n"


def wrapper(shared_a):
    """The struct template whose run issues the form of N, one branch a form of FORMS."""
    forms = [n for a, n in FORMS if a == shared_a]
    if shared_a:
        template = "template <int kTransposeA, int kTransposeB>"
        params = "uint64_t desc_a"
    else:
        template = "template <int kTransposeB>"
        params = "const uint32_t (&a)[4]"
    branches = []
    for i, n in enumerate(forms):
        branches.append(f"    {'if' if i == 0 else '} else if'} constexpr (N == {n}) {{")
        branches.append(f"      THDCP_ASM_FOR_STORAGE(Storage, {instruction_macro(shared_a, n)})")
    return "\n".join([
        "template <typename Storage, int N>",
        f"struct {wrapper_name(shared_a)} {{",
        f"  static_assert({' || '.join(f'N == {n}' for n in forms)}, \"N: a form of scripts/gen_wgmma.py\");",
        f"  {template}",
        f"  static __device__ __forceinline__ void run(float (&d)[N / 2], {params}, uint64_t desc_b,",
        "                                             int accumulate) {",
        *branches,
        "    }",
        "  }",
        "};",
        "",
    ])


def main():
    print("""// Generated by scripts/gen_wgmma.py: do not edit by hand.
// WgmmaRs<Storage, N>::run<kTransposeB>(d, a, desc_b, accumulate): one
// wgmma.mma_async m64nNk16 with A from registers (the mma.sync m16n8k16 A fragment of each
// warp's 16 rows) and B from shared memory through descriptor desc_b; d (N/2 fp32 per thread,
// the m16n8 accumulator layout repeated over N/8 column blocks) += A B, or = A B when
// accumulate is 0. kTransposeB: 0 for a K-major B (rows of N, K contiguous), 1 for MN-major.
// WgmmaSs<Storage, N>::run<kTransposeA, kTransposeB>(d, desc_a, desc_b, accumulate): the same
// with A from shared memory too (kTransposeA: 0 for K-major, 1 for M-major).
// Only for sm_90a device code; the caller fences, commits and waits (wgmma.cuh).
//
// Inline asm takes its instruction as a string literal only, so each form's asm statement is
// a macro over the PTX type of A and B ("bf16", "f16"), spliced in by string-literal
// concatenation, that run expands for its storage tag (THDCP_ASM_FOR_STORAGE,
// tensor_core.cuh). The statements name run's parameters (d, a or desc_a, desc_b,
// accumulate, kTransposeA, kTransposeB). The accumulator list of one N, the bulk of each
// statement, is the same in both forms: it is a pair of macros of its own.
#pragma once

#include <cstdint>

#include "tensor_core.cuh"

namespace thdcp::cuda::detail {
""")
    for n in sorted({n for _, n in FORMS}):
        print(accumulators(n))
    for shared_a, n in FORMS:
        print(instruction(shared_a, n))
    for shared_a in sorted({a for a, _ in FORMS}):
        print(wrapper(shared_a))
    for shared_a, n in FORMS:
        print(f"#undef {instruction_macro(shared_a, n)}")
    for n in sorted({n for _, n in FORMS}):
        print(f"#undef {accumulator_macro(n)}")
        print(f"#undef {accumulator_operands_macro(n)}")
    print()
    print("}  // namespace thdcp::cuda::detail")


if __name__ == "__main__":
    main()
