# fsdp-cpp: what a clean build spends its time on, and the two cuts
# (docs/DESIGN.md, "Build time").
#
# A file that includes libtorch pays for it twice with g++: reading
# torch/torch.h (the shared precompiled header of cmake/layers.cmake makes
# that cheap) and, at the end of the file, the template instantiations that
# libtorch's inline code needs: about 6.5 s of CPU per file whatever the file
# itself holds (g++ -ftime-report on an empty file with the header: 90% of it
# is "template instantiation"). So:
#  - a file that needs no libtorch compiles without the precompiled header
#    (which would bring all of it in) and on its own: fsdp_torch_free_sources;
#  - the other files of a target are compiled in batches (CMake's unity
#    build, FSDP_UNITY_BATCH files per batch): each batch pays once.
# Incremental builds recompile a changed file's batch; -DFSDP_UNITY=OFF
# compiles every file on its own.

option(FSDP_UNITY "compile each target's libtorch files in batches (unity build): a clean build in about half the time" ON)
set(FSDP_UNITY_BATCH 8 CACHE STRING "files per unity batch (FSDP_UNITY)")

# Where the project's own headers resolve ("comm/x.h" from a layer's file,
# "fsdp/x.h", "gpt/x.h", "test_util.h", ...), after the including file's folder.
set(FSDP_HEADER_DIRS ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/cli ${PROJECT_SOURCE_DIR}/tools
    ${PROJECT_SOURCE_DIR}/examples ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/tests/support
    ${PROJECT_SOURCE_DIR}/tests/workers)

# fsdp_uses_torch(<out> <file>): TRUE when <file> includes a header of
# libtorch (torch/, ATen/, c10/), directly or through the project's own
# headers, followed wherever they resolve. An #include inside #if counts
# (a file is judged by every header it may include). Remembered per file for
# the configure run.
function(fsdp_uses_torch out file)
  get_property(known GLOBAL PROPERTY "fsdp_uses_torch:${file}" SET)
  if(known)
    get_property(v GLOBAL PROPERTY "fsdp_uses_torch:${file}")
    set(${out} ${v} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "fsdp_uses_torch:${file}" FALSE)  # while visiting (include cycles)
  set(result FALSE)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  get_filename_component(here "${file}" DIRECTORY)
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]")
      continue()
    endif()
    set(h "${CMAKE_MATCH_1}")
    if(h MATCHES "^(torch|ATen|c10)/")
      set(result TRUE)
      break()
    endif()
    foreach(d IN ITEMS "${here}" ${FSDP_HEADER_DIRS})
      if(EXISTS "${d}/${h}" AND NOT IS_DIRECTORY "${d}/${h}")
        fsdp_uses_torch(sub "${d}/${h}")
        if(sub)
          set(result TRUE)
        endif()
        break()
      endif()
    endforeach()
    if(result)
      break()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "fsdp_uses_torch:${file}" ${result})
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# fsdp_test_optimization(<target>): the tests' own code at -O1 instead of
# -O2 (the library they test keeps -O2). The optimizer is most of a test
# file's compile (g++ -ftime-report: "opt and generate" 58% of test_api.cpp)
# and test code does no heavy work itself; -O1 still reuses the -O2
# precompiled header (-O0 would not: GCC refuses a header built with
# __OPTIMIZE__). Only in the default build type, so the sanitizers' -O0 and
# a user's own CMAKE_BUILD_TYPE stay as they are.
function(fsdp_test_optimization t)
  if(CMAKE_BUILD_TYPE STREQUAL "RelWithDebInfo" AND CMAKE_CXX_FLAGS_RELWITHDEBINFO MATCHES "-O2")
    target_compile_options(${t} PRIVATE -O1)
  endif()
endfunction()

