# cmake/comet_nccl.cmake: finds NCCL >= 2.28 for the Nccl fabric (src/fabric/nccl_fabric.cu).
# Included by the top-level CMakeLists.txt after CUDA is set up.
#
#   COMET_ENABLE_NCCL  AUTO (default: build the Nccl fabric when NCCL >= 2.28 is found),
#                      ON (required: configuring fails without it), OFF. Needs the CUDA backend.
#   COMET_NCCL_ROOT    an NCCL install (include/nccl.h, lib/ or lib64/libnccl.so[.2]) searched first
#
# Search order, for the headers and the library separately (the first place that has each):
#   1. COMET_NCCL_ROOT
#   2. the Python environment's NVIDIA wheel: `python3 -c "import nvidia.nccl"` -> its include/ and
#      lib/ (the wheel ships only lib/libnccl.so.2, no unversioned libnccl.so)
#   3. the CUDA toolkit (CUDAToolkit_INCLUDE_DIRS, CUDAToolkit_LIBRARY_DIR)
# The library is linked by its full path through the imported target comet::nccl, so the
# versioned file works; the build tree's RPATH then holds its directory.
#
# Pitfall: headers and library from different places can disagree in version. Configuring says
# so, and the Nccl fabric compares ncclGetVersion() with NCCL_VERSION_CODE at start-up.
#
# Result: COMET_HAVE_NCCL (ON/OFF) and, when ON, the target comet::nccl.

set(COMET_ENABLE_NCCL AUTO CACHE STRING "Build the Nccl fabric: AUTO (when NCCL >= 2.28 is found), ON, OFF")
set_property(CACHE COMET_ENABLE_NCCL PROPERTY STRINGS AUTO ON OFF)
set(COMET_NCCL_ROOT "" CACHE PATH "NCCL install searched first (include/ and lib/ or lib64/)")
set(COMET_HAVE_NCCL OFF)

string(TOUPPER "${COMET_ENABLE_NCCL}" comet_nccl_mode)
if(NOT comet_nccl_mode STREQUAL "AUTO")
  if(COMET_ENABLE_NCCL)
    set(comet_nccl_mode ON)
  else()
    set(comet_nccl_mode OFF)
  endif()
endif()

# Stops the search: a required NCCL is an error, an optional one a note.
macro(comet_nccl_give_up reason)
  if(comet_nccl_mode STREQUAL "ON")
    message(FATAL_ERROR "comet: COMET_ENABLE_NCCL=ON, but ${reason}")
  endif()
  message(STATUS "comet: Nccl fabric OFF (${reason})")
  return()
endmacro()

if(comet_nccl_mode STREQUAL "OFF")
  message(STATUS "comet: Nccl fabric OFF (COMET_ENABLE_NCCL=OFF)")
  return()
endif()
if(NOT COMET_ENABLE_CUDA)
  comet_nccl_give_up("the CUDA backend is off")
endif()

# Looks at one place (its include dirs and library dirs are lists): takes its headers and its
# library for whichever of the two is still missing.
set(comet_nccl_include "")
set(comet_nccl_library "")
function(comet_nccl_look label include_dirs lib_dirs)
  if(NOT comet_nccl_include)
    foreach(dir IN LISTS include_dirs)
      if(EXISTS "${dir}/nccl.h")
        set(comet_nccl_include "${dir}" PARENT_SCOPE)
        set(comet_nccl_include_from "${label}" PARENT_SCOPE)
        break()
      endif()
    endforeach()
  endif()
  if(NOT comet_nccl_library)
    foreach(dir IN LISTS lib_dirs)
      foreach(name libnccl.so libnccl.so.2)
        if(EXISTS "${dir}/${name}")
          set(comet_nccl_library "${dir}/${name}" PARENT_SCOPE)
          set(comet_nccl_library_from "${label}" PARENT_SCOPE)
          return()
        endif()
      endforeach()
    endforeach()
  endif()
endfunction()

if(COMET_NCCL_ROOT)
  comet_nccl_look("COMET_NCCL_ROOT" "${COMET_NCCL_ROOT}/include" "${COMET_NCCL_ROOT}/lib;${COMET_NCCL_ROOT}/lib64")
endif()
find_program(COMET_PYTHON3 NAMES python3 python DOC "Python used to find the nvidia-nccl wheel")
if(COMET_PYTHON3)
  execute_process(COMMAND "${COMET_PYTHON3}" -c "import nvidia.nccl, os; print(nvidia.nccl.__path__[0])"
                  OUTPUT_VARIABLE comet_nccl_wheel RESULT_VARIABLE comet_nccl_wheel_rc
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(comet_nccl_wheel_rc EQUAL 0 AND IS_DIRECTORY "${comet_nccl_wheel}")
    comet_nccl_look("the Python wheel nvidia-nccl" "${comet_nccl_wheel}/include" "${comet_nccl_wheel}/lib")
  endif()
endif()
comet_nccl_look("the CUDA toolkit" "${CUDAToolkit_INCLUDE_DIRS}" "${CUDAToolkit_LIBRARY_DIR}")

if(NOT comet_nccl_include)
  comet_nccl_give_up("nccl.h was not found (set COMET_NCCL_ROOT, or install the nvidia-nccl wheel)")
endif()
if(NOT comet_nccl_library)
  comet_nccl_give_up("libnccl.so was not found (headers in ${comet_nccl_include}; set COMET_NCCL_ROOT)")
endif()

file(STRINGS "${comet_nccl_include}/nccl.h" comet_nccl_version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
foreach(part MAJOR MINOR PATCH)
  string(REGEX REPLACE ".*#define NCCL_${part} +([0-9]+).*" "\\1" comet_nccl_${part} "${comet_nccl_version_lines}")
endforeach()
set(comet_nccl_version "${comet_nccl_MAJOR}.${comet_nccl_MINOR}.${comet_nccl_PATCH}")
if(comet_nccl_version VERSION_LESS 2.28 OR NOT EXISTS "${comet_nccl_include}/nccl_device.h")
  comet_nccl_give_up("the NCCL headers in ${comet_nccl_include} are version ${comet_nccl_version}; the Nccl fabric needs >= 2.28 (symmetric windows, nccl_device.h)")
endif()

add_library(comet::nccl SHARED IMPORTED)
set_target_properties(comet::nccl PROPERTIES
  IMPORTED_LOCATION "${comet_nccl_library}"
  INTERFACE_INCLUDE_DIRECTORIES "${comet_nccl_include}")
set(COMET_HAVE_NCCL ON)

if(comet_nccl_include_from STREQUAL comet_nccl_library_from)
  message(STATUS "comet: Nccl fabric ON: NCCL ${comet_nccl_version} from ${comet_nccl_include_from} (${comet_nccl_include}, ${comet_nccl_library})")
else()
  message(STATUS "comet: Nccl fabric ON: NCCL ${comet_nccl_version} headers from ${comet_nccl_include_from} (${comet_nccl_include}), "
                 "library from ${comet_nccl_library_from} (${comet_nccl_library}): different places; "
                 "the fabric checks at start-up that the library's version matches the headers'")
endif()
