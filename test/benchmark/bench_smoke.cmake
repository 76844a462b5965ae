# Runs xfmr-bench once in smoke mode and checks that its JSON parses and
# holds every measurement, each with a positive median, the GEMM ceiling and
# the BLAS kernel. Speed is not asserted.
#   cmake -DBENCH=path/to/xfmr-bench -DWORK_DIR=dir -P bench_smoke.cmake
file(MAKE_DIRECTORY ${WORK_DIR})
function(check_run name expected)
  execute_process(COMMAND ${BENCH} ${ARGN} --smoke --json ${WORK_DIR}/${name}.json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "xfmr-bench ${ARGN} failed (${rc}):\n${out}${err}")
  endif()
  file(READ ${WORK_DIR}/${name}.json text)
  string(JSON impl ERROR_VARIABLE json_err GET "${text}" impl)
  if(json_err OR NOT impl STREQUAL "xfmr")
    message(FATAL_ERROR "${name}.json is not the bench's JSON: ${json_err}")
  endif()
  foreach(m IN LISTS expected)
    string(JSON median ERROR_VARIABLE json_err GET "${text}" results ${m} median_ms)
    if(json_err OR NOT median GREATER 0)
      message(FATAL_ERROR "${name}.json: results.${m}.median_ms missing or not positive (${json_err})")
    endif()
  endforeach()
  string(JSON ceiling GET "${text}" gemm_ceiling_gflops)
  if(NOT ceiling GREATER 0)
    message(FATAL_ERROR "${name}.json: no GEMM ceiling")
  endif()
  # Which BLAS ran the large products ("oneDNN sgemm ...", "OpenBLAS <core>"
  # or "none"), for benchmark/compare.
  string(JSON blas ERROR_VARIABLE json_err GET "${text}" blas)
  if(json_err OR NOT blas MATCHES "^(oneDNN sgemm.*|OpenBLAS .+|none)$")
    message(FATAL_ERROR "${name}.json: no BLAS kernel named (${json_err}): '${blas}'")
  endif()
endfunction()

check_run(lm "train_step;forward;generate_cached;generate_recompute;full_context_cached;full_context_recompute"
          --model tiny)
check_run(translator "translate_cached;translate_recompute;translate_full_context_cached;translate_full_context_recompute"
          --translator tiny --vocab 50)
# A shorter sequence for the train and forward passes, and one past MAX_T refused.
check_run(lm_seq8 "train_step;forward" --model tiny --modes train,forward --seq-len 8)
file(READ ${WORK_DIR}/lm_seq8.json text)
string(JSON seq_t GET "${text}" shape T)
if(NOT seq_t EQUAL 8)
  message(FATAL_ERROR "lm_seq8.json: shape.T is ${seq_t}, not 8")
endif()
execute_process(COMMAND ${BENCH} --model tiny --modes train --seq-len 17 RESULT_VARIABLE rc ERROR_VARIABLE err
                OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "--seq-len 17 exceeds tiny's MAX_T 16")
  message(FATAL_ERROR "a --seq-len past MAX_T was not refused: ${err}")
endif()
execute_process(COMMAND ${BENCH} --model tiny --modes train,fly RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "unknown mode 'fly'")
  message(FATAL_ERROR "an unknown mode was not refused: ${err}")
endif()