# fsdp_speed_up(<targets>...): the targets' libtorch-free .cpp files skip the
# precompiled header and the batches; with FSDP_UNITY the rest are batched.
function(fsdp_speed_up)
  foreach(t IN LISTS ARGN)
    get_target_property(type ${t} TYPE)
    if(NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
      continue()
    endif()
    get_target_property(dir ${t} SOURCE_DIR)
    get_target_property(srcs ${t} SOURCES)
    foreach(s IN LISTS srcs)
      if(NOT s MATCHES "\\.cpp$")
        continue()
      endif()
      get_filename_component(path "${s}" ABSOLUTE BASE_DIR "${dir}")
      if(NOT EXISTS "${path}")  # generated at build time (fsdp_embed's bytes: off the header already)
        set_source_files_properties("${path}" PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
        continue()
      endif()
      fsdp_uses_torch(torch "${path}")
      # fsdp_common builds the precompiled header the others reuse: CMake
      # makes it only for a target with a file that takes it.
      if(NOT torch AND NOT t STREQUAL "fsdp_common")
        set_source_files_properties("${path}" PROPERTIES SKIP_PRECOMPILE_HEADERS ON SKIP_UNITY_BUILD_INCLUSION ON)
      endif()
    endforeach()
    # The tests' programs: each file keeps its own code (helpers, TESTs,
    # scenarios) in one namespace named FSDP_TEST_ID, which a batch defines
    # to a name of its own per file (CMake's UNITY_BUILD_UNIQUE_ID) and a
    # file compiled alone to nothing (anonymous). Without it, helpers of the
    # same name in two files' anonymous namespaces met in one batch and
    # overload resolution silently called the other file's (tiny(dir, env)
    # beside tiny(dir, epochs, ...)): now a file's own names hide the
    # others'. bench/ and fuzz/ files are compiled one by one.
    set(kind library)
    foreach(s IN LISTS srcs)
      get_filename_component(path "${s}" ABSOLUTE BASE_DIR "${dir}")
      if(path MATCHES "^${PROJECT_SOURCE_DIR}/tests/")
        set(kind tests)
      elseif(path MATCHES "^${PROJECT_SOURCE_DIR}/(bench|fuzz)/")
        set(kind alone)
      endif()
    endforeach()
    if(kind STREQUAL "tests")
      fsdp_test_optimization(${t})
      if(FSDP_UNITY)
        set_target_properties(${t} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${FSDP_UNITY_BATCH}
                                              UNITY_BUILD_UNIQUE_ID FSDP_TEST_ID)
        foreach(s IN LISTS srcs)
          get_filename_component(path "${s}" ABSOLUTE BASE_DIR "${dir}")
          # A file without the namespace (test_util.cpp, delayed_comm.cpp:
          # they define what a header declares) compiles alone.
          if(EXISTS "${path}")
            file(STRINGS "${path}" wrapped REGEX "^namespace FSDP_TEST_ID {$")
            if(NOT wrapped)
              set_property(SOURCE "${path}" PROPERTY SKIP_UNITY_BUILD_INCLUSION ON)
            endif()
          endif()
          get_source_file_property(skip "${path}" SKIP_UNITY_BUILD_INCLUSION)
          if(skip)
            set_property(SOURCE "${path}" APPEND PROPERTY COMPILE_DEFINITIONS "FSDP_TEST_ID=")
          endif()
        endforeach()
      else()
        target_compile_definitions(${t} PRIVATE "FSDP_TEST_ID=")
      endif()
    elseif(FSDP_UNITY AND kind STREQUAL "library")
      set_target_properties(${t} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${FSDP_UNITY_BATCH})
    endif()
    # ccache (the Makefile's launcher) caches files compiled with the
    # precompiled header only when its preprocessed form names the header
    # instead of expanding it (ccache's manual, "Precompiled headers").
    if(CMAKE_CXX_COMPILER_LAUNCHER MATCHES "ccache")
      target_compile_options(${t} PRIVATE -fpch-preprocess)
    endif()
  endforeach()
endfunction()
