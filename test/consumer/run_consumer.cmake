# ctest driver: builds and runs test/consumer against xfmr.
#   MODE=package       install XFMR_BUILD_DIR into a prefix, then find_package(xfmr)
#   MODE=subdirectory  add_subdirectory(XFMR_SOURCE_DIR)
# CONSUMER_CXX_COMPILER, CONSUMER_CXX_FLAGS, CONSUMER_LINKER_FLAGS: the
# calling build's compiler and flags.
file(REMOVE_RECURSE "${WORK_DIR}")
set(consumer_args)
if(MODE STREQUAL "package")
  execute_process(COMMAND ${CMAKE_COMMAND} --install "${XFMR_BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(rc)
    message(FATAL_ERROR "installing xfmr failed (${rc})")
  endif()
  list(APPEND consumer_args "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release)
  # The installed server drains on SIGTERM and SIGINT as the build tree's
  # does (its libraries start threads before main).
  if(EXISTS "${WORK_DIR}/prefix/bin/xfmr-serve")
    set(fixtures "${XFMR_SOURCE_DIR}/test/reference/fixtures")
    execute_process(COMMAND bash "${XFMR_SOURCE_DIR}/test/examples/serve_signals.sh" "${WORK_DIR}/prefix/bin/xfmr-serve"
                            "${fixtures}/families/gpt2-ctx2048" "${fixtures}/lm/tokenizer.json" "${WORK_DIR}/serve_signals"
                    RESULT_VARIABLE rc)
    if(rc)
      message(FATAL_ERROR "the installed xfmr-serve failed its signal checks (${rc})")
    endif()
  endif()
  # The Python module, where the build has one: imported from where it was
  # installed (docs/python.md's PYTHONPATH), it loads a model.
  file(GLOB module "${WORK_DIR}/prefix/lib/python3*/dist-packages/xfmr/_xfmr*.so")
  if(module)
    get_filename_component(package "${module}" DIRECTORY)  # .../dist-packages/xfmr
    get_filename_component(site "${package}" DIRECTORY)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env "PYTHONPATH=${site}" /usr/bin/python3 -c
                            "import xfmr; print(xfmr.load('${XFMR_SOURCE_DIR}/test/reference/fixtures/hf_llama').config['format'])"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out)
    if(rc OR NOT out STREQUAL "llama\n")
      message(FATAL_ERROR "the installed Python module did not load a model (${rc}): ${out}")
    endif()
  endif()
else()
  # What this mode adds to the package's test is xfmr's CMake as a
  # subproject: it configures, and its usage requirements (include paths,
  # definitions, language level) reach the consumer, whose source then
  # compiles. Building the libraries again (minutes on 2 cores) and linking
  # are the package mode's, and CI's main build's.
  list(APPEND consumer_args "-DXFMR_SOURCE_DIR=${XFMR_SOURCE_DIR}" "-DXFMR_CUDA=OFF" "-DXFMR_MPI=OFF"
       "-DCMAKE_BUILD_TYPE=Debug" "-DCMAKE_CXX_FLAGS_DEBUG=-O0")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${XFMR_SOURCE_DIR}/test/consumer" -B "${WORK_DIR}/build"
                        ${consumer_args} "-DCMAKE_CXX_COMPILER=${CONSUMER_CXX_COMPILER}"
                        "-DCMAKE_CXX_FLAGS=${CONSUMER_CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${CONSUMER_LINKER_FLAGS}"
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed (${rc})")
endif()
if(MODE STREQUAL "subdirectory")
  execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" --target main.cpp.o RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "compiling the consumer failed (${rc})")
  endif()
  return()
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" --parallel 2 RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed (${rc})")
endif()
# Its corpus: a few hundred lines of regular text, written here.
set(corpus "")
foreach(i RANGE 1 300)
  math(EXPR m "${i} % 7")
  string(APPEND corpus "the cat sat on the mat ${m} times.\n")
endforeach()
file(WRITE "${WORK_DIR}/run/corpus.txt" "${corpus}")
execute_process(COMMAND "${WORK_DIR}/build/consumer" corpus.txt WORKING_DIRECTORY "${WORK_DIR}/run" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer failed (${rc})")
endif()
