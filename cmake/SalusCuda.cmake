# SALUS_WITH_CUDA=AUTO|ON|OFF. AUTO enables the CUDA device when nvcc and cuDNN are found.
# The CUDA parts must compile and link on machines without a GPU; they report "no GPU" at run
# time instead of failing.

set(SALUS_CUDA_ENABLED OFF)
if(NOT SALUS_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS /usr/local/cuda/include /usr/include)
  find_library(CUDNN_LIBRARY cudnn HINTS /usr/local/cuda/lib64 /usr/local/cuda/lib)
  if(CMAKE_CUDA_COMPILER AND CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
    set(SALUS_CUDA_ENABLED ON)
  elseif(SALUS_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SALUS_WITH_CUDA=ON but nvcc (${CMAKE_CUDA_COMPILER}) or cuDNN "
                        "(${CUDNN_INCLUDE_DIR}, ${CUDNN_LIBRARY}) was not found")
  endif()
endif()

if(SALUS_CUDA_ENABLED)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # Hopper (H100/H200) and Ampere; the PTX of the newest lets later GPUs JIT.
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no C++20 flag for nvcc
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  add_library(salus_cudnn INTERFACE)
  target_include_directories(salus_cudnn INTERFACE ${CUDNN_INCLUDE_DIR})
  target_link_libraries(salus_cudnn INTERFACE ${CUDNN_LIBRARY})
  add_library(salus::cudnn ALIAS salus_cudnn)
endif()
