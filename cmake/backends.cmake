# GPU backend selection: KDISPATCH_CUDA / KDISPATCH_HIP = AUTO | ON | OFF.
#   AUTO: enabled when the compiler is found, silently skipped otherwise.
#   ON:   the configure fails when the compiler is missing.
#   OFF:  never enabled.
# Nothing here is ever required to build or test the CPU library.
include(CheckLanguage)

foreach(_opt KDISPATCH_CUDA KDISPATCH_HIP)
  string(TOUPPER "${${_opt}}" _v)
  if(NOT _v MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${_opt} must be AUTO, ON or OFF (got '${${_opt}}')")
  endif()
  set(${_opt} "${_v}")
endforeach()

set(KDISPATCH_ENABLE_CUDA OFF)
if(NOT KDISPATCH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(_kd_nvcc nvcc HINTS /usr/local/cuda/bin ENV CUDA_PATH PATH_SUFFIXES bin)
    if(_kd_nvcc)
      set(CMAKE_CUDA_COMPILER "${_kd_nvcc}")
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(KDISPATCH_ENABLE_CUDA ON)
  elseif(KDISPATCH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KDISPATCH_CUDA=ON but no CUDA compiler (nvcc) was found; install the CUDA toolkit or set CMAKE_CUDA_COMPILER")
  endif()
endif()

set(KDISPATCH_ENABLE_HIP OFF)
if(NOT KDISPATCH_HIP STREQUAL "OFF")
  find_program(_kd_hipclang NAMES clang++-15)
  find_file(_kd_hiplang hip-lang-config.cmake
            PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/hip-lang /usr/lib/cmake/hip-lang /opt/rocm/lib/cmake/hip-lang
            NO_DEFAULT_PATH)
  if(_kd_hipclang AND _kd_hiplang)
    set(KDISPATCH_ENABLE_HIP ON)
  elseif(KDISPATCH_HIP STREQUAL "ON")
    message(FATAL_ERROR "KDISPATCH_HIP=ON but Debian's HIP toolchain was not found (need clang++-15 and hip-lang-config.cmake: apt-get install hipcc libamdhip64-dev)")
  endif()
endif()

message(STATUS "kdispatch backends: cpu=ON cuda=${KDISPATCH_ENABLE_CUDA} (KDISPATCH_CUDA=${KDISPATCH_CUDA}) hip=${KDISPATCH_ENABLE_HIP} (KDISPATCH_HIP=${KDISPATCH_HIP})")
# The GPU issues add their kernels here; until then the backends are empty.
