"""thdcp's build backend: scikit-build-core's hooks, and a short message when it is missing.

pip imports the backend that pyproject.toml names before any of thdcp's build runs. With build
isolation (plain `pip install .`) pip installs scikit-build-core for the build first; without
it (`pip install --no-build-isolation .`) it must already be installed, and its absence ended
in a 78-line traceback. This says what to do instead.
"""
import sys

try:
    from scikit_build_core.build import *  # noqa: F401,F403 (the PEP 517 hooks)
except ImportError as missing:
    sys.stderr.write(
        "thdcp: building needs scikit-build-core>=0.10, which %s cannot import (%s). Either\n"
        "  pip install .                                                  (pip fetches it for the build), or\n"
        "  pip install 'scikit-build-core>=0.10' && pip install --no-build-isolation .\n"
        % (sys.executable, missing)
    )
    raise SystemExit(1)
