#!/bin/sh
# A stand-in thdcp whose parser accepts --tokens and --gpus but whose --help names only
# --tokens: check_help_flags.py must fail on it (cli_help_flags_can_fail).
case "$*" in
  *--help*) printf 'usage: thdcp run [options]\n  --tokens T   rows\n'; exit 0 ;;
  *) echo "thdcp: error: unknown option '$2'; the options are --tokens, --gpus, --help (see --help)" >&2; exit 2 ;;
esac
