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

# ---------------------------------------------------------------- GPU sources
# What the enabled backends add to the library (used by CMakeLists.txt):
#   KDISPATCH_GPU_SOURCES      sources of kdispatch_objects
#   KDISPATCH_GPU_OBJECTS      extra object libraries ($<TARGET_OBJECTS:...>)
#   KDISPATCH_GPU_LIBS         runtime libraries (cudart static, libamdhip64)
#   KDISPATCH_GPU_DEFINITIONS  KDISPATCH_HAVE_CUDA=1 / KDISPATCH_HAVE_HIP=1
# and kdispatch_gpu_setup(<target>) sets a target's GPU compile properties.
# Layout (one include prefix per folder: "gpu/..." is kernels/gpu/ only):
#   kernels/gpu/       portable kernel sources (port.hpp, <op>_kernels.cuh,
#                      <op>_plan.hpp, <op>_variants.inc), shared by CUDA and HIP
#   kernels/cuda|hip/  one thin TU per (op, dtype) or (GEMM family, dtype) plus
#                      one variant list per op; kernels/cuda/cublaslt.{hpp,cpp}
#                      the cuBLASLt GEMM family (CUDA only)
#   src/backends/gpu/  each GPU backend as one object (backends::Backend,
#                      src/backends/backend.hpp): the device probe, the tuner's
#                      clock, memory and device compare, the table of ops
#                      (device.inc and its four parts, <backend>_device.*),
#                      the sm_90a image probe
#   tests/gpu/, bench/gpu/  kdispatch_gpu_tests; the GPU benchmark programs
# The backends' translation units are every kernels/cuda/*.cu and *.cpp and
# every kernels/hip/*.hip and *.cpp (sorted): adding an op's kernels or list
# is adding its files, no build file names them.
set(KDISPATCH_GPU_SOURCES "")
set(KDISPATCH_GPU_OBJECTS "")
set(KDISPATCH_GPU_LIBS "")
set(KDISPATCH_GPU_DEFINITIONS "")

