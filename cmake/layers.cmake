# fsdp-cpp: the layers of the library (see the table in CMakeLists.txt).
#
# fsdp_layer(<name> FOLDERS <src folders> [DEPS <layers>] [EXPORTS <headers>]
#            [PRIVATE_LIBS <libs>])
# makes the static library fsdp_<name> (exported as fsdp::<name>) from
# src/<folder>/**/*.cpp. The sources include their own headers as
# "<folder>/x.h"; the only path that resolves those is a folder of links made
# for this layer (<build>/layers/fsdp_<name>/<folder> -> src/<folder>, plus
# common/), so including another layer's private header is a compile error.
# EXPORTS names the few internal headers (paths under src/, e.g.
# comm/fail_together.h) a layer offers the layers that list it in DEPS: each
# gets a link to exactly those files, never to the rest of the folder, and
# none is installed. fsdp_<name>_internal hands the path to white-box tests;
# nothing else links it.

set(FSDP_LAYER_TARGETS "")
set(FSDP_LAYER_TABLE "")

function(fsdp_layer name)
  cmake_parse_arguments(L "" "" "FOLDERS;DEPS;EXPORTS;PRIVATE_LIBS" ${ARGN})
  set(target fsdp_${name})
  set(root ${PROJECT_BINARY_DIR}/layers/${target})
  file(REMOVE_RECURSE ${root})
  file(MAKE_DIRECTORY ${root})
  set(dirs)
  foreach(folder IN LISTS L_FOLDERS ITEMS common)
    if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/src/${folder} AND NOT EXISTS ${root}/${folder})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${folder} ${root}/${folder} SYMBOLIC)
    endif()
  endforeach()
  # What the layers below offer this one (their EXPORTS), file by file.
  foreach(d IN LISTS L_DEPS)
    get_property(offered GLOBAL PROPERTY FSDP_LAYER_EXPORTS_${d})
    foreach(header IN LISTS offered)
      get_filename_component(dir ${root}/${header} DIRECTORY)
      file(MAKE_DIRECTORY ${dir})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${header} ${root}/${header} SYMBOLIC)
    endforeach()
  endforeach()
  foreach(header IN LISTS L_EXPORTS)
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/src/${header})
      message(FATAL_ERROR "layer ${name}: EXPORTS names src/${header}, which does not exist")
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY FSDP_LAYER_EXPORTS_${name} ${L_EXPORTS})
  foreach(folder IN LISTS L_FOLDERS)
    if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/src/${folder})
      list(APPEND dirs ${PROJECT_SOURCE_DIR}/src/${folder})
    endif()
  endforeach()
  fsdp_glob(src ${dirs})
  if(NOT src)
    message(FATAL_ERROR "layer ${name}: no sources in src/{${L_FOLDERS}}")
  endif()
  add_library(${target} STATIC ${src})
  add_library(fsdp::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  target_include_directories(${target}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include>
    PRIVATE ${root})
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  set(deps)
  foreach(d IN LISTS L_DEPS)
    list(APPEND deps fsdp_${d})
  endforeach()
  target_link_libraries(${target} PUBLIC ${deps} $<BUILD_INTERFACE:fsdp_torch> $<INSTALL_INTERFACE:fsdp::torch>
                        nlohmann_json::nlohmann_json
                        Threads::Threads PRIVATE ${L_PRIVATE_LIBS})
  # torch/torch.h dominates compile time: precompiled once (by the lowest
  # layer), reused by every layer and program of the tree.
  if(FSDP_LAYER_TARGETS)
    target_precompile_headers(${target} REUSE_FROM fsdp_common)
  else()
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
  endif()
  add_library(${target}_internal INTERFACE)
  target_include_directories(${target}_internal INTERFACE ${root})
  # Highest layer first: the order a static link needs.
  set(FSDP_LAYER_TARGETS ${target} ${FSDP_LAYER_TARGETS} PARENT_SCOPE)
  list(JOIN deps "," dep_list)
  set(FSDP_LAYER_TABLE ${FSDP_LAYER_TABLE} "${target}=${dep_list}" PARENT_SCOPE)
endfunction()

# After the layers are built: every symbol an archive needs from another
# layer's archive must come from a layer it lists in DEPS (an include of a
# public header from a higher layer compiles, this catches the call).
function(fsdp_layer_check)
  set(args)
  foreach(entry IN LISTS FSDP_LAYER_TABLE)
    string(REPLACE "=" ";" kv "${entry}")
    list(GET kv 0 target)
    list(LENGTH kv n)
    set(dep_list "")
    if(n GREATER 1)
      list(GET kv 1 dep_list)
    endif()
    list(APPEND args "${target}=$<TARGET_FILE:${target}>=${dep_list}")
  endforeach()
  set(stamp ${PROJECT_BINARY_DIR}/layers/check.stamp)
  add_custom_command(OUTPUT ${stamp}
    COMMAND bash ${PROJECT_SOURCE_DIR}/cmake/check_layers.sh ${args}
    COMMAND ${CMAKE_COMMAND} -E touch ${stamp}
    DEPENDS ${FSDP_LAYER_TARGETS} ${PROJECT_SOURCE_DIR}/cmake/check_layers.sh
    COMMENT "Checking that each layer calls only the layers below it"
    VERBATIM)
  add_custom_target(fsdp_layer_check ALL DEPENDS ${stamp})
endfunction()

# fsdp_embed(<target> <file> <namespace> <name>): compiles <file>'s bytes into
# <target> as <namespace>::<name>[] and <name>_size, regenerated at build
# time when the file changes (cmake/embed.cmake; no tool beyond cmake).
function(fsdp_embed target file ns name)
  get_filename_component(base ${file} NAME)
  set(out ${PROJECT_BINARY_DIR}/generated/${base}.cpp)
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DIN=${file} -DOUT=${out} -DNAMESPACE=${ns} -DNAME=${name}
            -P ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
    DEPENDS ${file} ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
    COMMENT "Embedding ${base}"
    VERBATIM)
  set_source_files_properties(${out} PROPERTIES GENERATED TRUE SKIP_PRECOMPILE_HEADERS ON)
  target_sources(${target} PRIVATE ${out})
endfunction()
