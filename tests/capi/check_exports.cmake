# Checks that a shared library exports only the C ABI: every defined dynamic symbol is
# thdcp_* or one of the linker's own, and the ABI's entry points are there (so an empty or
# unreadable symbol table cannot pass).
#   cmake -DNM=<nm> -DLIBRARY=<libthdcp.so> -P check_exports.cmake
if(NOT NM OR NOT LIBRARY)
  message(FATAL_ERROR "usage: cmake -DNM=<nm> -DLIBRARY=<library> -P check_exports.cmake")
endif()
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY}
                OUTPUT_VARIABLE symbols ERROR_VARIABLE errors RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed (${status}): ${errors}")
endif()
# Symbols the linker and the ELF ABI define in every shared library.
set(allowed _init _fini _edata _end __bss_start _DYNAMIC _GLOBAL_OFFSET_TABLE_)
string(REPLACE "\n" ";" lines "${symbols}")
set(exported 0)
set(foreign "")
foreach(line IN LISTS lines)
  if(line STREQUAL "")
    continue()
  endif()
  string(REGEX REPLACE "^.* ([^ ]+)$" "\\1" name "${line}")
  string(REGEX REPLACE "@.*$" "" name "${name}")  # symbol versions (name@@VERSION)
  if(name MATCHES "^thdcp_")
    math(EXPR exported "${exported} + 1")
  elseif(NOT name IN_LIST allowed)
    string(APPEND foreign "  ${line}\n")
  endif()
endforeach()
if(NOT foreign STREQUAL "")
  message(FATAL_ERROR "${LIBRARY} exports symbols outside the C ABI (thdcp_*); "
                      "check src/capi/thdcp.map and the visibility flags:\n${foreign}")
endif()
foreach(required thdcp_version_string thdcp_abi_version thdcp_last_error thdcp_attention_forward
                 thdcp_cp_forward thdcp_graph_bank_run thdcp_cp_local_rows_ex thdcp_cp_split_ex
                 thdcp_cp_merge_ex thdcp_make_contiguous_layout thdcp_cp_plan_kv_traffic)
  if(NOT symbols MATCHES "[ \n]${required}(@|\n|$)")
    message(FATAL_ERROR "${LIBRARY} does not export ${required}")
  endif()
endforeach()
message(STATUS "${LIBRARY}: ${exported} thdcp_* symbols exported, nothing else")
