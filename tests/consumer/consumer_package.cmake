# Included by tests/CMakeLists.txt (tests/consumer/CMakeLists.txt is the consumer project
# itself, which a thdcp build never adds as a subdirectory).
#
# The installed CMake package (issue 11): tests/consumer/run.sh installs this build into
# consumer_work/prefix, builds tests/consumer (a separate project: find_package(thdcp 0.2
# CONFIG REQUIRED)) against it and runs it, checks refused versions, then does the same
# against the build tree's export. It needs the whole build done (cmake --build first).
# The consumer is compiled and linked with this build's compiler and flags (a sanitized
# build, tests/sanitize/run.sh, needs its -fsanitize flags at the consumer's link too).
set(THDCP_CONSUMER_ENV CMAKE=${CMAKE_COMMAND} CMAKE_GENERATOR=${CMAKE_GENERATOR} CXX=${CMAKE_CXX_COMPILER}
    "CXXFLAGS=${CMAKE_CXX_FLAGS}" "LDFLAGS=${CMAKE_EXE_LINKER_FLAGS}" JOBS=2)
if(THDCP_HAVE_CUDA)
  # The consumer's find_dependency(CUDAToolkit) looks at the toolkit this build used.
  get_filename_component(THDCP_CUDA_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND THDCP_CONSUMER_ENV CUDAToolkit_ROOT=${THDCP_CUDA_ROOT})
endif()
add_test(NAME consumer_package
         COMMAND ${CMAKE_COMMAND} -E env ${THDCP_CONSUMER_ENV}
                 ${CMAKE_CURRENT_LIST_DIR}/run.sh ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/consumer_work)
set_tests_properties(consumer_package PROPERTIES LABELS "cpu;package" TIMEOUT 900 PROCESSORS 2)
