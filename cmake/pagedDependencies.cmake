# The libraries paged links that ship no CMake package of their own (CAF, sentencepiece, PCRE2; NCCL with the CUDA
# backend), found and made imported targets paged_dep::NAME. Included by the build (CMakeLists.txt) and by an
# installed package's pagedConfig.cmake, so that both find them the same way. Before including it, set
# PAGED_HAVE_CUDA (ON: NCCL too). It sets CAF_INCLUDE_DIR, CAF_CORE, CAF_IO, CAF_OPENSSL, SENTENCEPIECE,
# PCRE2_INCLUDE_DIR, PCRE2 (and NCCL_INCLUDE_DIR, NCCL_LIB), PAGED_DEP_TARGETS (the targets, in link order) and
# PAGED_DEPS_MISSING (what was not found; empty when all were).
find_path(CAF_INCLUDE_DIR caf/all.hpp)
find_library(CAF_CORE caf_core)
find_library(CAF_IO caf_io)
# Mutual TLS between an engine and its workers (actors/tls.h): CAF's OpenSSL module.
find_library(CAF_OPENSSL caf_openssl)
find_library(SENTENCEPIECE sentencepiece)
find_path(PCRE2_INCLUDE_DIR pcre2.h)
find_library(PCRE2 pcre2-8)
set(_paged_dep_vars CAF_INCLUDE_DIR CAF_OPENSSL CAF_IO CAF_CORE SENTENCEPIECE PCRE2_INCLUDE_DIR PCRE2)
set(_paged_dep_libs caf_openssl:CAF_OPENSSL caf_io:CAF_IO caf_core:CAF_CORE sentencepiece:SENTENCEPIECE pcre2:PCRE2)
if(PAGED_HAVE_CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
  find_library(NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
  list(APPEND _paged_dep_vars NCCL_INCLUDE_DIR NCCL_LIB)
  list(APPEND _paged_dep_libs nccl:NCCL_LIB)
endif()

set(PAGED_DEPS_MISSING "")
foreach(_paged_var IN LISTS _paged_dep_vars)
  if(NOT ${_paged_var})
    list(APPEND PAGED_DEPS_MISSING ${_paged_var})
  endif()
endforeach()
set(PAGED_DEP_TARGETS "")
foreach(_paged_entry IN LISTS _paged_dep_libs)
  string(REPLACE ":" ";" _paged_entry "${_paged_entry}")
  list(GET _paged_entry 0 _paged_name)
  list(GET _paged_entry 1 _paged_var)
  if(${_paged_var} AND NOT TARGET paged_dep::${_paged_name})
    add_library(paged_dep::${_paged_name} UNKNOWN IMPORTED)
    set_target_properties(paged_dep::${_paged_name} PROPERTIES IMPORTED_LOCATION "${${_paged_var}}")
  endif()
  list(APPEND PAGED_DEP_TARGETS paged_dep::${_paged_name})
endforeach()
unset(_paged_dep_vars)
unset(_paged_dep_libs)
