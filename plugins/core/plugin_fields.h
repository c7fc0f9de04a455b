// The TensorRT plugin's logic that needs no TensorRT: the plugin fields (TensorRT's PluginField
// as plain data) parsed into ConvAttributes and written back for an engine, the tactic list of an
// optimization profile, the timing-cache id and the shape rule over any expression type.
// plugins/tensorrt adapts these to IPluginV3; the C ABI (epifuse_plugin_c_api.h) lets CI test
// them without TensorRT.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "conv_problem.h"
#include "registry.h"
#include "status.h"

namespace epifuse {

// Numerically equal to nvinfer1::PluginFieldType (the adapter static_asserts every value).
enum class FieldType : int32_t {
  kFloat16 = 0, kFloat32 = 1, kFloat64 = 2, kInt8 = 3, kInt16 = 4, kInt32 = 5, kChar = 6,
  kDims = 7, kUnknown = 8, kBFloat16 = 9, kInt64 = 10,
};

// One plugin field: `length` counts elements (characters for kChar, NUL included or not).
struct Field {
  const char* name;
  const void* data;
  FieldType type;
  int32_t length;
};

// A field the creator lists in getFieldNames. TensorRT's ONNX parser forwards only these
// attributes, narrowing INT/INTS to kInt32, STRING to kChar, FLOATS to kFloat32.
struct FieldSpec {
  const char* name;
  FieldType type;
  int32_t length;  // 0: variable
};
const std::vector<FieldSpec>& plugin_field_specs();

// Attributes from createPlugin's fields (build phase: the ONNX node's attributes; runtime phase:
// what SerializedFields wrote). Absent fields take the contract defaults. Integers may come as
// kInt32 or kInt64, floats as kFloat32 or kFloat64, strings as kChar. Unknown names, repeated
// names, other types, wrong lengths and invalid values are errors that name the field.
Status attributes_from_fields(const Field* fields, int32_t n, ConvAttributes* out);

// The attributes as fields for getFieldsToSerialize, in the types the parser produces, so the
// runtime-phase createPlugin parses them like the build-phase one. The fields point into this
// object: it is neither copied nor moved, and `fields()` stays valid until the next assign().
class SerializedFields {
 public:
  SerializedFields() = default;
  SerializedFields(const SerializedFields&) = delete;
  SerializedFields& operator=(const SerializedFields&) = delete;

  // Fails when a value does not fit the int32 fields.
  Status assign(const ConvAttributes& a);
  const std::vector<Field>& fields() const { return fields_; }

 private:
  int32_t strides_[2] = {}, pads_[4] = {}, dilations_[2] = {}, group_ = 1, allow_tf32_ = 0;
  float params_[2] = {};
  std::string activation_, residual_;
  std::vector<Field> fields_;
};

// Contract name of an activation kind.
const char* activation_name(ActivationKind kind);

// TensorRT tactic of a kernel: a stable, non-zero id derived from its registry name (so an engine
// keeps naming the same kernel when the registry gains entries). Ids are unique over the registry.
int32_t tactic_id(const char* kernel_name);
// The registry's "tensorrt" kernel with that tactic id, or null.
const KernelDescriptor* kernel_for_tactic(int32_t tactic);

// Kernels for target "tensorrt" that run every problem of an optimization profile, best first.
// `corners` are the profile's problems at its min, opt and max dimensions: the rules' limits only
// grow with N, H and W (sizes, int32 offsets), so a kernel that runs the corners runs every shape
// in between. `device` as in find_kernels (its SM count orders the kernels the shape rules prefer);
// `available` drops kernels not compiled into the library. When none is left, `why` says why.
std::vector<const KernelDescriptor*> profile_kernels(const std::vector<ConvProblem>& corners, const DeviceInfo& device,
                                                     const std::function<bool(const char*)>& available,
                                                     std::string* why);

// The attribute part of TensorRT's timing-cache key (TensorRT adds the I/O shapes, types and
// formats): everything that changes which kernel is fastest, nothing that only changes values.
std::string timing_cache_id(const ConvAttributes& a);

// The contract's shape rule over an expression type, so the adapter applies the same formula to
// TensorRT's symbolic dimensions: P = floor((H + pad_begin + pad_end - dil*(R-1) - 1) / stride) + 1.
// `Ops` provides constant(int64_t), add, sub, mul and floor_div over `Expr`.
template <class Ops, class Expr>
Expr output_extent(Ops& ops, Expr in, Expr kernel, int64_t pad_begin, int64_t pad_end, int64_t dilation,
                   int64_t stride) {
  const Expr reach = ops.add(ops.mul(ops.constant(dilation), ops.sub(kernel, ops.constant(1))), ops.constant(1));
  const Expr span = ops.sub(ops.add(in, ops.constant(pad_begin + pad_end)), reach);
  return ops.add(ops.floor_div(span, ops.constant(stride)), ops.constant(1));
}

}  // namespace epifuse
