# CUTLASS 2.x sm80 family (cp.async + mma.sync; runs on sm_80 and newer): one translation unit
# per (element type of EPIFUSE_CUDA_DTYPES, tile configuration), plus the table that lists them. The rules are in
# plugins/core/rules_sm80.cc.
set(sm80_configs fixed8_128x64x32_3st 128x128x64_3st 128x64x64_4st 64x64x64_4st fewch_128x64x32_2st unaligned_64x64x32_2st
    splitk_64x64x64_4st)
set(sm80_sources ${CMAKE_CURRENT_LIST_DIR}/table.cu ${CMAKE_CURRENT_LIST_DIR}/f32_3xtf32_128x64x16_4st.cu)
foreach(dtype ${EPIFUSE_CUDA_DTYPES})
  foreach(cfg ${sm80_configs})
    list(APPEND sm80_sources ${CMAKE_CURRENT_LIST_DIR}/${dtype}_${cfg}.cu)
  endforeach()
endforeach()
target_sources(epifuse_kernels PRIVATE ${sm80_sources})
target_compile_definitions(epifuse_kernels PRIVATE EPIFUSE_HAVE_SM80_FAMILY)
