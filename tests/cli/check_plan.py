#!/usr/bin/env python3
"""`thdcp plan` on a lengths file: what it prints, its JSON and its SVG agree with a brute-force
count done here, with code that shares nothing with thdcp (Python standard library only).

usage: check_plan.py THDCP LENGTHS_FILE WORKDIR
"""
import json
import math
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

TOKENS = 32768
CP_SIZES = [1, 2, 4, 8]
BUDGET = 0.01
SVG = "{http://www.w3.org/2000/svg}"


def pad(n, a):
    return -(-n // a) * a


def prefix_pairs(n, window):
    """Pairs of the queries at positions [0, n) of a document under causal with a left window
    (None: unbounded; the mask lets query i see min(i, window) + 1 keys)."""
    if window is None or n <= window + 1:
        return n * (n + 1) // 2
    return (window + 1) * (window + 2) // 2 + (n - window - 1) * (window + 1)


def piece_pairs(first, end, length, mask):
    """Pairs of the queries at positions [first, end) of a document of `length` tokens."""
    end = min(end, length)
    if end <= first:
        return 0
    if mask == "full":
        return (end - first) * length
    window = None if mask == "causal" else int(mask.split()[1])
    return prefix_pairs(end, window) - prefix_pairs(first, window)


def layout_rank_pairs(batch, cp, layout, mask):
    pairs = [0] * cp
    if layout == "dual_chunk":
        for n in batch:
            c = pad(n, 2 * cp) // (2 * cp)
            for r in range(cp):
                for k in (r, 2 * cp - 1 - r):
                    pairs[r] += piece_pairs(k * c, (k + 1) * c, n, mask)
        return pairs
    per_rank = pad(sum(batch), cp) // cp
    start = 0
    for n in batch:
        for r in range(cp):
            first, end = max(start, r * per_rank), min(start + n, (r + 1) * per_rank)
            if first < end:
                pairs[r] += piece_pairs(first - start, end - start, n, mask)
        start += n
    return pairs


def check_layouts(entry, batches, cp, printed, check):
    """The CP layouts section: padding and per-step balance of both layouts, printed and in JSON."""
    section = printed.split("CP layouts:")[1].split("\ncp=%d\n" % cp)[1].split("\ncp=")[0]
    for got in entry["cp_layouts"]["layouts"]:
        layout = got["layout"]
        if layout == "dual_chunk":
            padding = sum(pad(n, 2 * cp) - n for b in batches for n in b)
        else:
            padding = sum(pad(sum(b), cp) - sum(b) for b in batches)
        check(got["padding_rows"] == padding, "cp=%d %s padding %d vs %d" % (cp, layout, got["padding_rows"], padding))
        steps = []
        for balance in got["balance"]:
            busiest = mean = 0
            for b in batches:
                pairs = layout_rank_pairs(b, cp, layout, balance["mask"])
                busiest += max(pairs)
                mean += sum(pairs) / cp
            step = busiest / mean
            steps.append(step)
            check(abs(balance["step_max_over_mean"] - step) < 1e-9,
                  "cp=%d %s %s balance %.6f vs %.6f" % (cp, layout, balance["mask"], balance["step_max_over_mean"], step))
        row = r"^  %s\s+%d\s+[0-9.]+%%%s$" % (layout, padding, "".join(r"\s+%.4f" % v for v in steps))
        check(re.search(row, section, re.M) is not None, "cp=%d printed %s row" % (cp, layout))
    for choice in entry["cp_layouts"]["recommended"]:
        line = "recommended for %s: %s (" % (choice["mask"], choice["layout"])
        check(line in section, "cp=%d printed '%s'" % (cp, line))


def main():
    thdcp, lengths_file, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    lengths = [int(line.split("#")[0]) for line in open(lengths_file) if line.split("#")[0].strip()]
    run = subprocess.run([thdcp, "plan", "--lengths", lengths_file, "--tokens", str(TOKENS), "--window", "512",
                          "--json",
                          work + "/plan.json", "--plot", work + "/plan.svg"], capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit("thdcp plan failed (%d): %s" % (run.returncode, run.stderr))
    printed = run.stdout
    plan = json.load(open(work + "/plan.json"))
    root = ET.parse(work + "/plan.svg").getroot()
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)

    # Brute force: greedy packing in order, each document padded to lcm(2*cp).
    align = 1
    for cp in CP_SIZES:
        align = align * 2 * cp // math.gcd(align, 2 * cp)
    batches, current, rows = [], [], 0
    for n in lengths:
        if rows + pad(n, align) > TOKENS:
            batches.append(current)
            current, rows = [], 0
        current.append(n)
        rows += pad(n, align)
    batches.append(current)
    counts = [len(b) for b in batches]
    ordered = sorted(counts)
    pct = {p: ordered[math.ceil(p * len(ordered) / 100) - 1] for p in (50, 90, 99)}
    pct[100] = ordered[-1]

    check(plan["docs_per_batch"]["counts"] == counts, "documents per batch")
    line = "documents per batch: mean %.1f, P50 %d, P90 %d, P99 %d, max %d" % (
        sum(counts) / len(counts), pct[50], pct[90], pct[99], pct[100])
    check(line in printed, "printed line: expected '%s'" % line)
    check("thdcp plan: %d batches of %d rows" % (len(batches), TOKENS) in printed, "printed batch count")

    for cp in CP_SIZES:
        entry = next(e for e in plan["per_cp"] if e["cp"] == cp)
        padded = sum(pad(n, 2 * cp) for n in lengths)
        valid = sum(lengths)
        check(entry["padded_rows"] == padded, "cp=%d padded rows" % cp)
        check(("padding overhead       %.3f%%" % (100.0 * (padded - valid) / padded)) in printed, "cp=%d printed padding" % cp)
        longest = max(lengths)
        check(entry["longest_rows_per_rank"] == pad(longest, 2 * cp) // cp, "cp=%d longest rows per rank" % cp)
        check(sum(entry["pair_balance"]["rank_pairs"]) == sum(n * (n + 1) // 2 for n in lengths), "cp=%d causal pairs" % cp)
        expected = [("P90", pct[90] + 1), ("P99", pct[99] + 1), ("max", pct[100] + 1), ("T/(2cp)", TOKENS // (2 * cp) + 1)]
        best = None
        for (label, max_seqs), got in zip(expected, entry["candidates"]):
            fallbacks = sum(1 for c in counts if c > max_seqs - 1)
            check(got["label"] == label and got["max_seqs"] == max_seqs, "cp=%d candidate %s" % (cp, label))
            check(got["fallback_batches"] == fallbacks, "cp=%d %s fallbacks %d vs %d" % (cp, label, got["fallback_batches"], fallbacks))
            row = re.search(r"^  %s\s+%d\s+%d\s+%.2f%%" % (re.escape(label), max_seqs, fallbacks, 100.0 * fallbacks / len(counts)),
                            printed.split("cp=%d (" % cp)[1], re.M)
            check(row is not None, "cp=%d printed row %s" % (cp, label))
            if best is None and fallbacks / len(counts) <= BUDGET:
                best = (label, max_seqs)
        never = expected[3]
        if best is not None and never[1] <= 2 * best[1]:
            best = never
        check(entry["recommended_max_seqs"] == best[1] if "recommended_max_seqs" in entry else entry["recommended"] == best[0],
              "cp=%d recommendation %s" % (cp, best))
        check(("recommendation (max_tokens=%d): max_seqs=%d (" % (TOKENS, best[1])) in printed, "cp=%d printed recommendation" % cp)
        check([b["mask"] for b in entry["cp_layouts"]["layouts"][0]["balance"]] == ["causal", "full", "window 512"],
              "cp=%d layout masks" % cp)
        check_layouts(entry, batches, cp, printed, check)

    check(root.tag == SVG + "svg", "the plot is an <svg> document")
    texts = " ".join(t.text or "" for t in root.iter(SVG + "text"))
    check("P99" in texts and "P90" in texts, "the plot labels the candidates")

    for f in failures:
        print("FAIL:", f)
    print(printed[:400])
    print("thdcp plan agrees with the brute-force count: %s" % ("no" if failures else "yes"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
