"""Every option a thdcp command accepts appears in its --help (issue 29).

    check_help_flags.py THDCP MODE...      MODE: run, "run --graph", plan, bench, "bench --scaling"

The accepted options come from the program itself, not from a copy here: an unknown option is
refused with a message naming every option of the command's parser (tools/io/args.cpp,
"the options are --a, --b, ..."). For each mode this script reads that list, then the mode's
--help, and fails naming each accepted option that --help does not mention.
"""
import re
import subprocess
import sys

NOT_AN_OPTION = "--zz-not-an-option"


def run(command):
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def accepted_options(thdcp, mode):
    code, out, err = run([thdcp, *mode, NOT_AN_OPTION])
    found = re.search(r"the options are (--[a-z0-9-]+(?:, --[a-z0-9-]+)*) \(see --help\)", err)
    if code != 2 or not found:
        sys.exit("thdcp %s %s: expected exit 2 naming the options, got %d:\n%s%s"
                 % (" ".join(mode), NOT_AN_OPTION, code, out, err))
    return found.group(1).split(", ")


def mentions(text, option):
    # "--check" is not mentioned by "--no-check", nor "--head" by "--head-dim".
    return re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(option), text) is not None


def main():
    thdcp, modes = sys.argv[1], [m.split() for m in sys.argv[2:]]
    if not modes:
        sys.exit("usage: check_help_flags.py THDCP MODE...")
    missing = []
    for mode in modes:
        options = accepted_options(thdcp, mode)
        code, help_text, err = run([thdcp, *mode, "--help"])
        if code != 0 or not help_text.startswith("usage: thdcp " + mode[0]):
            sys.exit("thdcp %s --help: expected exit 0 and a usage text, got %d:\n%s%s"
                     % (" ".join(mode), code, help_text, err))
        # --help printed the text: the text need not name it.
        absent = [o for o in options if o != "--help" and not mentions(help_text, o)]
        print("thdcp %s: %d options, %s" % (" ".join(mode), len(options),
                                            "all in --help" if not absent else "missing from --help: " + ", ".join(absent)))
        missing += ["thdcp %s %s" % (" ".join(mode), o) for o in absent]
    if missing:
        sys.exit("FAIL: accepted but not in --help: " + "; ".join(missing))
    print("PASS")


if __name__ == "__main__":
    main()
