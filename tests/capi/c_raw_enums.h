/* The _ex split helpers called with a thdcp_cp_layout_t argument of any int value, as a C
 * caller may pass it. The calls are made from C (c_raw_enums.c), where an int converts to
 * the enumeration as it is; made from C++, a variable of the enum type holding a value
 * outside the enumeration is undefined behaviour in the test itself (UBSan: load of an
 * invalid enum value), before the library sees it. */
#ifndef THDCP_TESTS_CAPI_C_RAW_ENUMS_H_
#define THDCP_TESTS_CAPI_C_RAW_ENUMS_H_

#include "thdcp/thdcp.h"

#ifdef __cplusplus
extern "C" {
#endif

thdcp_status_t raw_cp_local_rows_ex(const thdcp_layout_t* layout, int cp, int rank, int32_t* global_rows,
                                    int64_t num_rows, int cp_layout);
thdcp_status_t raw_cp_split_ex(const void* global, void* local, size_t row_bytes, const thdcp_layout_t* layout,
                               int cp, int rank, int cp_layout);
thdcp_status_t raw_cp_merge_ex(const void* local, void* global, size_t row_bytes, const thdcp_layout_t* layout,
                               int cp, int rank, int cp_layout);

#ifdef __cplusplus
}
#endif

#endif /* THDCP_TESTS_CAPI_C_RAW_ENUMS_H_ */
