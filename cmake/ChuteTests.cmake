# C++ unit tests: GoogleTest cases run by CTest, one executable per layer
# (chute_<layer>_tests), each built from the csrc/<layer>/*_test.cc files that
# sit beside the code they test. Included only with -DCHUTE_BUILD_TESTS=ON:
# wheels never build them, and the engine library itself never compiles a
# *_test.cc (CMakeLists.txt filters them out of its sources).
find_package(GTest REQUIRED)
if(TARGET GTest::gtest_main)
  set(_chute_gtest_main GTest::gtest_main)
else()  # FindGTest before CMake 3.20
  set(_chute_gtest_main GTest::Main)
endif()
include(GoogleTest)
enable_testing()

# What the tests link: every layer (the include check in CMakeLists.txt keeps
# the layers apart), plus zlib, which the HDF5 tests call to write chunks.
set(CHUTE_TEST_LIBRARIES chute_compose chute_tokens ZLIB::ZLIB)

# `cmake --build <dir> --target chute_unit_tests` builds every test executable
# and nothing else (not the Python extension).
add_custom_target(chute_unit_tests)

file(GLOB_RECURSE _chute_test_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/csrc/*_test.cc)
set(_chute_test_layers "")
foreach(_src IN LISTS _chute_test_sources)
  get_filename_component(_dir "${_src}" DIRECTORY)
  get_filename_component(_layer "${_dir}" NAME)
  list(APPEND _chute_test_layers ${_layer})
  list(APPEND _chute_tests_${_layer} ${_src})
endforeach()
list(REMOVE_DUPLICATES _chute_test_layers)

set(_chute_pch_owner "")
foreach(_layer IN LISTS _chute_test_layers)
  set(_exe chute_${_layer}_tests)
  add_executable(${_exe} ${_chute_tests_${_layer}})
  target_link_libraries(${_exe} PRIVATE ${CHUTE_TEST_LIBRARIES} ${_chute_gtest_main})
  target_compile_options(${_exe} PRIVATE -Wall -Wextra)
  # gtest.h is most of each test file's compile time: parse it once, in a
  # header that every test executable (built with the same flags) shares.
  if(_chute_pch_owner)
    target_precompile_headers(${_exe} REUSE_FROM ${_chute_pch_owner})
  else()
    target_precompile_headers(${_exe} PRIVATE <gtest/gtest.h> <string> <vector> <memory>)
    set(_chute_pch_owner ${_exe})
  endif()
  # PRE_TEST: each binary lists its cases when ctest runs, rather than being
  # run at the end of every build of it.
  # TIMEOUT is a hang guard per case, never a measurement.
  gtest_discover_tests(${_exe} DISCOVERY_MODE PRE_TEST PROPERTIES TIMEOUT 120 LABELS ${_layer})
  add_dependencies(chute_unit_tests ${_exe})
endforeach()
