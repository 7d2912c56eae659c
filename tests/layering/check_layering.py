#!/usr/bin/env python3
"""Checks the layering rules of DESIGN.md section 8 on a thdcp source tree.

    check_layering.py ROOT

Prints one line per violation, `file:line: <what> — rule`, and exits 1 if there is any,
0 if there is none, 2 if ROOT does not look like a thdcp tree (so a wrong path cannot pass).

What it checks:
  * core, plan and cpu include no CUDA header (cuda_runtime*.h, cuda.h, cuda_fp16.h, ...,
    nccl.h, cub/thrust/libcu++, thdcp/cuda/...) and use no CUDA keyword (__device__,
    __CUDACC__, ...) outside include/thdcp/core/host_device.h, whose macros are the one place
    host code meets nvcc;
  * a part includes thdcp headers only of the parts in PARTS below (both "thdcp/..." and
    <thdcp/...>; a relative include such as "launch.h" belongs to the file it resolves to,
    or to the includer's part when it resolves to nothing);
  * CMake: every target_link_libraries between two targets of the parts follows the same
    table as the includes (TARGET_PARTS names each target's part); no library target links
    thdcp_testing; thdcp_core, thdcp_plan and thdcp_cpu compile no .cu file and link nothing
    of CUDA.
Python 3 standard library only.
"""

import os
import re
import sys
from dataclasses import dataclass

# ---- the table of DESIGN.md section 8 --------------------------------------------------
# part -> the other parts whose thdcp headers it may include (a part may always include
# its own). Dependencies are spelled out, not implied: cp lists core even though plan
# brings it. A folder under include/thdcp/ or src/ that is not here is itself a violation,
# so a new part cannot go unchecked: add it here with its row of DESIGN.md section 8.
# Every part is one folder (include/thdcp/<part>/, src/<part>/): the host communicators are
# comm/, the device communicators comm_device/.
_LIBRARY = {"core", "plan", "cpu", "comm", "comm_device", "cuda", "cp", "graph", "capi", "bindings"}
PARTS = {
    "core": set(),
    "plan": {"core"},
    "cpu": {"plan", "core"},
    "comm": {"core"},  # host communicators: never plan, never CUDA's parts
    "comm_device": {"comm", "core"},  # stream-ordered communicators of device buffers
    # Kernels read plan's headers (segment.h, dual_chunk.h, mask.h) and nothing above them:
    # never comm, cp, graph, testing (and not cpu: cpu is a backend beside cuda).
    "cuda": {"plan", "core"},
    "cp": {"plan", "core", "cpu", "comm", "comm_device", "cuda"},  # never graph
    # Graphs of whole steps: static batches and banks over a device communicator. They do
    # not know what a step runs, so never cp or cuda.
    "graph": {"comm_device", "comm", "plan", "core"},
    # The C ABI (include/thdcp/thdcp.h, src/capi) sits on top: it may include every library
    # part, and no part includes it (its header is C; the C++ API is the other parts' own),
    # except bindings, which DESIGN.md section 8 allows to sit over it.
    "capi": {"graph", "cp", "comm", "comm_device", "cuda", "cpu", "plan", "core"},
    "bindings": _LIBRARY - {"bindings"},
    "testing": (_LIBRARY - {"capi"}) | {"testing"},  # anything but capi and tools
    "tools": (_LIBRARY - {"capi"}) | {"testing", "tools"},
}

# Parts that build and test with no CUDA toolkit.
CUDA_FREE_PARTS = {"core", "plan", "cpu"}
CUDA_FREE_TARGETS = {"thdcp_core", "thdcp_plan", "thdcp_cpu"}
# The one file of a CUDA-free part that may speak to nvcc (through macros, not includes).
CUDA_KEYWORD_EXCEPTION = "include/thdcp/core/host_device.h"

