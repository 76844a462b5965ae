# check_kernel_symbols.cmake: the objects of src/kernels/ compiled for an
# instruction-set level above the baseline (the row kernels' avx2, avx512 and
# avx512_vnni, the families' operations' ops_avx2 and ops_avx512) define no
# weak or vague-linkage symbol (nm's W, V, u) outside that level's own
# namespaces (ops_<level>, xfmr_eigen_<level>): the linker keeps one copy of
# such a symbol for the whole program, and were it this level's, code of the
# portable build would run AVX2 or AVX-512 instructions on a CPU without
# them. (The one exception, DW.ref.__gxx_personality_v0, is a pointer to the
# C++ runtime's personality routine, the same in every object.)
#   cmake -DNM=<nm> "-DOBJECTS=<object>|<object>..." -P check_kernel_symbols.cmake
string(REPLACE "|" ";" objects "${OBJECTS}")
set(checked 0)
foreach(object IN LISTS objects)
  if(NOT object MATCHES "/(ops_)?(avx2|avx512|avx512_vnni)\\.cpp\\.o(bj)?$")
    continue()
  endif()
  set(level ${CMAKE_MATCH_2})
  execute_process(COMMAND ${NM} -C --defined-only ${object} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}")
  endif()
  string(REGEX MATCHALL "[^\n]* [WVu] [^\n]*" weak "${symbols}")
  set(shared "")
  foreach(symbol IN LISTS weak)
    if(NOT symbol MATCHES "(ops|xfmr_eigen)_${level}[^a-z_0-9]" AND NOT symbol MATCHES " DW\\.ref\\.__gxx_personality_v0$")
      string(APPEND shared "\n  ${symbol}")
    endif()
  endforeach()
  if(shared)
    message(FATAL_ERROR "${object} defines weak symbols outside its level's namespaces, compiled for ${level}:${shared}")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
if(NOT checked EQUAL 5)
  message(FATAL_ERROR "expected the five level objects (avx2, avx512, avx512_vnni, ops_avx2, ops_avx512), "
                      "found ${checked} in ${OBJECTS}")
endif()
message(STATUS "${checked} level objects, no weak symbols outside their levels")
