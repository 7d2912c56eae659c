#!/usr/bin/env python3
"""Self-test of check_layering.py, so that the layering check cannot pass by checking
nothing: a clean fake tree must report nothing, and the same tree with one violation added
must report exactly that violation (rule, file and line), for every rule.

    test_check_layering.py        (ctest: layering_self_test)
"""

import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_layering  # noqa: E402

# A small tree that follows every rule, with the cases the checker must not flag: CUDA in
# comments, in `#if 0` and in strings; the __CUDACC__ test of core/host_device.h; relative
# includes; CUDA in cuda and comm_device; tests and tools using anything; test binaries,
# thdcp_cli, a tests/ helper and a benchmark linking thdcp_testing; link lines that follow
# the table, the umbrella target included.
CLEAN = {
    "CMakeLists.txt": """\
cmake_minimum_required(VERSION 3.25)
project(fake LANGUAGES CXX)
add_library(thdcp_core STATIC src/core/error.cpp)
add_library(thdcp_plan STATIC src/plan/layout.cpp)
target_link_libraries(thdcp_plan PUBLIC thdcp_core)
add_library(thdcp_cpu STATIC
  src/cpu/attention.cpp)  # a comment with thdcp_testing and kernels.cu in it
target_link_libraries(thdcp_cpu PUBLIC thdcp_plan Threads::Threads)
add_library(thdcp_comm STATIC src/comm/in_process.cpp)
target_link_libraries(thdcp_comm PUBLIC thdcp_core)
add_library(thdcp_comm_device STATIC src/comm_device/shared_gpu.cpp src/comm_device/peer_copy.cu)
target_link_libraries(thdcp_comm_device PUBLIC thdcp_comm CUDA::cudart)
add_subdirectory(src/cuda)
add_library(thdcp_cp STATIC src/cp/allgather.cpp)
target_link_libraries(thdcp_cp PUBLIC thdcp_cpu thdcp_comm thdcp_cuda thdcp_comm_device)
add_library(thdcp_graph STATIC src/graph/bank.cpp)
target_link_libraries(thdcp_graph PUBLIC thdcp_comm_device $<BUILD_INTERFACE:thdcp_plan>
                      $<INSTALL_INTERFACE:thdcp::nccl>)
add_library(thdcp INTERFACE)
target_link_libraries(thdcp INTERFACE thdcp_cp thdcp_graph)
add_library(thdcp_testing STATIC src/testing/workload.cpp)
target_link_libraries(thdcp_testing PUBLIC thdcp_cpu)
include(tools/io.cmake)
add_executable(thdcp_cli tools/main.cpp)
target_link_libraries(thdcp_cli PRIVATE thdcp thdcp_testing thdcp_tools_io)
add_subdirectory(src/capi)
add_subdirectory(tests)
add_subdirectory(bench)
""",
    "src/capi/CMakeLists.txt": """\
add_library(thdcp_c SHARED thdcp_c.cpp)
target_link_libraries(thdcp_c PRIVATE thdcp_cp thdcp_graph)
""",
    "src/cuda/CMakeLists.txt": """\
add_library(thdcp_cuda STATIC kernels.cu attention.cpp)
target_link_libraries(thdcp_cuda PUBLIC thdcp_core CUDA::cudart)
""",
    "tools/io.cmake": """\
add_library(thdcp_tools_io STATIC ${CMAKE_CURRENT_LIST_DIR}/npy.cpp)
target_link_libraries(thdcp_tools_io PUBLIC thdcp_plan)
""",
    "cmake/Options.cmake": "set(THDCP_WARNINGS -Wall)\n",
    "tests/CMakeLists.txt": """\
function(thdcp_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest)
endfunction()
thdcp_add_test(test_plan SOURCES plan/test.cpp LIBS thdcp_plan thdcp_testing)
add_executable(test_cp_mpi cp/test_cp_mpi.cpp)
target_link_libraries(test_cp_mpi PRIVATE thdcp_cp thdcp_testing)
add_executable(npy_interop tools/npy_interop.cpp)
target_link_libraries(npy_interop PRIVATE thdcp_tools_io $<BUILD_INTERFACE:thdcp_testing>)
""",
    "bench/CMakeLists.txt": """\
add_executable(bench_attention attention.cpp)
target_link_libraries(bench_attention PRIVATE thdcp_cp thdcp_testing)
""",
    "include/thdcp/core/host_device.h": """\
#pragma once
#if defined(__CUDACC__)
#define THDCP_HD __host__ __device__ __forceinline__
#else
#define THDCP_HD inline
#endif
""",
    "include/thdcp/core/error.h": "#pragma once\n#include <stdexcept>\n#include <string>\n",
    "src/core/error.cpp": '#include "thdcp/core/error.h"\n',
    "include/thdcp/plan/segment.h": """\
// Index math shared with the kernels; not #include <cuda_runtime.h>: host_device.h does it.
#pragma once
#include "thdcp/core/host_device.h"
#include <thdcp/core/error.h>
/* #include "thdcp/cuda/attention.h"
   __device__ in a block comment */
#if 0
#include <cuda.h>
#if defined(X)
#include <nccl.h>
#endif
#endif
namespace thdcp {
inline const char* where() { return "__device__ <<< in a string"; }
constexpr int kBig = 1'000'000;
}
""",
    "include/thdcp/plan/layout.h": '#pragma once\n#include "thdcp/plan/segment.h"\n',
    "src/plan/layout.cpp": '#include "thdcp/plan/layout.h"\n#include "local.h"\n',
    "src/plan/local.h": '#pragma once\n#include "thdcp/core/error.h"\n',
    "include/thdcp/cpu/attention.h": '#pragma once\n#include "thdcp/plan/segment.h"\n#include "thdcp/core/error.h"\n',
    "src/cpu/attention.cpp": '#include "thdcp/cpu/attention.h"\n#include "thread_pool.h"\n',
    "src/cpu/thread_pool.h": "#pragma once\n#include <thread>\n",
    "include/thdcp/comm/communicator.h": '#pragma once\n#include "thdcp/core/error.h"\n',
    "include/thdcp/comm_device/device_communicator.h": "#pragma once\n#include <cuda_runtime_api.h>\n",
    "include/thdcp/comm_device/shared_gpu.h": """\
#pragma once
#include <cuda_runtime_api.h>
#include "thdcp/comm/communicator.h"
#include "thdcp/comm_device/device_communicator.h"
""",
    "include/thdcp/core/cuda_check.h": '#pragma once\n#include "thdcp/core/error.h"\n',
    "src/comm_device/shared_gpu.cpp": '#include "thdcp/comm_device/shared_gpu.h"\n#include "thdcp/core/cuda_check.h"\n',
    "src/comm_device/peer_copy.cu": '#include <thdcp/core/cuda_check.h>\n__global__ void copy() {}\n',
    "src/comm/in_process.cpp": '#include "thdcp/comm/communicator.h"\n#include <thread>\n',
    "include/thdcp/cuda/check.h": '#pragma once\n#include <cuda_runtime_api.h>\n#include "thdcp/core/error.h"\n',
    "include/thdcp/cuda/attention.h": """\
#pragma once
#include <cuda_runtime_api.h>
#include "thdcp/plan/segment.h"
#include "thdcp/core/error.h"
""",
    "src/cuda/launch.h": '#pragma once\n#include <cuda_fp16.h>\n#include "thdcp/plan/segment.h"\n',
    "src/cuda/kernels.cu": """\
#include "launch.h"
#include <cuda_bf16.h>
#include <cub/block/block_scan.cuh>
#include "thdcp/cuda/check.h"
__global__ void kernel() {}
""",
    "src/cuda/attention.cpp": '#include "thdcp/cuda/attention.h"\n#include "launch.h"\n',
    "include/thdcp/cp/cp.h": """\
#pragma once
#include "thdcp/cpu/attention.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/plan/layout.h"
#include "thdcp/core/error.h"
""",
    "src/cp/allgather.cpp": '#include "thdcp/cp/cp.h"\n#include "../cuda/launch.h"\n',
    "include/thdcp/graph/bank.h": """\
#pragma once
#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/plan/layout.h"
""",
    "src/graph/bank.cpp": '#include "thdcp/graph/bank.h"\n',
    "include/thdcp/testing/workload.h": '#pragma once\n#include "thdcp/graph/bank.h"\n#include "thdcp/cpu/attention.h"\n',
    "src/testing/workload.cpp": '#include "thdcp/testing/workload.h"\n',
    "include/thdcp/thdcp.h": "#ifndef THDCP_H_\n#define THDCP_H_\n#include <stdint.h>\n#endif\n",
    "src/capi/status.h": '#pragma once\n#include "thdcp/thdcp.h"\n#include "thdcp/core/error.h"\n',
    "src/capi/thdcp_c.cpp": """\
#include "capi_status.h"
#include "thdcp/thdcp.h"
#include "thdcp/graph/bank.h"
#include "thdcp/cp/cp.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/cuda/check.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/plan/layout.h"
""",
    "tools/main.cpp": '#include "thdcp/testing/workload.h"\n#include "thdcp/graph/bank.h"\n#include "npy.h"\n',
    "tools/npy.h": "#pragma once\n",
    "tools/npy.cpp": '#include "npy.h"\n',
    "tests/plan/test.cpp": '#include "thdcp/testing/workload.h"\n#include <cuda_runtime.h>\n',
    "bench/attention.cpp": '#include "thdcp/testing/workload.h"\n',
}

