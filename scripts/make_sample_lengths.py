#!/usr/bin/env python3
"""Writes a sample file of document lengths for `thdcp plan --lengths` and `thdcp run --lengths`.

Lengths are drawn from a lognormal distribution, the usual shape of packed-SFT document
lengths: ln(length) ~ Normal(ln(median), sigma), rounded to the nearest integer and clipped
to [1, max]. Python's random.Random(seed).lognormvariate is used, which gives the same
sequence for a given seed on every platform and Python 3 version.

Standard library only. The committed data/sample_lengths.txt was made with the defaults:
    python3 scripts/make_sample_lengths.py
"""
import argparse
import math
import os
import random
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=4000, help="number of documents (default 4000)")
    parser.add_argument("--median", type=float, default=1500.0, help="median length in tokens (default 1500)")
    parser.add_argument("--sigma", type=float, default=1.0, help="standard deviation of ln(length) (default 1.0)")
    parser.add_argument("--max", type=int, default=16384, help="longest document in tokens (default 16384)")
    parser.add_argument("--seed", type=int, default=2024, help="random seed (default 2024)")
    parser.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                                         "sample_lengths.txt"),
                        help="output file (default data/sample_lengths.txt)")
    args = parser.parse_args()
    if args.count < 1 or args.median < 1 or args.sigma < 0 or args.max < 1:
        sys.exit("make_sample_lengths.py: need --count >= 1, --median >= 1, --sigma >= 0, --max >= 1")

    rng = random.Random(args.seed)
    lengths = [min(max(int(round(rng.lognormvariate(math.log(args.median), args.sigma))), 1), args.max)
               for _ in range(args.count)]

    header = [
        "# thdcp sample document lengths (tokens), one per line, in packing order.",
        "# Made by: python3 scripts/make_sample_lengths.py --count %d --median %g --sigma %g --max %d --seed %d"
        % (args.count, args.median, args.sigma, args.max, args.seed),
        "# Distribution: lognormal, ln(length) ~ Normal(ln(%g), %g), rounded, clipped to [1, %d];" %
        (args.median, args.sigma, args.max),
        "# random.Random(%d).lognormvariate. Total %d tokens, longest %d." % (args.seed, sum(lengths), max(lengths)),
    ]
    temp = args.output + ".tmp"
    with open(temp, "w") as out:
        out.write("\n".join(header) + "\n")
        out.write("".join("%d\n" % n for n in lengths))
    os.replace(temp, args.output)
    print("wrote %d lengths (%d tokens) to %s" % (len(lengths), sum(lengths), os.path.normpath(args.output)))


if __name__ == "__main__":
    main()