# CMake targets of the parts: a link between two of them must follow PARTS as an include
# does. A thdcp_* target that is not here (and is not a test's) is reported, so a new target
# cannot go unchecked either. "umbrella" is the INTERFACE target users link, which brings
# every library part below the C ABI: a part may link it only if it may use all of them.
TARGET_PARTS = {
    "thdcp_core": "core",
    "thdcp_plan": "plan",
    "thdcp_cpu": "cpu",
    "thdcp_comm": "comm",
    "thdcp_comm_device": "comm_device",
    "thdcp_cuda": "cuda",
    "thdcp_cuda_headers": "cuda",
    "thdcp_cp": "cp",
    "thdcp_cp_cuda": "cp",
    "thdcp_graph": "graph",
    "thdcp": "umbrella",
    "thdcp_c": "capi",
    "thdcp_torch": "bindings",
    "thdcp_testing": "testing",
    "thdcp_tools_io": "tools",
    "thdcp_cli": "tools",
}
UMBRELLA_PARTS = {"core", "plan", "cpu", "comm", "comm_device", "cuda", "cp", "graph"}

TESTING_TARGET = "thdcp_testing"
# Targets that may link thdcp_testing besides test_* and those defined under tests/.
TESTING_USERS = {"thdcp_cli"}

CXX_EXTENSIONS = (".h", ".hpp", ".hh", ".cuh", ".inl", ".ipp", ".c", ".cc", ".cpp", ".cxx", ".cu")
SCANNED_DIRS = ("include", "src", "tools", "python/csrc")

_CUDA_HEADER = re.compile(
    r"^(cuda\.h|cuda_[\w]*\.h|nccl\.h|nccl_[\w]*\.h|cudaTypedefs\.h|"
    r"cooperative_groups(\.h|/.*)|(cub|thrust|cuda|nv|cute|cutlass)/.*|thdcp/cuda/.*)$")
_CUDA_KEYWORD = re.compile(
    r"\b(__CUDACC__|__CUDA_ARCH__|__NVCC__|__global__|__device__|__host__|__shared__|"
    r"__constant__|__launch_bounds__|__syncthreads)\b|<<<")
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
_IF = re.compile(r"^\s*#\s*if(n?def)?\b")
_IF0 = re.compile(r"^\s*#\s*if\s+0\b")
_ELSE_OR_END = re.compile(r"^\s*#\s*(else|elif|endif)\b")
_ENDIF = re.compile(r"^\s*#\s*endif\b")


@dataclass(frozen=True, order=True)
class Violation:
    path: str  # relative to the root, with '/'
    line: int
    what: str  # the include, the keyword or the CMake command
    rule: str  # short id: cuda-header, cuda-keyword, part-dependency, unknown-part,
    #            testing-link, cuda-source, cuda-link
    message: str

    def __str__(self):
        return f"{self.path}:{self.line}: {self.what} — {self.message}"


# ---- files and parts --------------------------------------------------------------------

def _rel(root, path):
    return os.path.relpath(path, root).replace(os.sep, "/")


def part_of(rel):
    """The part a file belongs to (a path relative to the root), or None if it belongs to
    none that is checked (tests/, bench/, ...). May return a name that is not in PARTS."""
    pieces = rel.split("/")
    if pieces[0] == "include":
        if len(pieces) == 2 or (len(pieces) == 3 and pieces[1] == "thdcp"):
            return "capi"  # thdcp.h: the C ABI header sits at the top (DESIGN.md section 8)
        if pieces[1] == "thdcp":
            return pieces[2]
        return pieces[1]
    if pieces[0] == "src":
        return pieces[1] if len(pieces) > 2 else "src"
    if pieces[0] == "tools":
        return "tools"
    if pieces[0] == "python" and len(pieces) > 2 and pieces[1] == "csrc":
        return "bindings"  # the PyTorch package's operators
    return None


