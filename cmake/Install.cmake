# The installable CMake package (issue 11): `cmake --install build --prefix P`, then in a
# consumer `find_package(thdcp CONFIG REQUIRED)` with P on CMAKE_PREFIX_PATH, and link
# thdcp::thdcp (everything that was built) or one part (thdcp::core, thdcp::cpu, ...).
# The build tree is usable too: -Dthdcp_DIR=<build dir>. tests/consumer/ checks both ways.
#
# Included at the end of the top-level CMakeLists.txt, once every target exists.
#
# Install components, so that a packager (e.g. a Python wheel) can install one of them:
#   devel    headers, static libraries, the shared library's namelink, CMake files
#   runtime  the shared C-ABI library libthdcp.so (target thdcp_c), when it is built

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(THDCP_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/thdcp" CACHE STRING
    "Where the installed package puts thdcpConfig.cmake (relative to the prefix)")

# The headers use C++17 (nested namespaces such as thdcp::cuda): say so in the usage
# requirements, so that a consumer compiles them with -std=c++17 or later whatever its
# own default is.
target_compile_features(thdcp_core PUBLIC cxx_std_17)

# ---- the parts that are installed and exported, with their exported names ----
# Not exported: thdcp_testing (test support), thdcp_cuda_headers (a compile check),
# thdcp_tools_io and thdcp_cli (the CLI).
set(_thdcp_parts core plan cpu comm cp)
if(THDCP_HAVE_CUDA)
  list(APPEND _thdcp_parts cuda comm_device cp_cuda graph)
endif()
set(_thdcp_static_targets)
foreach(_part IN LISTS _thdcp_parts)
  set_target_properties(thdcp_${_part} PROPERTIES EXPORT_NAME ${_part})
  list(APPEND _thdcp_static_targets thdcp_${_part})
endforeach()
set_target_properties(thdcp PROPERTIES EXPORT_NAME thdcp)

# INCLUDES DESTINATION adds <prefix>/include to the usage requirements of every exported
# target in the install tree (the build tree keeps include/ of the source tree).
install(TARGETS ${_thdcp_static_targets} thdcp
  EXPORT thdcpTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The C ABI (src/capi): a shared library, libthdcp.so, exported as thdcp::c.
set(THDCP_HAVE_CAPI FALSE)
if(TARGET thdcp_c)
  set(THDCP_HAVE_CAPI TRUE)
  list(APPEND _thdcp_parts c)
  set_target_properties(thdcp_c PROPERTIES EXPORT_NAME c)
  # Users of thdcp::c need <thdcp/thdcp.h>: the include directory, unless thdcp_c names it.
  get_target_property(_thdcp_c_include thdcp_c INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT _thdcp_c_include)
    target_include_directories(thdcp_c INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                               $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  endif()
  # The installed library keeps finding the CUDA runtime, NCCL and MPI it was linked with
  # (their directories go into its RUNPATH), unless the target already says otherwise.
  get_target_property(_thdcp_c_rpath thdcp_c INSTALL_RPATH)
  get_target_property(_thdcp_c_use_link_path thdcp_c INSTALL_RPATH_USE_LINK_PATH)
  if(NOT _thdcp_c_rpath AND NOT _thdcp_c_use_link_path)
    set_target_properties(thdcp_c PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  endif()
  install(TARGETS thdcp_c
    EXPORT thdcpTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT devel
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel)
endif()

# ---- headers: include/thdcp/ less the test support (include/thdcp/testing/) ----
# Only the headers of parts that were built: a CPU-only build leaves out those of the CUDA
# parts, a build without thdcp_c the C ABI's header (nothing installed could link them).
set(_thdcp_header_excludes PATTERN "testing" EXCLUDE)
if(NOT TARGET thdcp_c)
  list(APPEND _thdcp_header_excludes PATTERN "thdcp.h" EXCLUDE PATTERN "capi" EXCLUDE)
endif()
if(NOT THDCP_HAVE_CUDA)
  list(APPEND _thdcp_header_excludes
    PATTERN "cuda" EXCLUDE                    # include/thdcp/cuda/ (thdcp_cuda)
    PATTERN "graph" EXCLUDE                   # include/thdcp/graph/ (thdcp_graph)
    PATTERN "cuda.h" EXCLUDE                  # cp/cuda.h (thdcp_cp_cuda)
    PATTERN "comm_device" EXCLUDE)            # include/thdcp/comm_device/ (thdcp_comm_device)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/thdcp
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT devel
  FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp" PATTERN "*.cuh"
  ${_thdcp_header_excludes})

# ---- targets files: install tree and build tree ----
install(EXPORT thdcpTargets
  NAMESPACE thdcp::
  FILE thdcpTargets.cmake
  DESTINATION ${THDCP_INSTALL_CMAKEDIR}
  COMPONENT devel)
export(EXPORT thdcpTargets
  NAMESPACE thdcp::
  FILE ${PROJECT_BINARY_DIR}/thdcpTargets.cmake)

# ---- thdcpConfig.cmake: what was built, and the dependencies of the exported targets ----
# Values substituted into cmake/thdcpConfig.cmake.in.
set(THDCP_EXPORTED_PARTS ${_thdcp_parts})
set(THDCP_CONFIG_CUDA_MAJOR "")
if(THDCP_HAVE_CUDA)
  set(THDCP_CONFIG_CUDA_MAJOR "${CUDAToolkit_VERSION_MAJOR}")
endif()
set(THDCP_CONFIG_NCCL_HINT "")
if(THDCP_HAVE_NCCL)
  get_filename_component(THDCP_CONFIG_NCCL_HINT "${THDCP_NCCL_LIBRARY}" DIRECTORY)
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/thdcpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/install/thdcpConfig.cmake
  INSTALL_DESTINATION ${THDCP_INSTALL_CMAKEDIR})
# The build tree's own config, next to the build tree's thdcpTargets.cmake.
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/thdcpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/thdcpConfig.cmake
  INSTALL_DESTINATION ${PROJECT_BINARY_DIR}
  INSTALL_PREFIX ${PROJECT_BINARY_DIR})

# SameMinorVersion: while the major version is 0 the API may change from one minor release
# to the next (0.2 -> 0.3), so a consumer asking for 0.2 accepts 0.2.x only; patch releases
# keep the API. Once 1.0 is out this should become SameMajorVersion.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/thdcpConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)

install(FILES
    ${PROJECT_BINARY_DIR}/cmake/install/thdcpConfig.cmake
    ${PROJECT_BINARY_DIR}/thdcpConfigVersion.cmake
  DESTINATION ${THDCP_INSTALL_CMAKEDIR}
  COMPONENT devel)

unset(_thdcp_parts)
unset(_thdcp_static_targets)
unset(_thdcp_header_excludes)
unset(_thdcp_c_include)
unset(_thdcp_c_rpath)
unset(_thdcp_c_use_link_path)
