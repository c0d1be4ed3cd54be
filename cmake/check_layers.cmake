# Fails when a file of csrc/ includes a header from a folder its own folder
# may not depend on (the table is in CMakeLists.txt, passed in RULES), when
# a file outside bindings/ includes pybind11 or Python, or when a source or
# header is in no library's folders (CHUTE_FOLDERS_* in CMakeLists.txt: it
# would escape this check and the build). Unit tests
# (*_test.cc) and their helper headers (*testing.h) belong to the test build.
#   cmake -DRULES=<rules file> -DROOT=<source dir> -DSTAMP=<stamp> -P check_layers.cmake
include(${RULES})

set(_problems "")
foreach(file IN LISTS CHUTE_LAYER_FILES)
  if(NOT file MATCHES "^csrc/([^/]+)/")
    string(APPEND _problems "\n  ${file}: not in a layer folder of csrc/")
    continue()
  endif()
  set(layer ${CMAKE_MATCH_1})
  if(NOT DEFINED CHUTE_LAYER_${layer})
    string(APPEND _problems "\n  ${file}: folder '${layer}' is not a layer")
    continue()
  endif()
  set(allowed ${CHUTE_LAYER_${layer}})
  file(STRINGS ${ROOT}/${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line IN LISTS lines)
    if(line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
      set(header ${CMAKE_MATCH_1})
      if(NOT header MATCHES "^([^/]+)/")
        string(APPEND _problems "\n  ${file}: include \"${header}\" names no layer folder")
        continue()
      endif()
      set(target ${CMAKE_MATCH_1})
      list(FIND allowed ${target} found)
      if(found EQUAL -1)
        string(REPLACE ";" ", " allowed_text "${allowed}")
        string(APPEND _problems
               "\n  ${file}: includes \"${header}\", but ${layer}/ may include only ${allowed_text}")
      endif()
    elseif(NOT layer STREQUAL "bindings" AND line MATCHES "include[ \t]*<(pybind11/[^>]*|Python\\.h)>")
      string(APPEND _problems "\n  ${file}: includes <${CMAKE_MATCH_1}> outside bindings/")
    endif()
  endforeach()
endforeach()

file(GLOB_RECURSE _present RELATIVE ${ROOT} ${ROOT}/csrc/*.h ${ROOT}/csrc/*.cc)
foreach(file IN LISTS _present)
  list(FIND CHUTE_LAYER_FILES ${file} found)
  if(found EQUAL -1 AND NOT file MATCHES "(_test\\.cc|testing\\.h)$")
    string(APPEND _problems "\n  ${file}: in no library's folders")
  endif()
endforeach()

if(_problems)
  message(FATAL_ERROR "includes against the layers (see CHUTE_LAYER_* in CMakeLists.txt):${_problems}")
endif()
file(TOUCH ${STAMP})