def _included_part(include):
    """Part named by an include of the form thdcp/<part>/..., else None."""
    pieces = include.split("/")
    if pieces[0] != "thdcp" or len(pieces) < 2:
        return None
    if len(pieces) == 2:
        return "capi"
    return pieces[1]


def _walk(root, top, keep):
    base = os.path.join(root, top)
    for directory, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not _skip_dir(os.path.join(directory, d), d))
        for name in sorted(files):
            if keep(name):
                yield os.path.join(directory, name)


def _skip_dir(path, name):
    return (name.startswith(".") or name.startswith("build") or name == "__pycache__"
            or name == "_deps" or os.path.exists(os.path.join(path, "CMakeCache.txt")))


def source_files(root):
    for top in SCANNED_DIRS:
        yield from _walk(root, top, lambda n: n.endswith(CXX_EXTENSIONS))


def _code_lines(text):
    """(line number, code) for every line outside comments and `#if 0` blocks; string and
    character literals are kept (the include parser needs them)."""
    in_block = False
    skip_depth = 0  # > 0 inside #if 0
    for number, raw in enumerate(text.splitlines(), 1):
        code = []
        i = 0
        quote = None
        while i < len(raw):
            if in_block:
                end = raw.find("*/", i)
                if end < 0:
                    i = len(raw)
                    break
                in_block = False
                i = end + 2
                continue
            c = raw[i]
            if quote:
                code.append(c)
                if c == "\\" and i + 1 < len(raw):
                    code.append(raw[i + 1])
                    i += 2
                    continue
                if c == quote:
                    quote = None
                i += 1
                continue
            if raw.startswith("//", i):
                break
            if raw.startswith("/*", i):
                in_block = True
                code.append(" ")
                i += 2
                continue
            if c in "\"'" and not (c == "'" and i > 0 and raw[i - 1].isalnum()):
                quote = c  # a ' after a digit is a digit separator (1'000)
            code.append(c)
            i += 1
        line = "".join(code)
        if skip_depth:
            if _IF.match(line):
                skip_depth += 1
            elif _ENDIF.match(line) or (skip_depth == 1 and _ELSE_OR_END.match(line)):
                skip_depth -= 1
            continue
        if _IF0.match(line):
            skip_depth = 1
            continue
        yield number, line


def _without_strings(code):
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', code)


# ---- include rules ----------------------------------------------------------------------

def _resolve_relative(root, includer, include):
    """The file a quoted include that does not start with thdcp/ names, relative to the
    includer's folder or to include/; None if it names no file of the tree."""
    for base in (os.path.dirname(includer), os.path.join(root, "include")):
        candidate = os.path.normpath(os.path.join(base, include))
        if os.path.isfile(candidate):
            return candidate
    return None


def _allowed_text(part):
    allowed = sorted(PARTS[part] - {part})
    return ", ".join(allowed) if allowed else "nothing"


def check_file(root, path):
    rel = _rel(root, path)
    part = part_of(rel)
    if part is None:
        return []
    violations = []
    if part not in PARTS:
        violations.append(Violation(
            rel, 1, f"{rel}", "unknown-part",
            f"folder '{part}' is not a part of DESIGN.md section 8; add it to PARTS in "
            "tests/layering/check_layering.py with what it may depend on"))
        return violations
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    cuda_free = part in CUDA_FREE_PARTS
    for number, code in _code_lines(text):
        match = _INCLUDE.match(code)
        if not match:
            if cuda_free and rel != CUDA_KEYWORD_EXCEPTION:
                keyword = _CUDA_KEYWORD.search(_without_strings(code))
                if keyword:
                    violations.append(Violation(
                        rel, number, keyword.group(0), "cuda-keyword",
                        f"{part} builds without CUDA: reach nvcc only through the macros of "
                        "thdcp/core/host_device.h (DESIGN.md section 8)"))
            continue
        bracket, include = match.group(1), match.group(2).strip()
        shown = f"<{include}>" if bracket == "<" else f'"{include}"'
        if cuda_free and _CUDA_HEADER.match(include):
            violations.append(Violation(
                rel, number, shown, "cuda-header",
                f"{part} never includes CUDA headers: core, plan and cpu build with no CUDA "
                "toolkit (DESIGN.md section 8)"))
            continue
        target = _included_part(include)
        if target is None and bracket == '"':
            resolved = _resolve_relative(root, path, include)
            target = part_of(_rel(root, resolved)) if resolved else part
            if target is None:
                target = part
        if target is None or target == part:
            continue
        if target not in PARTS:
            violations.append(Violation(
                rel, number, shown, "unknown-part",
                f"'{target}' is not a part of DESIGN.md section 8; add it to PARTS in "
                "tests/layering/check_layering.py"))
            continue
        if target in PARTS[part]:
            continue
        violations.append(Violation(
            rel, number, shown, "part-dependency",
            f"{part} may include only {_allowed_text(part)}, never {target} "
            "(DESIGN.md section 8)"))
    return violations


