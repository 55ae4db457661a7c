# SALUS_WITH_CUDA=AUTO|ON|OFF. AUTO builds the CUDA device when nvcc and cuDNN are found and
# warns, naming what is missing, when they are not; ON makes their absence an error. The CUDA
# parts compile and link on machines without a GPU; they report "no GPU" at run time.
# `salus-server --version` says which kind of binary a build made.
#
# Requirements (docs/install.md): the CUDA toolkit 12.8 or newer (13.x tested) with cuBLAS, cuDNN
# 9, and a driver that supports the toolkit. Compute capabilities built by default (override
# with -DCMAKE_CUDA_ARCHITECTURES=...): 75 (Turing: T4, RTX 20), 80 (A100, A30), 86 (A10, A40,
# RTX 30), 89 (L4, L40, RTX 40), 90 (H100, H200), 100 (B200) and 120 (RTX 50, RTX PRO 6000),
# with 120's PTX for later GPUs to compile at load. Volta (70) and older are left out: CUDA 13
# no longer targets them.

set(SALUS_CUDA_ENABLED OFF)
if(NOT SALUS_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  # A toolkit installed after an earlier configure is looked for again.
  if(DEFINED CMAKE_CUDA_COMPILER AND NOT CMAKE_CUDA_COMPILER)
    unset(CMAKE_CUDA_COMPILER CACHE)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS /usr/local/cuda/include /usr/include)
  find_library(CUDNN_LIBRARY cudnn HINTS /usr/local/cuda/lib64 /usr/local/cuda/lib)
  if(CMAKE_CUDA_COMPILER AND CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
    set(SALUS_CUDA_ENABLED ON)
  else()
    set(missing "")
    if(NOT CMAKE_CUDA_COMPILER)
      list(APPEND missing "nvcc (install the CUDA toolkit, or set CUDACXX)")
    endif()
    if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
      list(APPEND missing "cuDNN (cudnn.h and libcudnn; set CUDNN_INCLUDE_DIR and CUDNN_LIBRARY)")
    endif()
    string(JOIN ", " missing ${missing})
    if(SALUS_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "SALUS_WITH_CUDA=ON but ${missing} was not found")
    endif()
    message(WARNING "Building a CPU-only salus-server: ${missing} not found. "
                    "Pass -DSALUS_WITH_CUDA=ON to make this an error, OFF to silence it.")
  endif()
endif()

# Whether this configure built the CUDA device, for scripts/build.
set(SALUS_CUDA_BUILT ${SALUS_CUDA_ENABLED} CACHE INTERNAL "")

if(SALUS_CUDA_ENABLED)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 75-real 80-real 86-real 89-real 90-real 100-real 120)
  endif()
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no C++20 flag for nvcc
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  add_library(salus_cudnn INTERFACE)
  target_include_directories(salus_cudnn INTERFACE ${CUDNN_INCLUDE_DIR})
  target_link_libraries(salus_cudnn INTERFACE ${CUDNN_LIBRARY})
  add_library(salus::cudnn ALIAS salus_cudnn)
  # cuDNN's version, for `--version`.
  set(SALUS_CUDNN_VERSION "unknown")
  foreach(header cudnn_version.h cudnn.h)
    if(EXISTS "${CUDNN_INCLUDE_DIR}/${header}")
      file(READ "${CUDNN_INCLUDE_DIR}/${header}" text)
      if(text MATCHES "#define CUDNN_MAJOR ([0-9]+)")
        set(major ${CMAKE_MATCH_1})
        string(REGEX MATCH "#define CUDNN_MINOR ([0-9]+)" _ "${text}")
        set(minor ${CMAKE_MATCH_1})
        string(REGEX MATCH "#define CUDNN_PATCHLEVEL ([0-9]+)" _ "${text}")
        set(SALUS_CUDNN_VERSION "${major}.${minor}.${CMAKE_MATCH_1}")
        break()
      endif()
    endif()
  endforeach()
endif()
