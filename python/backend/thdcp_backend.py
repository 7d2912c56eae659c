"""thdcp's build backend: scikit-build-core's hooks, with two short messages pip alone lacks.

pip imports the backend that pyproject.toml names before any of thdcp's build runs. With build
isolation (plain `pip install .`) pip installs scikit-build-core for the build first; without
it (`pip install --no-build-isolation .`) it must already be installed, and its absence ended
in a 78-line traceback. And the operators are built against the PyTorch of the environment
being installed into (python/CMakeLists.txt finds it): where there is none, pip would first
download torch for the package's dependency (gigabytes) and only then fail the build, so the
wheel hooks look for it first.
"""
import subprocess
import sys

try:
    from scikit_build_core import build as _build
    from scikit_build_core.build import *  # noqa: F401,F403 (the PEP 517 hooks)
except ImportError as missing:
    sys.stderr.write(
        "thdcp: building needs scikit-build-core>=0.10, which %s cannot import (%s). Either\n"
        "  pip install .                                                  (pip fetches it for the build), or\n"
        "  pip install 'scikit-build-core>=0.10' && pip install --no-build-isolation .\n"
        % (sys.executable, missing)
    )
    raise SystemExit(1)


def _require_torch(config_settings):
    """Stops the build, saying what to do, when the build will not find PyTorch (as CMake looks)."""
    python = (config_settings or {}).get("cmake.define.THDCP_TORCH_PYTHON") or sys.executable
    for flags in ([], ["-E"]):  # -E: past the PYTHONPATH with which pip's isolation hides it
        if subprocess.run([python, *flags, "-c", "import torch"], capture_output=True).returncode == 0:
            return
    sys.stderr.write(
        "thdcp: the operators are built against the installed PyTorch, and %s cannot import torch.\n"
        "  Install PyTorch first (tested: 2.11), then: pip install -v .\n"
        "  (A frontend that builds in an environment of its own, python -m build or uv, cannot see it:\n"
        "  use --no-build-isolation, or -C cmake.define.THDCP_TORCH_PYTHON=/path/to/python.)\n" % python
    )
    raise SystemExit(1)


def get_requires_for_build_wheel(config_settings=None):
    _require_torch(config_settings)
    return _build.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings=None):
    _require_torch(config_settings)
    return _build.get_requires_for_build_editable(config_settings)


# pip asks for the metadata (and then fetches the dependencies) before it builds; without
# build isolation it skips get_requires_*, so the check is made here too.
if hasattr(_build, "prepare_metadata_for_build_wheel"):

    def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
        _require_torch(config_settings)
        return _build.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