def check_includes(root):
    return [v for path in source_files(root) for v in check_file(root, path)]


# ---- CMake rules ------------------------------------------------------------------------

@dataclass
class CMakeCommand:
    path: str  # relative to the root
    line: int
    name: str  # lower case
    args: list


_CMAKE_NAMES = ("add_library", "add_executable", "target_link_libraries", "target_sources",
                "link_libraries")
_CMAKE_COMMAND = re.compile(r"(?<![\w$])(" + "|".join(_CMAKE_NAMES) + r")\s*\(", re.IGNORECASE)
_CMAKE_ARG = re.compile(r'"(?:\\.|[^"\\])*"|\[(=*)\[.*?\]\1\]|[^\s()"]+', re.DOTALL)


def _strip_cmake_comments(text):
    """Blanks out # comments (line and bracket) and keeps line breaks and quoted text."""
    out = []
    i = 0
    quote = False
    while i < len(text):
        c = text[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                quote = False
            i += 1
            continue
        if c == '"':
            quote = True
            out.append(c)
            i += 1
            continue
        if c == "#":
            bracket = re.match(r"#\[(=*)\[", text[i:])
            if bracket:
                end = text.find("]" + bracket.group(1) + "]", i)
                end = len(text) if end < 0 else end + len(bracket.group(1)) + 2
            else:
                end = text.find("\n", i)
                end = len(text) if end < 0 else end
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_cmake(root, path):
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = _strip_cmake_comments(handle.read())
    rel = _rel(root, path)
    commands = []
    for match in _CMAKE_COMMAND.finditer(text):
        depth = 1
        i = match.end()
        quote = False
        while i < len(text) and depth:
            c = text[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == '"':
                    quote = False
            elif c == '"':
                quote = True
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            i += 1
        body = text[match.end():i - 1]
        args = [m.group(0) for m in _CMAKE_ARG.finditer(body)]
        args = [a[1:-1] if a.startswith('"') and a.endswith('"') else a for a in args]
        line = text.count("\n", 0, match.start()) + 1
        commands.append(CMakeCommand(rel, line, match.group(1).lower(), args))
    return commands


def cmake_files(root):
    top = os.path.join(root, "CMakeLists.txt")
    if os.path.isfile(top):
        yield top
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not _skip_dir(os.path.join(directory, d), d))
        for name in sorted(files):
            path = os.path.join(directory, name)
            if path == top:
                continue
            if name == "CMakeLists.txt" or name.endswith(".cmake"):
                yield path


def _under(rel, folder):
    return rel == folder or rel.startswith(folder + "/")


_LIBRARY_KEYWORDS = {"STATIC", "SHARED", "MODULE", "OBJECT", "INTERFACE", "UNKNOWN",
                     "EXCLUDE_FROM_ALL", "IMPORTED", "GLOBAL", "WIN32", "MACOSX_BUNDLE"}
_SOURCES_KEYWORDS = {"PRIVATE", "PUBLIC", "INTERFACE", "FILE_SET", "TYPE", "BASE_DIRS", "FILES",
                     "HEADERS", "CXX_MODULES"}


def _sources(command):
    """Source paths of an add_library/add_executable/target_sources command, relative to the
    root where they can be resolved (${CMAKE_CURRENT_SOURCE_DIR}, ${CMAKE_CURRENT_LIST_DIR},
    ${PROJECT_SOURCE_DIR} and plain relative paths)."""
    keywords = _SOURCES_KEYWORDS if command.name == "target_sources" else _LIBRARY_KEYWORDS
    folder = os.path.dirname(command.path)
    result = []
    for arg in command.args[1:]:
        if arg in keywords:
            continue
        arg = re.sub(r"\$\{(CMAKE_CURRENT_SOURCE_DIR|CMAKE_CURRENT_LIST_DIR)\}", folder or ".", arg)
        arg = re.sub(r"\$\{(PROJECT_SOURCE_DIR|CMAKE_SOURCE_DIR|thdcp_SOURCE_DIR)\}", ".", arg)
        arg = arg.split(":")[-1].rstrip(">")  # $<$<COMPILE_LANGUAGE:CUDA>:x.cu> -> x.cu
        if "${" in arg or not arg:
            result.append(arg)
            continue
        result.append(os.path.normpath(os.path.join(folder, arg)).replace(os.sep, "/"))
    return result


def collect_cmake(root):
    return [command for path in cmake_files(root) for command in parse_cmake(root, path)]


_WORD = r"(?<![\w]){}(?![\w])"


def _may_link_testing(target, command, defined):
    """Tests (test_*, or defined under tests/), the thdcp tool and benchmark executables
    (defined under bench/) may link thdcp_testing; nothing else may."""
    if target is None:  # link_libraries(): the whole folder
        return _under(command.path, "tests")
    if "${" in target:  # a target name made in a function (thdcp_add_test): only in tests/
        return _under(command.path, "tests")
    where, kind = defined.get(target, (None, None))
    return (target.startswith("test_") or target in TESTING_USERS
            or (where is not None and _under(where, "tests"))
            or (where is not None and kind == "add_executable" and _under(where, "bench")))


_THDCP_TARGET = re.compile(r"(?<![\w])thdcp(?:_\w+)?(?![\w:])")


def _may_link(part, linked_part):
    """Whether a target of `part` may link a target of `linked_part` (PARTS, as includes)."""
    if linked_part == part:
        return True
    if part == "umbrella":
        return linked_part in UMBRELLA_PARTS
    allowed = PARTS.get(part, set()) | {part}
    if linked_part == "umbrella":
        return UMBRELLA_PARTS <= allowed
    return linked_part in allowed


def _is_test_target(target, defined):
    where, _ = defined.get(target, (None, None))
    return target.startswith("test_") or (where is not None and _under(where, "tests"))


def _link_violations(command, target, links, defined):
    """A target of a part links only targets of the parts it may include (DESIGN.md section
    8, the PARTS table): the link lines hold the same rules as the includes."""
    if "${" in target or _is_test_target(target, defined):
        return []
    part = TARGET_PARTS.get(target)
    if part is None:
        if not _THDCP_TARGET.fullmatch(target):
            return []  # not a target of the library (a benchmark, an interop helper)
        return [Violation(command.path, command.line, f"target_link_libraries({target} ...)",
                          "unknown-target",
                          f"target '{target}' is no part of DESIGN.md section 8; add it to "
                          "TARGET_PARTS in tests/layering/check_layering.py with its part")]
    violations = []
    for arg in links:
        for linked in _THDCP_TARGET.findall(arg):
            if linked == TESTING_TARGET:
                continue  # the testing-link rule speaks for it
            linked_part = TARGET_PARTS.get(linked)
            what = f"target_link_libraries({target} ... {linked})"
            if linked_part is None:
                violations.append(Violation(
                    command.path, command.line, what, "unknown-target",
                    f"'{linked}' is no target of a part of DESIGN.md section 8; add it to "
                    "TARGET_PARTS in tests/layering/check_layering.py with its part"))
            elif not _may_link(part, linked_part):
                allowed = "every library part below capi" if part == "umbrella" else _allowed_text(part)
                violations.append(Violation(
                    command.path, command.line, what, "link-dependency",
                    f"{target} ({part}) may link only {allowed}, never {linked} ({linked_part}) "
                    "(DESIGN.md section 8)"))
    return violations


def check_cmake(root, commands=None):
    if commands is None:
        commands = collect_cmake(root)
    defined = {}  # target -> (file, kind)
    testing_names = {TESTING_TARGET}
    for command in commands:
        if command.name in ("add_library", "add_executable") and command.args:
            defined.setdefault(command.args[0], (command.path, command.name))
            if len(command.args) >= 3 and command.args[1] == "ALIAS" \
                    and command.args[2] in testing_names:
                testing_names.add(command.args[0])
    testing_word = re.compile("|".join(_WORD.format(re.escape(n)) for n in testing_names))
    cuda_link = re.compile(r"(?<![\w])(CUDA::\w+|thdcp_cuda\w*|thdcp_comm_device|thdcp_cp_cuda|"
                           r"nccl\w*|\$\{THDCP_NCCL_LIBRARY\})")

    violations = []
    for command in commands:
        if not command.args:
            continue
        if command.name == "link_libraries":  # every later target of the folder
            target, links = None, command.args
        else:
            target = command.args[0]
            links = command.args[1:] if command.name == "target_link_libraries" else []
        linked_testing = [a for a in links if testing_word.search(a)]
        if linked_testing and not _may_link_testing(target, command, defined):
            what = (f"link_libraries({linked_testing[0]})" if target is None
                    else f"target_link_libraries({target} ... {linked_testing[0]})")
            violations.append(Violation(
                command.path, command.line, what, "testing-link",
                f"no library target links {TESTING_TARGET}: it is for tests, tools and "
                "benchmarks only (DESIGN.md section 8)"))
        if command.name == "target_link_libraries":
            violations.extend(_link_violations(command, target, links, defined))
        if target not in CUDA_FREE_TARGETS:
            continue
        if command.name in ("add_library", "target_sources"):
            for source in _sources(command):
                if source.endswith((".cu", ".cuh")):
                    violations.append(Violation(
                        command.path, command.line, f"{command.name}({target} ... {source})",
                        "cuda-source",
                        f"{target} compiles no .cu file: core, plan and cpu build with no "
                        "CUDA toolkit (DESIGN.md section 8)"))
        for arg in links:
            found = cuda_link.search(arg)
            if found:
                violations.append(Violation(
                    command.path, command.line,
                    f"target_link_libraries({target} ... {found.group(0)})", "cuda-link",
                    f"{target} links nothing of CUDA: core, plan and cpu build with no "
                    "CUDA toolkit (DESIGN.md section 8)"))
    return violations


# ---- driver -----------------------------------------------------------------------------

def check(root):
    """Every violation in the tree at root, sorted by file and line."""
    commands = collect_cmake(root)
    violations = check_includes(root)
    violations.extend(check_cmake(root, commands))
    return sorted(set(violations))


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} ROOT", file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1])
    if not os.path.isdir(os.path.join(root, "include", "thdcp")) \
            or not os.path.isfile(os.path.join(root, "CMakeLists.txt")):
        print(f"{root}: no include/thdcp/ or CMakeLists.txt here; pass the thdcp source root",
              file=sys.stderr)
        return 2
    files = list(source_files(root))
    cmakes = list(cmake_files(root))
    violations = check(root)
    for violation in violations:
        print(violation)
    print(f"layering: {len(files)} source files and {len(cmakes)} CMake files checked, "
          f"{len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
