// epifuse::FusedPointwiseDepthwise on the CPUExecutionProvider (float): a 1x1 conv and the depthwise conv that
// reads its output, one node (optimizer/passes/pointwise_depthwise.py). Inputs X [N, H, W, C], W [K, 1, 1, C]
// and B [K] of the 1x1 conv, whose activation is `pointwise_activation` (and `pointwise_activation_params`);
// DW [K, R, S, 1] and DB [K] of the depthwise conv, whose attributes are FusedConv's (strides, pads,
// dilations, group = K, activation, activation_params; no residual). Output Y [N, P, Q, K]. The core's kernel
// (plugins/core/cpu_pointwise_depthwise.h) on ORT's intra-op threads.
#include <string>

#include "cpu_pointwise_depthwise.h"
#include "node_glue.h"
#include "ort_ops.h"

namespace epifuse::ort {
namespace {

constexpr const char* kFusedPointwiseDepthwise = "FusedPointwiseDepthwise";

// A block of ORT's CPU arena for one call, where the pair runs as two convs (the bands need none): the
// allocator is asked for at the first use, a later use gets the same block (grown where too small), and
// both go back at the call's end.
struct ArenaBlock {
  const Ort::KernelContext& ctx;
  OrtAllocator* allocator = nullptr;
  void* block = nullptr;
  size_t bytes = 0;

  float* allocate(int64_t floats) {
    const size_t wanted = static_cast<size_t>(floats) * sizeof(float);
    if (allocator == nullptr)
      allocator = ctx.GetAllocator(*Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault));
    if (wanted > bytes) {
      if (block != nullptr) allocator->Free(allocator, block);
      block = allocator->Alloc(allocator, wanted);
      bytes = block != nullptr ? wanted : 0;
    }
    return static_cast<float*>(block);
  }
  ~ArenaBlock() {
    if (allocator == nullptr) return;
    if (block != nullptr) allocator->Free(allocator, block);
    Ort::GetApi().ReleaseAllocator(allocator);
  }
};

struct PointwiseDepthwiseCpuKernel : NamedNode {
  PointwiseDepthwiseCpuKernel(const OrtApi*, const OrtKernelInfo* raw_info)
      : NamedNode{describe_node(Ort::ConstKernelInfo(raw_info), kFusedPointwiseDepthwise)} {
    const Ort::ConstKernelInfo info(raw_info);
    Status s = Status::Ok();
    try {
      s = require_inputs(info, {"X", "W", "B", "DW", "DB"});
      if (s.ok()) s = epifuse::parse_attributes(read_attributes(info), &depthwise_);
      if (s.ok() && depthwise_.residual != epifuse::Residual::kNone)
        s = Status::Error("the depthwise conv takes no residual");
      if (s.ok()) {
        const auto name = optional_attribute("pointwise_activation",
                                             [&] { return info.GetAttribute<std::string>("pointwise_activation"); });
        const auto params = optional_attribute(
            "pointwise_activation_params", [&] { return info.GetAttributes<float>("pointwise_activation_params"); });
        s = epifuse::parse_activation(name.value_or("identity"), params ? params->data() : nullptr,
                                      params ? static_cast<int64_t>(params->size()) : 0, &pointwise_.activation);
      }
    } catch (const Ort::Exception& e) {
      s = Status::Error(e.what());
    }
    if (s.ok()) {  // the declared shapes, where the graph gives them
      const auto x = declared_shape(info, 0), w = declared_shape(info, 1), b = declared_shape(info, 2);
      const auto dw = declared_shape(info, 3), db = declared_shape(info, 4);
      if (x && x->size() == 4 && w && w->size() == 4 && dw && dw->size() == 4) {
        epifuse::ConvProblem pw, dwp;
        s = bind(*x, *w, b && b->size() == 1 ? &*b : nullptr, *dw, db && db->size() == 1 ? &*db : nullptr, &pw, &dwp);
      }
    }
    require(s);
    w_constant_ = constant_input(info, 1);
    dw_constant_ = constant_input(info, 3);
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& X, const Tensor<float>& W,
                      const Tensor<float>& B, const Tensor<float>& DW, const Tensor<float>& DB, Tensor<float>& Y) {
    try {
      epifuse::ConvProblem pw, dw;
      Status s = bind(X.Shape(), W.Shape(), &B.Shape(), DW.Shape(), &DB.Shape(), &pw, &dw);
      if (s.ok()) {
        float* y = Y.Allocate({dw.N, dw.P(), dw.Q(), dw.K});
        const Ort::KernelContext ctx(context);
        ArenaBlock arena{ctx};  // the 1x1 conv's whole output, where the pair runs as two convs
        auto scratch = [&](int64_t floats) { return arena.allocate(floats); };
        s = cpu_.run(pw, dw, X.Data(), W.Data(), w_constant_, B.Data(), DW.Data(), dw_constant_, DB.Data(), y,
                     ort_threads(ctx), scratch);
      }
      if (!s.ok()) return error(s.message());
    } catch (const std::exception& e) {
      return error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }

 private:
  // Both problems from the shapes of X, W, B, DW and DB (B and DB may be unknown), checked against the contract.
  Status bind(const Dims& x, const Dims& w, const Dims* b, const Dims& dw_shape, const Dims* db,
              epifuse::ConvProblem* pw, epifuse::ConvProblem* dw) const {
    Status s = epifuse::bind_shapes(pointwise_, DType::kFloat, x, w, b, false, nullptr, pw);
    if (!s.ok()) return Status::Error("the 1x1 conv (X, W, B): " + s.message());
    if (pw->R != 1 || pw->S != 1) return Status::Error("W must be 1x1 [K, 1, 1, C], got " + epifuse::dims_text(w));
    const Dims mid = {x[0], x[1], x[2], pw->K};
    s = epifuse::bind_shapes(depthwise_, DType::kFloat, mid, dw_shape, db, false, nullptr, dw);
    if (!s.ok()) return Status::Error("the depthwise conv (DW, DB, reading the 1x1 conv's output " +
                                      epifuse::dims_text(mid) + "): " + s.message());
    return epifuse::CpuPointwiseDepthwise::check_pair(*pw, *dw);
  }

  epifuse::ConvAttributes pointwise_, depthwise_;  // the 1x1 conv's: its activation alone
  bool w_constant_ = false, dw_constant_ = false;  // initializers: their prepared copies are made once
  epifuse::CpuPointwiseDepthwise cpu_;
};

}  // namespace

void add_pointwise_depthwise_cpu_ops(OpList* ops) {
  ops->emplace_back(Ort::Custom::CreateLiteCustomOp<PointwiseDepthwiseCpuKernel>(kFusedPointwiseDepthwise,
                                                                                 "CPUExecutionProvider"));
}

}  // namespace epifuse::ort
