# tools/cli_expect.cmake: runs the comet CLI once and checks how it ended (a ctest helper).
#   cmake -DEXE=build/tools/comet "-DARGS=run --ep 3" -DCODE=2 "-DREGEX=not divisible" -P cli_expect.cmake
# CODE: the exit code expected. REGEX: matched against stderr when CODE is not 0, else stdout.
# JSON_PASS=ON: stdout must be one JSON object whose verify.pass is true.
# <0xff> in ARGS stands for the byte 0xFF (a path that is not UTF-8), which CMakeLists.txt
# cannot spell portably. EMPTY_LAST_ARG=ON appends one empty argument (`--out ""`), which ARGS
# cannot carry. STDOUT_FILE: stdout goes to this file (e.g. /dev/full) instead of being matched.
# A non-zero exit must print exactly one line, `comet: error: <reason>`, on stderr: scripts
# that wrap the CLI show that line to users, so a stack of lines or a bare abort is a bug.
string(ASCII 255 byte_ff)
string(REPLACE "<0xff>" "${byte_ff}" ARGS "${ARGS}")
separate_arguments(args UNIX_COMMAND "${ARGS}")
if(DEFINED STDOUT_FILE)
  execute_process(COMMAND "${EXE}" ${args}
                  RESULT_VARIABLE code OUTPUT_FILE "${STDOUT_FILE}" ERROR_VARIABLE err)
elseif(EMPTY_LAST_ARG)
  execute_process(COMMAND "${EXE}" ${args} ""
                  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
else()
  execute_process(COMMAND "${EXE}" ${args}
                  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
endif()
string(REPLACE ";" " " shown "${ARGS}")
if(NOT "${code}" STREQUAL "${CODE}")
  message(FATAL_ERROR "comet ${shown}: exit code ${code}, expected ${CODE}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT CODE EQUAL 0)
  if(NOT err MATCHES "^comet: error: [^\n]+\n$")
    message(FATAL_ERROR "comet ${shown}: stderr is not one `comet: error:` line:\n${err}")
  endif()
  set(checked "${err}")
else()
  set(checked "${out}")
endif()
if(DEFINED REGEX AND NOT checked MATCHES "${REGEX}")
  message(FATAL_ERROR "comet ${shown}: output does not match `${REGEX}`:\n${checked}")
endif()
if(JSON_PASS)
  string(JSON pass ERROR_VARIABLE json_error GET "${out}" verify pass)
  if(json_error OR NOT pass)
    message(FATAL_ERROR "comet ${shown}: verify.pass is not true (${json_error}):\n${out}")
  endif()
endif()
message(STATUS "comet ${shown}: exit ${code} as expected")
