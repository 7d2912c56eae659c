# File formats of the thdcp tool: .npy arrays, JSON summaries, SVG plots, atomic writes,
# and the plan report (plan_report.h: a CapacityPlan as SVG and JSON).
# Included from the top-level CMakeLists.txt (next to thdcp_cli), which links it.
add_library(thdcp_tools_io STATIC
  ${CMAKE_CURRENT_LIST_DIR}/atomic_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/npy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/json.cpp
  ${CMAKE_CURRENT_LIST_DIR}/svg.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plan_report.cpp)
target_include_directories(thdcp_tools_io PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_LIST_DIR}>)
# thdcp_plan: thdcp::Error's thrower and the planner behind plan_report.
target_link_libraries(thdcp_tools_io PUBLIC thdcp_plan)
target_compile_options(thdcp_tools_io PRIVATE ${THDCP_WARNINGS})
