# CUTLASS 3.x SM90 kernels (TMA + WGMMA). Included from plugins/kernels/CMakeLists.txt after
# `has_sm90a` is set. They exist only as sm_90a code (arch-specific wgmma/setmaxnreg; a plain sm_90
# build compiles them to stubs), so they get their own compile options with just that target,
# whatever else EPIFUSE_CUDA_ARCHS lists. Each configuration is one translation unit (~55 s each).
if(has_sm90a)
  set(sm90_dir ${CMAKE_CURRENT_LIST_DIR})
  add_library(epifuse_sm90 OBJECT
    ${sm90_dir}/table.cu
    ${sm90_dir}/gemm1x1_256x128_coop_relu_f16.cu
    ${sm90_dir}/gemm1x1_256x128_coop_relu_bf16.cu
    ${sm90_dir}/gemm1x1_256x128_coop_silu_nores_f16.cu
    ${sm90_dir}/gemm1x1_256x128_coop_silu_nores_bf16.cu
    ${sm90_dir}/gemm1x1t_128x96_coop_silu_nores_f16.cu
    ${sm90_dir}/gemm1x1t_128x96_coop_silu_nores_bf16.cu
    ${sm90_dir}/gemm1x1t_128x224_coop_silu_nores_f16.cu
    ${sm90_dir}/gemm1x1t_128x224_coop_silu_nores_bf16.cu
    ${sm90_dir}/gemm1x1_128x128_coop_relu_f16.cu
    ${sm90_dir}/gemm1x1_128x128_coop_relu_bf16.cu
    ${sm90_dir}/gemm1x1_128x128_coop_silu_f16.cu
    ${sm90_dir}/gemm1x1_128x128_coop_silu_bf16.cu
    ${sm90_dir}/gemm1x1_128x128_coop_f16.cu
    ${sm90_dir}/gemm1x1_128x128_coop_bf16.cu
    ${sm90_dir}/gemm1x1_128x128_pingpong_f16.cu
    ${sm90_dir}/gemm1x1_128x128_pingpong_bf16.cu
    ${sm90_dir}/gemm1x1_128x128_streamk_f16.cu
    ${sm90_dir}/gemm1x1_128x128_streamk_bf16.cu
    ${sm90_dir}/gemm1x1_128x64_pingpong_f16.cu
    ${sm90_dir}/gemm1x1_128x64_pingpong_bf16.cu
    ${sm90_dir}/conv_64x64x64_c1x1_2cta_relu_f16.cu
    ${sm90_dir}/conv_64x64x64_c1x1_2cta_relu_bf16.cu
    ${sm90_dir}/conv_64x64x64_c1x1_2cta_silu_f16.cu
    ${sm90_dir}/conv_64x64x64_c1x1_2cta_silu_bf16.cu
    ${sm90_dir}/conv_128x64x64_c1x1_pingpong_relu_f16.cu
    ${sm90_dir}/conv_128x64x64_c1x1_pingpong_relu_bf16.cu
    ${sm90_dir}/conv_128x64x64_c1x1_pingpong_silu_f16.cu
    ${sm90_dir}/conv_128x64x64_c1x1_pingpong_silu_bf16.cu
    ${sm90_dir}/conv_128x64x64_c1x1_pingpong_f16.cu
    ${sm90_dir}/conv_128x64x64_c1x1_pingpong_bf16.cu
    ${sm90_dir}/conv_128x128x64_c1x1_pingpong_silu_f16.cu
    ${sm90_dir}/conv_128x128x64_c1x1_pingpong_silu_bf16.cu
    ${sm90_dir}/conv_128x128x64_c1x1_pingpong_f16.cu
    ${sm90_dir}/conv_128x128x64_c1x1_pingpong_bf16.cu
    ${sm90_dir}/conv_128x32x32_c1x1_pingpong_f16.cu
    ${sm90_dir}/conv_128x32x32_c1x1_pingpong_bf16.cu
    ${sm90_dir}/conv_128x64x64_c2x1_2cta_f16.cu
    ${sm90_dir}/conv_128x64x64_c2x1_2cta_bf16.cu
    ${sm90_dir}/conv_128x64x64_c2x1_f16.cu
    ${sm90_dir}/conv_128x64x64_c2x1_bf16.cu
    ${sm90_dir}/conv_128x128x64_c1x1_f16.cu
    ${sm90_dir}/conv_128x128x64_c1x1_bf16.cu
    ${sm90_dir}/conv_128x32x32_c2x1_2cta_relu_f16.cu
    ${sm90_dir}/conv_128x32x32_c2x1_2cta_relu_bf16.cu
    ${sm90_dir}/conv_128x32x32_c2x1_2cta_f16.cu
    ${sm90_dir}/conv_128x32x32_c2x1_2cta_bf16.cu)
  set_target_properties(epifuse_sm90 PROPERTIES CUDA_ARCHITECTURES OFF POSITION_INDEPENDENT_CODE ON)
  # CUTLASS_ENABLE_GDC_FOR_SM90: the GEMM kernels' griddepcontrol waits for programmatic dependent
  # launch (EPIFUSE_PDL=1); no-ops for an ordinary launch.
  target_compile_options(epifuse_sm90 PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++17 -O3 -DNDEBUG
                         -DCUTLASS_ENABLE_GDC_FOR_SM90
                         --expt-relaxed-constexpr -Xcompiler=-fPIC,-fvisibility=hidden
                         -gencode=arch=compute_90a,code=sm_90a>)
  target_include_directories(epifuse_sm90 PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                             $<TARGET_PROPERTY:epifuse_core_static,INTERFACE_INCLUDE_DIRECTORIES>)
  target_include_directories(epifuse_sm90 SYSTEM PRIVATE ${EPIFUSE_CUTLASS_DIR}/include
                             ${EPIFUSE_CUTLASS_DIR}/tools/util/include)
  target_sources(epifuse_kernels PRIVATE $<TARGET_OBJECTS:epifuse_sm90>)
endif()
