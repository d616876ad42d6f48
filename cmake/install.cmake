# fsdp-cpp: `cmake --install <build> --prefix P` puts in P
#   include/fsdp/*.h                     the public headers
#   lib/libfsdp_<layer>.a                one archive per layer
#   lib/libfsdp_cuda.so                  the CUDA plugin (FSDP_CUDA)
#   bin/fsdp                             the launcher and tools
#   lib/cmake/fsdp/fsdpConfig.cmake      find_package(fsdp CONFIG) -> fsdp::fsdp
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FSDP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/fsdp)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/fsdp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS fsdp_lib ${FSDP_LAYER_TARGETS} EXPORT fsdpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(TARGET fsdp)
  # The installed command keeps the path to the libtorch it was linked with
  # (the torch wheel's lib/, outside the system's library paths).
  set_target_properties(fsdp PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
  install(TARGETS fsdp RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# The CUDA plugin, where the library looks for it (src/comm/device.cpp).
if(TARGET fsdp_cuda)
  install(TARGETS fsdp_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(EXPORT fsdpTargets NAMESPACE fsdp:: DESTINATION ${FSDP_CMAKE_DIR})
# The libtorch this package was built with, for fsdpConfig.cmake to refuse
# any other: its version, its C++ ABI (from TorchConfig's flags) and its root
# (the CMAKE_PREFIX_PATH entry that finds it again).
set(FSDP_BUILT_TORCH_VERSION ${Torch_VERSION})
set(FSDP_BUILT_TORCH_ABI 1)  # g++'s default, where TorchConfig names none (torch 2.x wheels)
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
  set(FSDP_BUILT_TORCH_ABI ${CMAKE_MATCH_1})
endif()
get_filename_component(FSDP_BUILT_TORCH_ROOT ${Torch_DIR}/../../.. ABSOLUTE)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/fsdpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/fsdpConfig.cmake
  INSTALL_DESTINATION ${FSDP_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/fsdpConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/fsdpConfig.cmake ${PROJECT_BINARY_DIR}/fsdpConfigVersion.cmake
        ${PROJECT_SOURCE_DIR}/cmake/fsdp_torch.cmake DESTINATION ${FSDP_CMAKE_DIR})
