// C ABI of libepifuse_cuda.so (epifuse_cuda_api.h). No exception crosses it.
#include <cuda_runtime_api.h>

#include <exception>
#include <string>

#include "c_desc.h"
#include "epifuse_cuda_api.h"
#include "kernel_api.h"
#include "registry.h"

namespace {

using epifuse::ConvProblem;
using epifuse::Status;

// Registry kernels for the problem on this device that this build contains.
Status runnable(const char* target, const ConvProblem& p, std::vector<const epifuse::KernelDescriptor*>* out) {
  epifuse::DeviceInfo device;
  EPIFUSE_RETURN_IF_ERROR(epifuse::cuda::current_device_info(&device));
  std::string why;
  for (const auto* k : epifuse::find_kernels(target, p, &why, device))
    if (epifuse::cuda::find_impl(k->name)) out->push_back(k);
  if (out->empty())
    return Status::Error(why.empty() ? "no kernel in this build runs the problem on sm_" + std::to_string(device.sm)
                                     : why);
  return Status::Ok();
}

// The items' names comma-separated into the caller's buffer; their count, or -1 with `err` set when it is too small.
template <class Items, class NameOf>
int32_t write_names(const Items& items, NameOf name_of, char* names, size_t names_len, char* err, size_t err_len) {
  std::string list;
  for (const auto& item : items) list += std::string(list.empty() ? "" : ",") + name_of(item);
  if (list.size() + 1 > names_len) return -epifuse::report_error("names buffer too small", err, err_len);
  list.copy(names, list.size());
  names[list.size()] = '\0';
  return static_cast<int32_t>(items.size());
}

}  // namespace

extern "C" {

int32_t epifuse_cuda_kernels(const char* target, const epifuse_conv_desc* d, char* names, size_t names_len,
                             char* err, size_t err_len) {
  try {
    ConvProblem p;
    Status s = epifuse::problem_from_desc(d, &p);
    if (!s.ok()) return -epifuse::report_error(s.message(), err, err_len);
    std::vector<const epifuse::KernelDescriptor*> kernels;
    s = runnable(target ? target : "ort-cuda", p, &kernels);
    if (!s.ok()) {
      epifuse::report_error(s.message(), err, err_len);
      return 0;
    }
    return write_names(kernels, [](const epifuse::KernelDescriptor* k) { return k->name; }, names, names_len, err,
                       err_len);
  } catch (const std::exception& e) {
    return -epifuse::report_error(e.what(), err, err_len);
  }
}

int32_t epifuse_cuda_compiled_kernels(char* names, size_t names_len, char* err, size_t err_len) {
  try {
    return write_names(epifuse::cuda::compiled_kernel_names(), [](const char* name) { return name; }, names, names_len,
                       err, err_len);
  } catch (const std::exception& e) {
    return -epifuse::report_error(e.what(), err, err_len);
  }
}

int64_t epifuse_cuda_workspace_size(const char* kernel, const epifuse_conv_desc* d, char* err, size_t err_len) {
  try {
    ConvProblem p;
    Status s = epifuse::problem_from_desc(d, &p);
    if (!s.ok()) return -epifuse::report_error(s.message(), err, err_len);
    const epifuse::cuda::KernelImpl* impl = kernel ? epifuse::cuda::find_impl(kernel) : nullptr;
    if (!impl) return -epifuse::report_error(std::string("unknown kernel ") + (kernel ? kernel : "(null)"), err, err_len);
    return static_cast<int64_t>(impl->workspace_size(p));
  } catch (const std::exception& e) {
    return -epifuse::report_error(e.what(), err, err_len);
  }
}

int32_t epifuse_cuda_fused_conv(const char* kernel, const epifuse_conv_desc* d, const void* x, const void* w,
                                const void* b, const void* z, void* y, void* workspace, size_t workspace_bytes,
                                void* stream, char* err, size_t err_len) {
  try {
    ConvProblem p;
    Status s = epifuse::problem_from_desc(d, &p);
    if (s.ok()) s = epifuse::validate(p);
    if (s.ok()) s = epifuse::check_residual_input(p.attr.residual, z != nullptr);
    if (!s.ok()) return epifuse::report_error(s.message(), err, err_len);
    if (!x || !w || !b || !y) return epifuse::report_error("a required tensor pointer is null", err, err_len);
    if (!kernel) {
      std::vector<const epifuse::KernelDescriptor*> kernels;
      s = runnable("ort-cuda", p, &kernels);
      if (!s.ok()) return epifuse::report_error(s.message(), err, err_len);
      kernel = kernels.front()->name;
    } else {
      std::string why;
      const epifuse::KernelDescriptor* desc = nullptr;
      for (const auto& k : epifuse::kernel_registry())
        if (std::string(k.name) == kernel) desc = &k;
      if (!desc) return epifuse::report_error(std::string("unknown kernel ") + kernel, err, err_len);
      if (!desc->can_implement(p, &why))
        return epifuse::report_error(std::string(kernel) + " cannot run this problem: " + why, err, err_len);
    }
    const epifuse::cuda::KernelImpl* impl = epifuse::cuda::find_impl(kernel);
    if (!impl) return epifuse::report_error(std::string(kernel) + " is not in this build", err, err_len);
    if (workspace_bytes < impl->workspace_size(p))
      return epifuse::report_error(std::string(kernel) + ": workspace too small", err, err_len);
    s = impl->launch(p, {x, w, b, z, y}, workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
    return s.ok() ? 0 : epifuse::report_error(s.message(), err, err_len);
  } catch (const std::exception& e) {
    return epifuse::report_error(e.what(), err, err_len);
  }
}

}  // extern "C"