CUDA_HEADERS = ["<cuda_runtime.h>", "<cuda_runtime_api.h>", "<cuda.h>", "<cuda_fp16.h>",
                "<cuda_bf16.h>", "<nccl.h>", '"thdcp/cuda/check.h"', "<thdcp/cuda/attention.h>"]

# (what the case shows, files added or replaced, (file, line, rule) it must report)
CASES = [
    # core, plan and cpu include no CUDA header (one case per header and per part).
    *[(f"{part} includes {header}",
       {path: f"#pragma once\n#include <vector>\n#include {header}\n"},
       (path, 3, "cuda-header"))
      for part, path in (("plan", "include/thdcp/plan/bad.h"), ("cpu", "src/cpu/bad.cpp"),
                         ("core", "include/thdcp/core/bad.h"))
      for header in CUDA_HEADERS],
    ("plan uses __device__ outside host_device.h",
     {"include/thdcp/plan/bad.h": "#pragma once\n__device__ int f();\n"},
     ("include/thdcp/plan/bad.h", 2, "cuda-keyword")),
    ("cpu tests __CUDACC__",
     {"src/cpu/bad.cpp": "#include <vector>\n#ifdef __CUDACC__\n#endif\n"},
     ("src/cpu/bad.cpp", 2, "cuda-keyword")),
    ("core launches a kernel",
     {"src/core/bad.cpp": "void f() {\n  g<<<1, 1>>>();\n}\n"},
     ("src/core/bad.cpp", 2, "cuda-keyword")),
    # A part includes only the parts it depends on.
    ("core includes plan",
     {"include/thdcp/core/bad.h": '#include "thdcp/plan/segment.h"\n'},
     ("include/thdcp/core/bad.h", 1, "part-dependency")),
    ("plan includes cpu",
     {"src/plan/bad.cpp": '#include "thdcp/cpu/attention.h"\n'},
     ("src/plan/bad.cpp", 1, "part-dependency")),
    ("cpu includes comm",
     {"src/cpu/bad.cpp": '#include "thdcp/comm/communicator.h"\n'},
     ("src/cpu/bad.cpp", 1, "part-dependency")),
    ("comm includes plan",
     {"include/thdcp/comm/bad.h": '#pragma once\n#include "thdcp/plan/layout.h"\n'},
     ("include/thdcp/comm/bad.h", 2, "part-dependency")),
    ("comm includes plan through a relative path",
     {"src/comm/bad.cpp": '#include "../plan/local.h"\n'},
     ("src/comm/bad.cpp", 1, "part-dependency")),
    ("a host communicator includes a device communicator",
     {"src/comm/in_process.cpp": '#include "thdcp/comm/communicator.h"\n'
                                 '#include "thdcp/comm_device/device_communicator.h"\n'},
     ("src/comm/in_process.cpp", 2, "part-dependency")),
    ("a device communicator includes cuda",
     {"src/comm_device/shared_gpu.cpp": '#include "thdcp/cuda/check.h"\n'},
     ("src/comm_device/shared_gpu.cpp", 1, "part-dependency")),
    ("graph includes cp",
     {"src/graph/bank.cpp": '#include "thdcp/graph/bank.h"\n#include "thdcp/cp/cp.h"\n'},
     ("src/graph/bank.cpp", 2, "part-dependency")),
    ("cuda includes comm",
     {"include/thdcp/cuda/bad.h": '#include "thdcp/comm_device/device_communicator.h"\n'},
     ("include/thdcp/cuda/bad.h", 1, "part-dependency")),
    ("cuda includes cp (angle form)",
     {"src/cuda/bad.cu": "#include <thdcp/cp/cp.h>\n"},
     ("src/cuda/bad.cu", 1, "part-dependency")),
    ("cuda includes graph",
     {"src/cuda/bad.cu": '#include "thdcp/graph/bank.h"\n'},
     ("src/cuda/bad.cu", 1, "part-dependency")),
    ("cuda includes testing",
     {"src/cuda/bad.cu": '#include "thdcp/testing/workload.h"\n'},
     ("src/cuda/bad.cu", 1, "part-dependency")),
    ("cuda includes cpu",
     {"include/thdcp/cuda/bad.h": '#include "thdcp/cpu/attention.h"\n'},
     ("include/thdcp/cuda/bad.h", 1, "part-dependency")),
    ("cp includes graph",
     {"src/cp/bad.cpp": '#include "thdcp/graph/bank.h"\n'},
     ("src/cp/bad.cpp", 1, "part-dependency")),
    ("cp includes testing",
     {"include/thdcp/cp/bad.h": '#include "thdcp/testing/workload.h"\n'},
     ("include/thdcp/cp/bad.h", 1, "part-dependency")),
    ("graph includes testing",
     {"src/graph/bad.cpp": '#include "thdcp/testing/workload.h"\n'},
     ("src/graph/bad.cpp", 1, "part-dependency")),
    ("testing includes tools",
     {"src/testing/bad.cpp": '#include "../../tools/npy.h"\n'},
     ("src/testing/bad.cpp", 1, "part-dependency")),
    # The C ABI sits on top: it includes every library part, and no part includes it.
    ("cp includes the C ABI header",
     {"src/cp/bad.cpp": '#include "thdcp/cp/cp.h"\n#include "thdcp/thdcp.h"\n'},
     ("src/cp/bad.cpp", 2, "part-dependency")),
    ("graph includes the C ABI header (angle form)",
     {"include/thdcp/graph/bad.h": "#pragma once\n#include <thdcp/thdcp.h>\n"},
     ("include/thdcp/graph/bad.h", 2, "part-dependency")),
    ("the tools include the C ABI header",
     {"tools/bad.cpp": '#include "thdcp/thdcp.h"\n'},
     ("tools/bad.cpp", 1, "part-dependency")),
    ("testing includes a header of src/capi",
     {"src/testing/bad.cpp": '#include "../capi/status.h"\n'},
     ("src/testing/bad.cpp", 1, "part-dependency")),
    ("capi includes testing",
     {"src/capi/bad.cpp": '#include "thdcp/testing/workload.h"\n'},
     ("src/capi/bad.cpp", 1, "part-dependency")),
    ("capi includes the tools",
     {"src/capi/bad.cpp": '#include "../../tools/npy.h"\n'},
     ("src/capi/bad.cpp", 1, "part-dependency")),
    ("the PyTorch operators (bindings) include testing",
     {"python/csrc/bad.cpp": '#include "thdcp/cp/cuda.h"\n#include "thdcp/testing/workload.h"\n'},
     ("python/csrc/bad.cpp", 2, "part-dependency")),
    # Folders that are no part of the table.
    ("a folder that is no part",
     {"include/thdcp/misc/utils.h": "#pragma once\n"},
     ("include/thdcp/misc/utils.h", 1, "unknown-part")),
    ("an include of a folder that is no part",
     {"src/cp/bad.cpp": '#include "thdcp/misc/utils.h"\n'},
     ("src/cp/bad.cpp", 1, "unknown-part")),
    # CMake: link lines follow the table of the parts, as includes do.
    ("graph links cp (a planted wrong link edge)",
     {"cmake/bad.cmake": "target_link_libraries(thdcp_graph PUBLIC thdcp_cp_cuda)\n"},
     ("cmake/bad.cmake", 1, "link-dependency")),
    ("cuda links a communicator, in a generator expression",
     {"src/cuda/CMakeLists.txt": CLEAN["src/cuda/CMakeLists.txt"]
      + "target_link_libraries(thdcp_cuda PRIVATE $<BUILD_INTERFACE:thdcp_comm_device>)\n"},
     ("src/cuda/CMakeLists.txt", 3, "link-dependency")),
    ("cp links the umbrella, which brings graph",
     {"cmake/bad.cmake": "target_link_libraries(thdcp_cp PRIVATE thdcp)\n"},
     ("cmake/bad.cmake", 1, "link-dependency")),
    ("the C ABI's library is linked by a part below it",
     {"cmake/bad.cmake": "\ntarget_link_libraries(thdcp_comm PUBLIC thdcp_c)\n"},
     ("cmake/bad.cmake", 2, "link-dependency")),
    ("a library target no part owns",
     {"cmake/bad.cmake": "add_library(thdcp_misc STATIC src/misc.cpp)\n"
                         "target_link_libraries(thdcp_misc PUBLIC thdcp_core)\n"},
     ("cmake/bad.cmake", 2, "unknown-target")),
    ("a part links a target no part owns",
     {"cmake/bad.cmake": "target_link_libraries(thdcp_plan PUBLIC thdcp_misc)\n"},
     ("cmake/bad.cmake", 1, "unknown-target")),
    # CMake: no library links thdcp_testing.
    ("a library links thdcp_testing",
     {"cmake/bad.cmake": "\ntarget_link_libraries(thdcp_cp\n  PUBLIC thdcp_testing)\n"},
     ("cmake/bad.cmake", 2, "testing-link")),
    ("a library links thdcp_testing in a generator expression",
     {"src/cuda/CMakeLists.txt": CLEAN["src/cuda/CMakeLists.txt"]
      + "target_link_libraries(thdcp_cuda PRIVATE $<BUILD_INTERFACE:thdcp_testing>)\n"},
     ("src/cuda/CMakeLists.txt", 3, "testing-link")),
    ("the tool's io library links thdcp_testing",
     {"tools/io.cmake": CLEAN["tools/io.cmake"]
      + "target_link_libraries(thdcp_tools_io PRIVATE thdcp_testing)\n"},
     ("tools/io.cmake", 3, "testing-link")),
    ("a library links an alias of thdcp_testing",
     {"cmake/bad.cmake": "add_library(thdcp::testing ALIAS thdcp_testing)\n"
                         "target_link_libraries(thdcp_plan PRIVATE thdcp::testing)\n"},
     ("cmake/bad.cmake", 2, "testing-link")),
    ("link_libraries(thdcp_testing) outside tests/",
     {"cmake/bad.cmake": "link_libraries(thdcp_testing)\n"},
     ("cmake/bad.cmake", 1, "testing-link")),
    # CMake: core, plan and cpu compile no .cu and link nothing of CUDA.
    ("thdcp_plan compiles a .cu file",
     {"cmake/bad.cmake": "add_library(thdcp_plan STATIC src/plan/layout.cpp src/plan/table.cu)\n"},
     ("cmake/bad.cmake", 1, "cuda-source")),
    ("thdcp_cpu gets a .cu file through target_sources",
     {"cmake/bad.cmake": "\n\ntarget_sources(thdcp_cpu PRIVATE ${PROJECT_SOURCE_DIR}/src/cpu/fast.cu)\n"},
     ("cmake/bad.cmake", 3, "cuda-source")),
    ("thdcp_core compiles a .cu file",
     {"cmake/bad.cmake": "add_library(thdcp_core OBJECT\n  src/core/error.cpp\n  src/core/half.cu)\n"},
     ("cmake/bad.cmake", 1, "cuda-source")),
    ("thdcp_cpu links the CUDA runtime",
     {"cmake/bad.cmake": "target_link_libraries(thdcp_cpu PUBLIC CUDA::cudart)\n"},
     ("cmake/bad.cmake", 1, "cuda-link")),
]


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


