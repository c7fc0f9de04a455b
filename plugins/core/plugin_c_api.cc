// The C ABI of the plugin logic (epifuse_plugin_c_api.h). No exception crosses this boundary.
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "c_desc.h"
#include "epifuse_plugin_c_api.h"
#include "plugin_fields.h"

struct epifuse_plugin_fields {
  epifuse::ConvAttributes attributes;
  epifuse::SerializedFields serialized;
  std::vector<epifuse_plugin_field> c_fields;
};

extern "C" {

int32_t epifuse_plugin_field_spec(int32_t index, const char** name, int32_t* type, int32_t* length) {
  const auto& specs = epifuse::plugin_field_specs();
  if (index < 0 || static_cast<size_t>(index) >= specs.size()) return 1;
  if (name) *name = specs[index].name;
  if (type) *type = static_cast<int32_t>(specs[index].type);
  if (length) *length = specs[index].length;
  return 0;
}

epifuse_plugin_fields* epifuse_plugin_fields_create(const epifuse_plugin_field* fields, int32_t n, char* err,
                                                    size_t err_len) {
  try {
    std::vector<epifuse::Field> parsed;
    for (int32_t i = 0; fields && i < n; ++i)
      parsed.push_back({fields[i].name, fields[i].data, static_cast<epifuse::FieldType>(fields[i].type),
                        fields[i].length});
    auto f = std::make_unique<epifuse_plugin_fields>();
    epifuse::Status s = epifuse::attributes_from_fields(fields ? parsed.data() : nullptr, n, &f->attributes);
    if (s.ok()) s = f->serialized.assign(f->attributes);
    if (!s.ok()) {
      epifuse::report_error(s.message(), err, err_len);
      return nullptr;
    }
    for (const epifuse::Field& x : f->serialized.fields())
      f->c_fields.push_back({x.name, x.data, static_cast<int32_t>(x.type), x.length});
    return f.release();
  } catch (const std::exception& e) {
    epifuse::report_error(e.what(), err, err_len);
    return nullptr;
  }
}

void epifuse_plugin_fields_destroy(epifuse_plugin_fields* f) { delete f; }

void epifuse_plugin_fields_attrs(const epifuse_plugin_fields* f, epifuse_plugin_attrs* out) {
  const epifuse::ConvAttributes& a = f->attributes;
  out->stride_h = a.stride_h, out->stride_w = a.stride_w, out->dil_h = a.dil_h, out->dil_w = a.dil_w;
  out->pad_top = a.pad_top, out->pad_left = a.pad_left, out->pad_bottom = a.pad_bottom, out->pad_right = a.pad_right;
  out->group = a.group;
  out->activation = epifuse::activation_name(a.activation.kind);
  out->activation_params[0] = a.activation.params[0];
  out->activation_params[1] = a.activation.params[1];
  out->residual = static_cast<int32_t>(a.residual);
  out->allow_tf32 = a.allow_tf32 ? 1 : 0;
}

int32_t epifuse_plugin_fields_serialized(const epifuse_plugin_fields* f, const epifuse_plugin_field** fields,
                                         int32_t* n) {
  *fields = f->c_fields.data();
  *n = static_cast<int32_t>(f->c_fields.size());
  return 0;
}

void epifuse_plugin_fields_timing_cache_id(const epifuse_plugin_fields* f, char* buf, size_t len) {
  try {
    epifuse::report_error(epifuse::timing_cache_id(f->attributes), buf, len);
  } catch (const std::exception& e) {
    epifuse::report_error(e.what(), buf, len);
  }
}

int32_t epifuse_plugin_tactic_id(const char* kernel_name) { return kernel_name ? epifuse::tactic_id(kernel_name) : 0; }

int32_t epifuse_plugin_tactics(const epifuse_conv_desc* min, const epifuse_conv_desc* opt,
                               const epifuse_conv_desc* max, int32_t sm, int32_t* ids, int32_t cap, char* names,
                               size_t names_len, char* err, size_t err_len) {
  try {
    std::vector<epifuse::ConvProblem> corners;
    for (const epifuse_conv_desc* d : {min, opt, max}) {
      if (!d) continue;
      epifuse::ConvProblem p;
      const epifuse::Status s = epifuse::problem_from_desc(d, &p);
      if (!s.ok()) return epifuse::report_error(s.message(), err, err_len), 0;
      corners.push_back(p);
    }
    std::string why, text;
    const auto kernels = epifuse::profile_kernels(corners, epifuse::DeviceInfo{sm, 0}, nullptr, &why);
    int32_t count = 0;
    for (const epifuse::KernelDescriptor* k : kernels) {
      if (ids && count < cap) ids[count] = epifuse::tactic_id(k->name);
      text += std::string(count++ ? "," : "") + k->name;
    }
    if (names) epifuse::report_error(text, names, names_len);
    if (count == 0) epifuse::report_error(why, err, err_len);
    return count;
  } catch (const std::exception& e) {
    epifuse::report_error(e.what(), err, err_len);
    return 0;
  }
}

}  // extern "C"
