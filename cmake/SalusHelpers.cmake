# Target helpers: each folder's CMakeLists.txt names a target, its sources and its
# dependencies, nothing else. Every target gets a salus:: alias; the project's own code is
# compiled with warnings as errors and, where asked, with sanitizers.

function(_salus_target_options target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    set(_warn -Wall -Wextra -Wthread-safety -Wno-unused-parameter)
  else()
    set(_warn -Wall -Wextra -Wno-unused-parameter)
  endif()
  if(SALUS_WERROR)
    list(APPEND _warn -Werror)
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${_warn}>)
endfunction()

# salus_cc_library(NAME mem SRCS a.cc b.cc DEPS salus::common PUBLIC_DEPS ... )
# Defines target salus_<NAME> with alias salus::<NAME>. Without SRCS it is an INTERFACE library.
function(salus_cc_library)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS;PUBLIC_DEPS" ${ARGN})
  set(target salus_${A_NAME})
  if(A_SRCS)
    add_library(${target} STATIC ${A_SRCS})
    _salus_target_options(${target})
    target_include_directories(${target} PUBLIC
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
      $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/src>)
    target_link_libraries(${target} PUBLIC ${A_PUBLIC_DEPS} PRIVATE ${A_DEPS})
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>)
    target_link_libraries(${target} INTERFACE ${A_PUBLIC_DEPS} ${A_DEPS})
  endif()
  add_library(salus::${A_NAME} ALIAS ${target})
endfunction()

# salus_cc_binary(NAME salus-sim SRCS main.cc DEPS salus::sched)
function(salus_cc_binary)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  _salus_target_options(${A_NAME})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} ${SALUS_EXE_EXTRA_LIBS})
  add_executable(salus::${A_NAME} ALIAS ${A_NAME})
endfunction()

# salus_cc_test(NAME status_test SRCS status_test.cc DEPS salus::common LABELS unit)
# A GoogleTest binary registered with ctest; LABELS defaults to "unit".
function(salus_cc_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT A_LABELS)
    set(A_LABELS unit)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  add_executable(${A_NAME} ${A_SRCS})
  _salus_target_options(${A_NAME})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  set_target_properties(${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME ${A_NAME} COMMAND ${A_NAME})
  set_tests_properties(${A_NAME} PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT})
  salus_label_target(${A_NAME} ${A_LABELS})
endfunction()

# salus_label_target(target label...): the tests labelled so run `target`. Every label gets a
# target tests-<label> (salus_label_targets) that builds what its tests run and nothing more:
# the sanitizer builds of scripts/test compile only what their tests need.
function(salus_label_target target)
  foreach(label ${ARGN})
    set_property(GLOBAL APPEND PROPERTY SALUS_TEST_LABELS ${label})
    set_property(GLOBAL APPEND PROPERTY SALUS_LABEL_TARGETS_${label} ${target})
  endforeach()
endfunction()

# Called once, after every test is defined.
function(salus_label_targets)
  get_property(labels GLOBAL PROPERTY SALUS_TEST_LABELS)
  list(REMOVE_DUPLICATES labels)
  foreach(label ${labels})
    get_property(targets GLOBAL PROPERTY SALUS_LABEL_TARGETS_${label})
    add_custom_target(tests-${label})
    add_dependencies(tests-${label} ${targets})
  endforeach()
endfunction()

# salus_cc_benchmark(NAME mem_bench SRCS mem_bench.cc DEPS salus::mem)
function(salus_cc_benchmark)
  cmake_parse_arguments(A "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${A_NAME} ${A_SRCS})
  _salus_target_options(${A_NAME})
  target_link_libraries(${A_NAME} PRIVATE ${A_DEPS} benchmark::benchmark)
  set_target_properties(${A_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/benchmarks)
endfunction()
