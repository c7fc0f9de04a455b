// C ABI of the TensorRT plugin's TensorRT-independent logic (plugin_fields.h), exported by
// libepifuse_core.so so that CI tests field parsing, serialization, tactics and the timing-cache
// id without TensorRT. Conventions as in epifuse_c_api.h: 0 on success, a message in `err`.
#pragma once
#include "epifuse_c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

// nvinfer1::PluginField as plain C; `type` takes nvinfer1::PluginFieldType's values
// (FLOAT32 1, FLOAT64 2, INT32 5, CHAR 6, INT64 10).
typedef struct epifuse_plugin_field {
  const char* name;
  const void* data;
  int32_t type;
  int32_t length;
} epifuse_plugin_field;

// Parsed attributes (what the plugin keeps); `activation` points into a static table.
typedef struct epifuse_plugin_attrs {
  int64_t stride_h, stride_w, dil_h, dil_w;
  int64_t pad_top, pad_left, pad_bottom, pad_right;
  int64_t group;
  const char* activation;
  float activation_params[2];  // resolved values (defaults filled in)
  int32_t residual;            // EPIFUSE_RESIDUAL_*
  int32_t allow_tf32;          // 0 or 1
} epifuse_plugin_attrs;

// The creator's field list (getFieldNames), by index from 0; non-zero past the end.
EPIFUSE_EXPORT int32_t epifuse_plugin_field_spec(int32_t index, const char** name, int32_t* type,
                                                 int32_t* length);

// A plugin's fields: createPlugin's parsing followed by getFieldsToSerialize's writing.
typedef struct epifuse_plugin_fields epifuse_plugin_fields;

// Parses `fields` like createPlugin does; null on error (message in `err`).
EPIFUSE_EXPORT epifuse_plugin_fields* epifuse_plugin_fields_create(const epifuse_plugin_field* fields,
                                                                   int32_t n, char* err, size_t err_len);
EPIFUSE_EXPORT void epifuse_plugin_fields_destroy(epifuse_plugin_fields* f);
EPIFUSE_EXPORT void epifuse_plugin_fields_attrs(const epifuse_plugin_fields* f, epifuse_plugin_attrs* out);
// The fields getFieldsToSerialize returns; they stay valid as long as `f`.
EPIFUSE_EXPORT int32_t epifuse_plugin_fields_serialized(const epifuse_plugin_fields* f,
                                                        const epifuse_plugin_field** fields, int32_t* n);
// getTimingCacheID's string (NUL-terminated, truncated to `len`).
EPIFUSE_EXPORT void epifuse_plugin_fields_timing_cache_id(const epifuse_plugin_fields* f, char* buf, size_t len);

// Tactic id of a registry kernel name (getValidTactics' values).
EPIFUSE_EXPORT int32_t epifuse_plugin_tactic_id(const char* kernel_name);

// The tactics offered for a profile whose problems at min and max are `min` and `max` (`opt` may be
// null), on compute capability `sm` (0: any), counting every registry kernel as compiled. Writes up
// to `cap` ids and the kernel names comma-separated in `names`; returns the count, 0 when none
// (then `err` says why).
EPIFUSE_EXPORT int32_t epifuse_plugin_tactics(const epifuse_conv_desc* min, const epifuse_conv_desc* opt,
                                              const epifuse_conv_desc* max, int32_t sm, int32_t* ids,
                                              int32_t cap, char* names, size_t names_len, char* err,
                                              size_t err_len);

#ifdef __cplusplus
}
#endif