def run_main(root):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = check_layering.main(["check_layering.py", root])
    return code, out.getvalue()


class CheckLayeringTest(unittest.TestCase):
    def tree(self, extra=None):
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        files = dict(CLEAN)
        files.update(extra or {})
        write_tree(directory.name, files)
        return directory.name

    def test_clean_tree_reports_nothing(self):
        root = self.tree()
        self.assertEqual(check_layering.check(root), [])
        code, out = run_main(root)
        self.assertEqual(code, 0, out)
        # The clean tree was really read: every source file and every CMake file.
        sources = [r for r in CLEAN if r.split("/")[0] in ("include", "src", "tools")
                   and r.endswith(check_layering.CXX_EXTENSIONS)]
        cmakes = [r for r in CLEAN if r.endswith(("CMakeLists.txt", ".cmake"))]
        self.assertIn(f"{len(sources)} source files and {len(cmakes)} CMake files checked, "
                      "0 violation(s)", out)

    def test_each_violation_is_reported_alone(self):
        for name, files, (path, line, rule) in CASES:
            with self.subTest(name):
                found = check_layering.check(self.tree(files))
                self.assertEqual([(v.path, v.line, v.rule) for v in found], [(path, line, rule)],
                                 "\n".join(map(str, found)))
                self.assertTrue(str(found[0]).startswith(f"{path}:{line}: "))

    def test_all_violations_together_fail_the_check(self):
        files = {}
        expected = set()
        for _, case_files, where in CASES:
            if any(rel in files for rel in case_files):
                continue  # one file per case here, so every case keeps its own line
            files.update(case_files)
            expected.add(where)
        code, out = run_main(self.tree(files))
        self.assertEqual(code, 1, out)
        printed = {line.split(": ")[0] for line in out.splitlines() if " — " in line}
        self.assertEqual(printed, {f"{path}:{line}" for path, line, _ in expected}, out)

    def test_the_real_table_keeps_design_rules(self):
        parts = check_layering.PARTS
        self.assertEqual(parts["core"], set())
        self.assertNotIn("plan", parts["comm"])
        for above in ("comm", "cp", "graph", "testing", "cpu"):
            self.assertNotIn(above, parts["cuda"])
        self.assertNotIn("graph", parts["cp"])
        for below in ("cp", "cuda", "cpu"):
            self.assertNotIn(below, parts["graph"])  # graph knows steps only as callables
        self.assertEqual(parts["comm_device"], {"comm", "core"})
        self.assertEqual(check_layering.part_of("src/comm_device/nccl_communicator.cpp"), "comm_device")
        self.assertEqual(check_layering.part_of("include/thdcp/comm_device/nccl.h"), "comm_device")
        for target, part in check_layering.TARGET_PARTS.items():
            self.assertTrue(part in parts or part == "umbrella", target)
        self.assertNotIn("tools", parts["graph"])
        self.assertNotIn("testing", parts["graph"])
        self.assertNotIn("tools", parts["testing"])
        for part in ("core", "plan", "cpu", "comm", "comm_device", "cuda", "cp", "graph"):
            self.assertNotIn("testing", parts[part])
            self.assertIn(part, parts["capi"])  # capi may include every library part
        for part in parts:
            if part not in ("capi", "bindings"):
                self.assertNotIn("capi", parts[part])  # and nothing includes capi
        self.assertNotIn("testing", parts["capi"])
        self.assertNotIn("tools", parts["capi"])
        self.assertEqual(check_layering.part_of("include/thdcp/thdcp.h"), "capi")
        self.assertEqual(check_layering.part_of("src/capi/thdcp_c.cpp"), "capi")

    def test_not_a_thdcp_tree_is_an_error(self):
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        code, out = run_main(os.path.join(directory.name, "missing"))
        self.assertEqual(code, 2, out)


if __name__ == "__main__":
    unittest.main()
