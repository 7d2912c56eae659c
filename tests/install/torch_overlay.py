"""Links an installed PyTorch, and exactly the distributions it requires, into a folder.

    python3 torch_overlay.py FOLDER [SKIP...]

Run with the interpreter whose PyTorch to reuse. FOLDER gets a symbolic link to each top-level
file or folder (package, module, .dist-info) of torch and of every distribution its metadata
requires on this platform (extras included where a requirement names them), recursively, so
that a venv with FOLDER on its path (one .pth file) has what `pip install torch==<version>`
would have given it, and nothing else of this interpreter's site-packages: not NumPy, not
scikit-build-core, not pytest. SKIP: distribution names the venv already has (its own pip,
setuptools), which stay the venv's. Prints what it linked.
"""
import importlib.metadata as metadata
import os
import re
import sys

try:
    from packaging.requirements import Requirement
except ImportError:  # pip carries a copy
    from pip._vendor.packaging.requirements import Requirement


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root):
    """Distributions required by `root` (with their extras), root first."""
    found, queue = {}, [(root, frozenset())]
    while queue:
        name, extras = queue.pop()
        key = canonical(name)
        dist = metadata.distribution(name)
        done = found.get(key)
        if done is not None and extras <= done[1]:
            continue
        found[key] = (dist, (done[1] if done else frozenset()) | extras)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (set(extras) or {""})):
                continue
            queue.append((req.name, frozenset(req.extras)))
    return [d for d, _ in found.values()]


def top_level(dist):
    """The top-level entries of a distribution inside its site-packages."""
    site = os.path.realpath(str(dist.locate_file("")))
    entries = set()
    for f in dist.files or []:
        path = os.path.realpath(str(dist.locate_file(f)))
        if not path.startswith(site + os.sep):
            continue  # scripts in bin/, data elsewhere
        entries.add(os.path.relpath(path, site).split(os.sep)[0])
    return site, sorted(e for e in entries if e != "__pycache__")


def main():
    folder, skip = sys.argv[1], {canonical(n) for n in sys.argv[2:]}
    os.makedirs(folder, exist_ok=True)
    linked = []
    for dist in closure("torch"):
        name = dist.metadata["Name"]
        if canonical(name) in skip:
            continue
        site, entries = top_level(dist)
        for entry in entries:
            target = os.path.join(folder, entry)
            if not os.path.lexists(target):
                os.symlink(os.path.join(site, entry), target)
        linked.append("%s %s" % (name, dist.version))
    print("linked %d distributions: %s" % (len(linked), ", ".join(sorted(linked, key=str.lower))))


if __name__ == "__main__":
    main()
