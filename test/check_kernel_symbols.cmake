# check_kernel_symbols.cmake: the objects of src/kernels/ compiled for an
# instruction-set level above the baseline (avx2, avx512, avx512_vnni) define
# no weak or vague-linkage symbol (nm's W, V, u): the linker keeps one copy
# of such a symbol for the whole program, and were it this level's, code of
# the portable build would run AVX2 or AVX-512 instructions on a CPU
# without them.
#   cmake -DNM=<nm> "-DOBJECTS=<object>|<object>..." -P check_kernel_symbols.cmake
string(REPLACE "|" ";" objects "${OBJECTS}")
set(checked 0)
foreach(object IN LISTS objects)
  if(NOT object MATCHES "/(avx2|avx512|avx512_vnni)\\.cpp\\.o(bj)?$")
    continue()
  endif()
  execute_process(COMMAND ${NM} -C --defined-only ${object} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}")
  endif()
  string(REGEX MATCHALL "[^\n]* [WVu] [^\n]*" weak "${symbols}")
  if(weak)
    string(REPLACE ";" "\n  " weak "${weak}")
    message(FATAL_ERROR "${object} defines weak symbols, compiled for its level:\n  ${weak}")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
if(NOT checked EQUAL 3)
  message(FATAL_ERROR "expected the three level objects (avx2, avx512, avx512_vnni), found ${checked} in ${OBJECTS}")
endif()
message(STATUS "${checked} level objects, no weak symbols")
