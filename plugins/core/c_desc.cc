#include "c_desc.h"

#include <algorithm>
#include <cstring>

namespace epifuse {

int32_t report_error(const std::string& message, char* err, size_t err_len) {
  if (err && err_len > 0) {
    const size_t n = std::min(message.size(), err_len - 1);
    std::memcpy(err, message.data(), n);
    err[n] = '\0';
  }
  return 1;
}

Status problem_from_desc(const epifuse_conv_desc* d, ConvProblem* p) {
  if (!d) return Status::Error("the problem descriptor is null");
  if (!d->activation) return Status::Error("activation name is null");
  if (d->n_activation_params < 0 || (d->n_activation_params > 0 && !d->activation_params))
    return Status::Error("activation_params is null or has a negative count");
  EPIFUSE_RETURN_IF_ERROR(parse_dtype(d->dtype, &p->dtype));
  p->N = d->N, p->H = d->H, p->W = d->W, p->C = d->C;
  p->K = d->K, p->R = d->R, p->S = d->S;
  ConvAttributes& a = p->attr;
  a.group = d->group;
  a.stride_h = d->stride_h, a.stride_w = d->stride_w;
  a.dil_h = d->dil_h, a.dil_w = d->dil_w;
  a.pad_top = d->pad_top, a.pad_left = d->pad_left, a.pad_bottom = d->pad_bottom, a.pad_right = d->pad_right;
  EPIFUSE_RETURN_IF_ERROR(parse_activation(d->activation, d->activation_params,
                                                    d->n_activation_params, &a.activation));
  switch (d->residual) {
    case EPIFUSE_RESIDUAL_NONE: a.residual = Residual::kNone; break;
    case EPIFUSE_RESIDUAL_PRE: a.residual = Residual::kPre; break;
    case EPIFUSE_RESIDUAL_POST: a.residual = Residual::kPost; break;
    default: return Status::Error("unknown residual mode " + std::to_string(d->residual));
  }
  if (d->allow_tf32 != 0 && d->allow_tf32 != 1)
    return Status::Error("allow_tf32 must be 0 or 1, got " + std::to_string(d->allow_tf32));
  a.allow_tf32 = d->allow_tf32 == 1;
  return Status::Ok();
}

}  // namespace epifuse
