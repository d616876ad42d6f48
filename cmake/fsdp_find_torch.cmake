# Finds libtorch (find_package(Torch)) for this project's own builds: the
# top-level CMakeLists.txt and fuzz/. Included, not called, so that Torch's
# variables land in the includer's scope.
#
# libtorch from the torch wheel: FSDP_PYTHON is an interpreter with torch
# (make sets the project's environment); its torch.utils.cmake_prefix_path
# holds TorchConfig.cmake. A Torch_DIR or CMAKE_PREFIX_PATH given by the
# user wins.
set(FSDP_PYTHON "" CACHE FILEPATH "a Python whose torch provides libtorch (torch.utils.cmake_prefix_path)")
if(FSDP_PYTHON AND NOT Torch_DIR)
  execute_process(COMMAND ${FSDP_PYTHON} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE fsdp_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "FSDP_PYTHON=${FSDP_PYTHON} cannot import torch: run `make deps` (it installs the pinned torch)")
  endif()
  # The package's root too, so that TorchConfig's find_library takes the
  # wheel's lib/ before any libtorch in the system's paths.
  get_filename_component(fsdp_torch_root ${fsdp_torch_prefix}/../.. ABSOLUTE)
  list(PREPEND CMAKE_PREFIX_PATH ${fsdp_torch_prefix} ${fsdp_torch_root})
endif()
# The CUDA wheel's TorchConfig probes the machine's GPUs (a try_run) unless
# the architectures are given: nothing to probe on a build machine, and the
# GPU we prove on is an H200 (sm_90).
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for TorchConfig")
endif()
find_package(Torch REQUIRED)
if(Torch_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR "libtorch ${Torch_VERSION} at ${Torch_DIR}: fsdp-cpp needs libtorch 2.x (make deps installs the pinned torch wheel)")
endif()
get_filename_component(fsdp_torch_cmake_root ${Torch_DIR}/../../.. ABSOLUTE)
if(NOT TORCH_LIBRARY MATCHES "^${fsdp_torch_cmake_root}/")
  message(FATAL_ERROR "TorchConfig at ${Torch_DIR} picked ${TORCH_LIBRARY}, a libtorch of another install: "
                      "remove it from the system's library paths, or set CMAKE_PREFIX_PATH to ${fsdp_torch_cmake_root}")
endif()
message(STATUS "libtorch ${Torch_VERSION}: ${TORCH_LIBRARY}")
