// The C ABI of libepifuse_core.so (epifuse_c_api.h): converts plain C structs to core types and
// core failures to error codes plus messages. No exception crosses this boundary.
#include <algorithm>
#include <cstring>
#include <exception>
#include <iterator>
#include <string>

#include "c_desc.h"
#include "conv_problem.h"
#include "cpu_fused_conv.h"
#include "epifuse_c_api.h"
#include "parallel.h"
#include "registry.h"

namespace {

using epifuse::Status;
using epifuse::problem_from_desc;

int32_t report(const std::string& message, char* err, size_t err_len) {
  return epifuse::report_error(message, err, err_len);
}

// An EPIFUSE_CPU_KERNEL_* code; AUTO as the ORT library runs, which honours EPIFUSE_CPU_KERNEL.
Status cpu_kernel(int32_t code, epifuse::CpuKernel* out) {
  using epifuse::CpuKernel;
  const CpuKernel kernels[] = {epifuse::cpu_kernel_from_environment(), CpuKernel::kReference, CpuKernel::kOnednn,
                               CpuKernel::kWinograd, CpuKernel::kDepthwise, CpuKernel::kGemv};
  if (code < 0 || code >= static_cast<int32_t>(std::size(kernels)))
    return Status::Error("unknown CPU kernel code " + std::to_string(code));
  *out = kernels[code];
  return Status::Ok();
}

}  // namespace

extern "C" {

int32_t epifuse_abi_version(void) { return EPIFUSE_ABI_VERSION; }

int32_t epifuse_validate(const epifuse_conv_desc* d, char* err, size_t err_len) {
  try {
    epifuse::ConvProblem p;
    Status s = problem_from_desc(d, &p);
    if (s.ok()) s = epifuse::validate(p);
    return s.ok() ? 0 : report(s.message(), err, err_len);
  } catch (const std::exception& e) {
    return report(e.what(), err, err_len);
  }
}

int32_t epifuse_kernel_count(const char* target, const epifuse_conv_desc* d, char* err, size_t err_len) {
  // Returns a count, not a status: a failure is "0 kernels" plus the reason.
  std::string why;
  try {
    epifuse::ConvProblem p;
    const Status s = target ? problem_from_desc(d, &p) : Status::Error("target is null");
    if (!s.ok()) {
      why = s.message();
    } else {
      const auto kernels = epifuse::find_kernels(target, p, &why);
      if (!kernels.empty()) return static_cast<int32_t>(kernels.size());
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  report(why, err, err_len);
  return 0;
}

int32_t epifuse_kernel_names(const char* target, const epifuse_conv_desc* d, char* buf, size_t len) {
  return epifuse_kernel_names_on_device(target, d, 0, 0, buf, len);
}

int32_t epifuse_kernel_names_on_device(const char* target, const epifuse_conv_desc* d, int32_t sm, int32_t sm_count,
                                       char* buf, size_t len) {
  std::string text;
  int32_t count = 0;
  try {
    epifuse::ConvProblem p;
    const Status s = target ? problem_from_desc(d, &p) : Status::Error("target is null");
    if (!s.ok()) {
      text = s.message();
    } else {
      for (const epifuse::KernelDescriptor* k : epifuse::find_kernels(target, p, &text, epifuse::DeviceInfo{sm, sm_count})) {
        if (count++ == 0) text.clear();
        text += std::string(count > 1 ? "," : "") + k->name;
      }
    }
  } catch (const std::exception& e) {
    text = e.what();
    count = 0;
  }
  report(text, buf, len);
  return count;
}

int32_t epifuse_registered_kernels(const char* target, char* buf, size_t len) {
  std::string text;
  int32_t count = 0;
  try {
    const auto& targets = epifuse::known_targets();
    if (!target || std::find(targets.begin(), targets.end(), target) == targets.end()) {
      report(std::string("unknown target '") + (target ? target : "(null)") + "'", buf, len);
      return -1;
    }
    for (const epifuse::KernelDescriptor& k : epifuse::kernel_registry())
      if (std::find(k.targets.begin(), k.targets.end(), target) != k.targets.end())
        text += std::string(count++ ? "," : "") + k.name;
  } catch (const std::exception& e) {
    report(e.what(), buf, len);
    return -1;
  }
  report(text, buf, len);
  return count;
}

int64_t epifuse_output_size(int64_t in, int64_t pad_begin, int64_t pad_end, int64_t dilation,
                            int64_t kernel, int64_t stride) {
  return epifuse::output_size(in, pad_begin, pad_end, dilation, kernel, stride);
}

int32_t epifuse_activation_info(int32_t index, const char** name, int32_t* n_params, float* default_params) {
  const auto& table = epifuse::activation_table();
  if (index < 0 || static_cast<size_t>(index) >= table.size()) return 1;
  const epifuse::ActivationSpec& spec = table[static_cast<size_t>(index)];
  if (name) *name = spec.name;
  if (n_params) *n_params = spec.n_params;
  if (default_params) {
    for (int i = 0; i < 2; ++i) default_params[i] = i < spec.n_params ? spec.defaults[i] : 0.f;
  }
  return 0;
}

int32_t epifuse_cpu_fused_conv(const epifuse_conv_desc* d, int32_t kernel, const void* x, const void* w,
                               const void* b, const void* z, void* y, char* err, size_t err_len) {
  try {
    epifuse::ConvProblem p;
    Status s = problem_from_desc(d, &p);
    epifuse::CpuKernel chosen;
    if (s.ok()) s = cpu_kernel(kernel, &chosen);
    if (s.ok()) {
      s = epifuse::CpuFusedConv(chosen).run(p, x, w, /*w_constant=*/false, b, z, y, epifuse::parallel_for_threads);
    }
    return s.ok() ? 0 : report(s.message(), err, err_len);
  } catch (const std::exception& e) {
    return report(e.what(), err, err_len);
  }
}

int32_t epifuse_cpu_kernel_name(const epifuse_conv_desc* d, int32_t kernel, char* buf, size_t len) {
  try {
    epifuse::ConvProblem p;
    epifuse::CpuKernel chosen;
    std::string name;
    Status s = problem_from_desc(d, &p);
    if (s.ok()) s = cpu_kernel(kernel, &chosen);
    if (s.ok()) s = epifuse::CpuFusedConv(chosen).kernel_name(p, &name);
    if (!s.ok()) return report(s.message(), buf, len);
    report(name, buf, len);
    return name.size() < len ? 0 : 1;
  } catch (const std::exception& e) {
    return report(e.what(), buf, len);
  }
}

const char* epifuse_onednn_version(void) {
  static const std::string version = epifuse::onednn_version();
  return version.c_str();
}

}  // extern "C"
