/* See c_raw_enums.h. */
#include "c_raw_enums.h"

thdcp_status_t raw_cp_local_rows_ex(const thdcp_layout_t* layout, int cp, int rank, int32_t* global_rows,
                                    int64_t num_rows, int cp_layout) {
  return thdcp_cp_local_rows_ex(layout, cp, rank, global_rows, num_rows, (thdcp_cp_layout_t)cp_layout);
}

thdcp_status_t raw_cp_split_ex(const void* global, void* local, size_t row_bytes, const thdcp_layout_t* layout,
                               int cp, int rank, int cp_layout) {
  return thdcp_cp_split_ex(global, local, row_bytes, layout, cp, rank, (thdcp_cp_layout_t)cp_layout);
}

thdcp_status_t raw_cp_merge_ex(const void* local, void* global, size_t row_bytes, const thdcp_layout_t* layout,
                               int cp, int rank, int cp_layout) {
  return thdcp_cp_merge_ex(local, global, row_bytes, layout, cp, rank, (thdcp_cp_layout_t)cp_layout);
}
