# fsdp-cpp: the libtorch libraries a program of ours links, after
# find_package(Torch). Used by this tree (target fsdp_torch) and by the
# installed package (fsdp::torch, from the consumer's own TorchConfig).
#
# fsdp_torch_target(<name> <cuda>): an INTERFACE target <name> with libtorch's
# headers and flags, linking
#   cuda OFF  torch_cpu and c10 only. The CUDA wheel's libtorch.so
#             pulls libtorch_cuda.so, which maps the CUDA runtime, cuBLAS and
#             NCCL into every rank (start-up time), and at link time would
#             resolve NCCL against the system's copy, not the wheel's.
#   cuda ON   everything TorchConfig lists (TORCH_LIBRARIES), for GPU jobs.
function(fsdp_torch_target name cuda)
  if(TARGET ${name})
    return()
  endif()
  add_library(${name} INTERFACE ${ARGN})
  if(cuda)
    target_link_libraries(${name} INTERFACE ${TORCH_LIBRARIES})
    return()
  endif()
  get_filename_component(lib_dir "${TORCH_LIBRARY}" DIRECTORY)
  find_library(FSDP_TORCH_CPU_LIBRARY torch_cpu PATHS "${lib_dir}" NO_DEFAULT_PATH)
  find_library(FSDP_C10_LIBRARY c10 PATHS "${lib_dir}" NO_DEFAULT_PATH)
  if(NOT FSDP_TORCH_CPU_LIBRARY OR NOT FSDP_C10_LIBRARY)
    message(FATAL_ERROR "torch_cpu or c10 not found next to ${TORCH_LIBRARY}")
  endif()
  target_link_libraries(${name} INTERFACE ${FSDP_TORCH_CPU_LIBRARY} ${FSDP_C10_LIBRARY})
  target_include_directories(${name} INTERFACE ${TORCH_INCLUDE_DIRS})
  target_compile_options(${name} INTERFACE ${TORCH_CXX_FLAGS})
  target_compile_features(${name} INTERFACE cxx_std_20)
endfunction()
