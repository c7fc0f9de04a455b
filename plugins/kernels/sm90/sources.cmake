# CUTLASS 3.x SM90 kernels (TMA + WGMMA). Included from plugins/kernels/CMakeLists.txt after
# `has_sm90a` is set. They exist only as sm_90a code (arch-specific wgmma/setmaxnreg; a plain sm_90
# build compiles them to stubs), so they get their own compile options with just that target,
# whatever else EPIFUSE_CUDA_ARCHS lists. kernels.def lists the configurations; each one in each of its
# dtypes (for the 16-bit lines, those of EPIFUSE_CUDA_DTYPES) becomes a generated translation unit
# (~75 s each on one core, 20 of them parsing CUTLASS's headers), so the build parallelises; or
# EPIFUSE_CUDA_KERNELS_PER_UNIT kernels of one kind, unit option and dtype share a unit, which parses
# the headers once (a 2-core compile check: .ci/run).
if(has_sm90a)
  set(sm90_dir ${CMAKE_CURRENT_LIST_DIR})
  set(sm90_units "")
  set(sm90_groups "")
  epifuse_manifest_lines(sm90_entries ${sm90_dir}/kernels.def "^SM90_(GEMM|CONV)\\(")
  foreach(entry ${sm90_entries})
    if(NOT entry MATCHES "^SM90_(GEMM|CONV)\\(([a-z0-9_]+), *(PLAIN|EXTENDED_MMA|NO_PDL), *(F16_BF16|F32_TF32),")
      message(FATAL_ERROR "kernels.def: cannot read the name, unit option and dtypes of: ${entry}")
    endif()
    set(kind ${CMAKE_MATCH_1})
    set(name ${CMAKE_MATCH_2})
    set(option ${CMAKE_MATCH_3})
    set(dtypes ${EPIFUSE_CUDA_DTYPES})
    if(CMAKE_MATCH_4 STREQUAL "F32_TF32")
      set(dtypes tf32)
    endif()
    # kernels that may share a unit: one kind, unit option and dtype
    foreach(dtype ${dtypes})
      list(APPEND sm90_groups ${kind}-${option}-${dtype})
      list(APPEND sm90_group_${kind}-${option}-${dtype} ${name})
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES sm90_groups)
  foreach(sm90_group ${sm90_groups})
    string(REPLACE "-" ";" key ${sm90_group})
    list(GET key 0 kind)
    list(GET key 1 option)
    list(GET key 2 dtype)
    set(prelude "")
    if(option STREQUAL "EXTENDED_MMA")
      set(prelude "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED\n")
    elseif(option STREQUAL "NO_PDL")
      set(prelude "#undef CUTLASS_ENABLE_GDC_FOR_SM90\n")
    endif()
    set(names ${sm90_group_${sm90_group}})
    list(LENGTH names count)
    set(first 0)
    while(first LESS count)
      math(EXPR last "${first} + ${EPIFUSE_CUDA_KERNELS_PER_UNIT} - 1")
      if(NOT last LESS count)
        math(EXPR last "${count} - 1")
      endif()
      set(body "${prelude}#define EPIFUSE_SM90_${kind}_UNIT\n")
      set(kernels "")
      foreach(i RANGE ${first} ${last})
        list(GET names ${i} name)
        string(APPEND body "#define EPIFUSE_SM90_NAME ${name}\n#define EPIFUSE_SM90_DTYPE ${dtype}\n"
                           "#include \"instantiate.cuh\"\n#undef EPIFUSE_SM90_NAME\n#undef EPIFUSE_SM90_DTYPE\n")
        list(APPEND kernels sm90_${dtype}_${name})
      endforeach()
      list(GET names ${first} unit)  # a unit is named after its first kernel
      if(last GREATER first)
        set(unit ${unit}_and_more)
      endif()
      string(REPLACE ";" ", " kernels "${kernels}")
      epifuse_generated_unit(sm90_units ${CMAKE_CURRENT_BINARY_DIR}/sm90/${unit}_${dtype}.cu "${kernels}" "${body}")
      math(EXPR first "${last} + 1")
    endwhile()
  endforeach()
  add_library(epifuse_sm90 OBJECT ${sm90_dir}/table.cu ${sm90_units})
  set_target_properties(epifuse_sm90 PROPERTIES CUDA_ARCHITECTURES OFF POSITION_INDEPENDENT_CODE ON)
  # CUTLASS_ENABLE_GDC_FOR_SM90: the GEMM kernels' griddepcontrol waits for programmatic dependent
  # launch (EPIFUSE_PDL=1); no-ops for an ordinary launch.
  target_compile_options(epifuse_sm90 PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++17 -O3 -DNDEBUG
                         -DCUTLASS_ENABLE_GDC_FOR_SM90
                         --expt-relaxed-constexpr -Xcompiler=-fPIC,-fvisibility=hidden
                         -gencode=arch=compute_90a,code=${code_prefix}_90a>)
  target_compile_definitions(epifuse_sm90 PRIVATE ${epifuse_dtype_definitions})
  target_include_directories(epifuse_sm90 PRIVATE ${sm90_dir} ${CMAKE_CURRENT_SOURCE_DIR}
                             $<TARGET_PROPERTY:epifuse_core_static,INTERFACE_INCLUDE_DIRECTORIES>)
  target_include_directories(epifuse_sm90 SYSTEM PRIVATE ${EPIFUSE_CUTLASS_DIR}/include
                             ${EPIFUSE_CUTLASS_DIR}/tools/util/include)
  target_sources(epifuse_kernels PRIVATE $<TARGET_OBJECTS:epifuse_sm90>)
endif()