if(KDISPATCH_ENABLE_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # CMake 3.25 knows no CUDA20 dialect for nvcc, and the project's
  # CXX_STANDARD 20 makes it ask for one ("requires the language dialect
  # CUDA20"): teach it the flag (nvcc >= 12 accepts -std=c++20; CMake >= 3.26
  # knows it already).
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION OR CMAKE_CUDA20_STANDARD_COMPILE_OPTION STREQUAL "")
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  # sm_90a SASS (H100/H200) plus compute_90 PTX, which the driver JIT-compiles
  # on newer parts. The norm kernels use no sm_90a-only instruction, so the
  # PTX serves them everywhere from CC 9.0 up; add e.g. "80-real" for A100.
  set(KDISPATCH_CUDA_ARCHITECTURES "90a-real;90-virtual" CACHE STRING
      "CUDA_ARCHITECTURES of the CUDA kernels (CMake syntax: 90a-real = SASS, 90-virtual = PTX)")
  # The kernels (one TU per (op, dtype), for GEMM per (family, input dtype)),
  # the variant lists and the cuBLASLt family (plain C++).
  file(GLOB _kd_cuda_tus CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu
       ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cpp)
  # KDISPATCH_TEST_OPS: the test-only family of kernels/cuda/test/ (its rows
  # in kernels/gpu/families.inc and ops.inc are under KDISPATCH_TEST_OPS).
  if(KDISPATCH_TEST_OPS)
    file(GLOB _kd_cuda_test_tus CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/test/*.cu
         ${PROJECT_SOURCE_DIR}/kernels/cuda/test/*.cpp)
    list(APPEND _kd_cuda_tus ${_kd_cuda_test_tus})
    list(APPEND KDISPATCH_GPU_DEFINITIONS KDISPATCH_TEST_OPS=1)
  endif()
  list(SORT _kd_cuda_tus)
  list(APPEND KDISPATCH_GPU_SOURCES ${_kd_cuda_tus} ${PROJECT_SOURCE_DIR}/src/backends/gpu/cuda_device.cu)
  # The cuBLASLt family (kernels/cuda/cublaslt.cpp, in the glob above) is
  # plain C++ that dlopens libcublasLt at run time (never linked: see
  # kernels/cuda/cublaslt.hpp), so it needs the CUDA headers only.
  set_source_files_properties(${PROJECT_SOURCE_DIR}/kernels/cuda/cublaslt.cpp ${PROJECT_SOURCE_DIR}/kernels/cuda/cublas.cpp
    ${PROJECT_SOURCE_DIR}/kernels/cuda/gemm_list.cpp
    ${PROJECT_SOURCE_DIR}/kernels/cuda/fp8_list.cpp
    PROPERTIES INCLUDE_DIRECTORIES "${CUDAToolkit_INCLUDE_DIRS}")
  list(APPEND KDISPATCH_GPU_LIBS ${CMAKE_DL_LIBS})
  # The tuner's memory, clock and compare (device.inc) use stream 0: make it
  # the calling thread's per-thread default stream, which does not order
  # against the engine's own blocking streams (or invalidate their graph
  # captures) the way the legacy default stream does. The kernels' TUs keep
  # the legacy meaning of a null stream for callers.
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/backends/gpu/cuda_device.cu PROPERTIES
    COMPILE_OPTIONS "--default-stream=per-thread")
  # The arch probe: sm_90a SASS only, so that its image loading means "this
  # build's sm_90a code runs here" (src/backends/gpu/cuda_sm90a_probe.cu).
  add_library(kdispatch_cuda_sm90a_probe OBJECT ${PROJECT_SOURCE_DIR}/src/backends/gpu/cuda_sm90a_probe.cu)
  set_target_properties(kdispatch_cuda_sm90a_probe PROPERTIES
    CUDA_ARCHITECTURES "90a-real" CUDA_STANDARD 17 POSITION_INDEPENDENT_CODE ON CUDA_VISIBILITY_PRESET hidden)
  list(APPEND KDISPATCH_GPU_OBJECTS $<TARGET_OBJECTS:kdispatch_cuda_sm90a_probe>)
  # Static cudart: libkdispatch.so then loads on a machine without the CUDA
  # toolkit or a driver (every call reports error 35 and the backend says
  # "unavailable"); the version script keeps cudart's symbols local.
  list(APPEND KDISPATCH_GPU_LIBS CUDA::cudart_static)
  list(APPEND KDISPATCH_GPU_DEFINITIONS KDISPATCH_HAVE_CUDA=1)
endif()

if(KDISPATCH_ENABLE_HIP)
  # --- Debian bookworm ROCm 5.2.3 + CMake 3.25 glue (../shared/notes/toolchain.md
  # section 3): CMake 3.25 looks for hip-lang-config.cmake only under
  # <rocm root>/lib/cmake, Debian puts it under lib/<multiarch>/cmake; the
  # amd_comgr dependency is found inside try_compile only through the
  # environment; the compiler must be clang++-15 itself, not the hipcc wrapper.
  set(_deb_hiplang /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake/hip-lang)
  if(NOT CMAKE_HIP_COMPILER_ROCM_ROOT AND EXISTS ${_deb_hiplang}/hip-lang-config.cmake
     AND NOT EXISTS /usr/lib/cmake/hip-lang/hip-lang-config.cmake)
    file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/deb-rocm-root/lib/cmake)
    if(NOT EXISTS ${CMAKE_BINARY_DIR}/deb-rocm-root/lib/cmake/hip-lang)
      file(CREATE_LINK ${_deb_hiplang} ${CMAKE_BINARY_DIR}/deb-rocm-root/lib/cmake/hip-lang SYMBOLIC)
    endif()
    set(CMAKE_HIP_COMPILER_ROCM_ROOT ${CMAKE_BINARY_DIR}/deb-rocm-root)
  endif()
  set(ENV{CMAKE_PREFIX_PATH} "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake:$ENV{CMAKE_PREFIX_PATH}")
  if(NOT CMAKE_HIP_COMPILER)
    set(CMAKE_HIP_COMPILER "${_kd_hipclang}")
  endif()
  if(EXISTS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/amdgcn/bitcode)
    set(CMAKE_HIP_FLAGS_INIT "--rocm-path=/usr --hip-device-lib-path=/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/amdgcn/bitcode")
  endif()
  # Executables that link kdispatch_internal (HIP objects inside) link with
  # the HIP compiler, which then warns that --offload-arch is unused.
  string(APPEND CMAKE_HIP_FLAGS_INIT " -Wno-unused-command-line-argument")
  # gfx90a = MI200 (MI210/MI250/MI250X). gfx940 stands in for the MI300
  # family as a COMPILE CHECK ONLY: its code objects do not load on a gfx942
  # MI300X/MI325X, and Debian's LLVM 15 / ROCm 5.2 device libraries cannot
  # emit gfx942 (or gfx950). A real MI300 build needs a ROCm >= 6 toolchain
  # and -DKDISPATCH_HIP_ARCHITECTURES="gfx942".
  set(KDISPATCH_HIP_ARCHITECTURES "gfx90a;gfx940" CACHE STRING "HIP_ARCHITECTURES of the HIP kernels")
  if(NOT DEFINED CMAKE_HIP_ARCHITECTURES)
    set(CMAKE_HIP_ARCHITECTURES ${KDISPATCH_HIP_ARCHITECTURES})
  endif()
  enable_language(HIP)
  find_package(hip CONFIG REQUIRED)
  # The kernels (one TU per (op, dtype); GEMM: the skinny family) and the
  # variant lists (plain C++).
  file(GLOB _kd_hip_tus CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/hip/*.hip
       ${PROJECT_SOURCE_DIR}/kernels/hip/*.cpp)
  list(SORT _kd_hip_tus)
  list(APPEND KDISPATCH_GPU_SOURCES ${_kd_hip_tus} ${PROJECT_SOURCE_DIR}/src/backends/gpu/hip_device.hip)
  # Not per-thread default streams as for CUDA: Debian's libamdhip64 5.2
  # lacks the _spt entry points (hipEventRecord_spt is undefined at link);
  # with ROCm >= 5.3 add -fgpu-default-stream=per-thread to hip_device.hip.
  list(APPEND KDISPATCH_GPU_LIBS hip::host)
  list(APPEND KDISPATCH_GPU_DEFINITIONS KDISPATCH_HAVE_HIP=1)
endif()

# GPU compile properties of a target holding GPU sources.
function(kdispatch_gpu_setup target)
  if(KDISPATCH_ENABLE_CUDA)
    set_target_properties(${target} PROPERTIES
      CUDA_ARCHITECTURES "${KDISPATCH_CUDA_ARCHITECTURES}" CUDA_VISIBILITY_PRESET hidden)
    # --threads 0: nvcc compiles the SASS and PTX targets of a TU in parallel.
    # 2810: nodiscard on a type is ignored in some host-side uses (Status).
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--threads 0 -diag-suppress=2810 -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
  endif()
  if(KDISPATCH_ENABLE_HIP)
    set_target_properties(${target} PROPERTIES
      HIP_ARCHITECTURES "${KDISPATCH_HIP_ARCHITECTURES}" HIP_STANDARD 20 HIP_VISIBILITY_PRESET hidden)
  endif()
endfunction()
