// The CPUExecutionProvider's pairs of a 1x1 conv and a depthwise conv, one node each (float;
// optimizer/passes/pointwise_depthwise.py), on the core's kernels (plugins/core/cpu_pointwise_depthwise.h) and
// ORT's intra-op threads. In both, the node's own attributes are the depthwise conv's, FusedConv's (strides,
// pads, dilations, group = its channels, activation, activation_params; no residual), and the 1x1 conv's
// activation is `pointwise_activation` (and `pointwise_activation_params`).
//  - epifuse::FusedPointwiseDepthwise, the 1x1 conv first: inputs X [N, H, W, C], W [K, 1, 1, C] and B [K] of
//    the 1x1 conv, DW [K, R, S, 1] and DB [K] of the depthwise conv; output Y [N, P, Q, K].
//  - epifuse::FusedPointwiseDepthwiseMean, the same with a second output M [N, 1, 1, K], the mean of Y over its
//    rows and columns (the squeeze-excite pool that reads the depthwise conv's output, as FusedConvMean's).
//  - epifuse::FusedDepthwisePointwise, the depthwise conv first: inputs X [N, H, W, C], DW [C, R, S, 1] and
//    DB [C] of the depthwise conv, W [K, 1, 1, C] and B [K] of the 1x1 conv, and the 1x1 conv's optional
//    residual Z [N, P, Q, K], as `pointwise_residual` says (pre or post); output Y [N, P, Q, K].
#include <string>

#include "cpu_pointwise_depthwise.h"
#include "node_glue.h"
#include "ort_ops.h"

namespace epifuse::ort {
namespace {

constexpr const char* kFusedPointwiseDepthwise = "FusedPointwiseDepthwise";
constexpr const char* kFusedDepthwisePointwise = "FusedDepthwisePointwise";

// The 1x1 conv's attributes of either pair: stride 1, unpadded, one group, and what `pointwise_activation`,
// `pointwise_activation_params` and (where `residual`) `pointwise_residual` say.
Status read_pointwise_attributes(const Ort::ConstKernelInfo& info, bool residual, epifuse::ConvAttributes* out) {
  const auto name = optional_attribute("pointwise_activation",
                                       [&] { return info.GetAttribute<std::string>("pointwise_activation"); });
  const auto params = optional_attribute("pointwise_activation_params",
                                         [&] { return info.GetAttributes<float>("pointwise_activation_params"); });
  EPIFUSE_RETURN_IF_ERROR(epifuse::parse_activation(name.value_or("identity"), params ? params->data() : nullptr,
                                                    params ? static_cast<int64_t>(params->size()) : 0,
                                                    &out->activation));
  if (!residual) return Status::Ok();
  const auto kind =
      optional_attribute("pointwise_residual", [&] { return info.GetAttribute<std::string>("pointwise_residual"); });
  return epifuse::parse_residual(kind.value_or("none"), &out->residual);
}

// The depthwise conv's attributes: the node's own, FusedConv's, without a residual.
Status read_depthwise_attributes(const Ort::ConstKernelInfo& info, epifuse::ConvAttributes* out) {
  EPIFUSE_RETURN_IF_ERROR(epifuse::parse_attributes(read_attributes(info), out));
  if (out->residual != epifuse::Residual::kNone) return Status::Error("the depthwise conv takes no residual");
  return Status::Ok();
}

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
  PointwiseDepthwiseCpuKernel(const OrtApi*, const OrtKernelInfo* raw_info,
                              const char* op_type = kFusedPointwiseDepthwise)
      : NamedNode{describe_node(Ort::ConstKernelInfo(raw_info), op_type)} {
    const Ort::ConstKernelInfo info(raw_info);
    Status s = Status::Ok();
    try {
      s = require_inputs(info, {"X", "W", "B", "DW", "DB"});
      if (s.ok()) s = read_depthwise_attributes(info, &depthwise_);
      if (s.ok()) s = read_pointwise_attributes(info, false, &pointwise_);
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
    return compute(context, X, W, B, DW, DB, Y, nullptr);
  }

 protected:
  // Y, and where `M` the mean of Y over its rows and columns ([N, 1, 1, K]).
  Ort::Status compute(OrtKernelContext* context, const Tensor<float>& X, const Tensor<float>& W,
                      const Tensor<float>& B, const Tensor<float>& DW, const Tensor<float>& DB, Tensor<float>& Y,
                      Tensor<float>* M) {
    try {
      epifuse::ConvProblem pw, dw;
      Status s = bind(X.Shape(), W.Shape(), &B.Shape(), DW.Shape(), &DB.Shape(), &pw, &dw);
      if (s.ok()) {
        float* y = Y.Allocate({dw.N, dw.P(), dw.Q(), dw.K});
        float* m = M ? M->Allocate({dw.N, 1, 1, dw.K}) : nullptr;
        const Ort::KernelContext ctx(context);
        ArenaBlock arena{ctx};  // the 1x1 conv's whole output, where the pair runs as two convs
        auto scratch = [&](int64_t floats) { return arena.allocate(floats); };
        s = cpu_.run(pw, dw, X.Data(), W.Data(), w_constant_, B.Data(), DW.Data(), dw_constant_, DB.Data(), y,
                     ort_threads(ctx), scratch, m);
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

constexpr const char* kFusedPointwiseDepthwiseMean = "FusedPointwiseDepthwiseMean";

// epifuse::FusedPointwiseDepthwiseMean: FusedPointwiseDepthwise, and M [N, 1, 1, K], the mean of Y over its rows
// and columns (the squeeze-excite pool that reads the depthwise conv's output, as in FusedConvMean).
struct PointwiseDepthwiseMeanCpuKernel : PointwiseDepthwiseCpuKernel {
  PointwiseDepthwiseMeanCpuKernel(const OrtApi* api, const OrtKernelInfo* info)
      : PointwiseDepthwiseCpuKernel(api, info, kFusedPointwiseDepthwiseMean) {
    require(require_outputs(Ort::ConstKernelInfo(info), {"Y", "M"}));
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& X, const Tensor<float>& W,
                      const Tensor<float>& B, const Tensor<float>& DW, const Tensor<float>& DB, Tensor<float>& Y,
                      Tensor<float>& M) {
    return compute(context, X, W, B, DW, DB, Y, &M);
  }
};

struct DepthwisePointwiseCpuKernel : NamedNode {
  DepthwisePointwiseCpuKernel(const OrtApi*, const OrtKernelInfo* raw_info)
      : NamedNode{describe_node(Ort::ConstKernelInfo(raw_info), kFusedDepthwisePointwise)} {
    const Ort::ConstKernelInfo info(raw_info);
    Status s = Status::Ok();
    try {
      s = require_inputs(info, {"X", "DW", "DB", "W", "B"});
      has_z_ = has_input(info, 5);
      if (s.ok() && info.GetInputCount() > 5 && !has_z_)
        s = Status::Error("input 5 (Z) is named \"\": omit it when there is no residual");
      if (s.ok()) s = read_depthwise_attributes(info, &depthwise_);
      if (s.ok()) s = read_pointwise_attributes(info, true, &pointwise_);
      if (s.ok()) s = epifuse::check_residual_input(pointwise_.residual, has_z_);
    } catch (const Ort::Exception& e) {
      s = Status::Error(e.what());
    }
    if (s.ok()) {  // the declared shapes, where the graph gives them
      const auto x = declared_shape(info, 0), dw = declared_shape(info, 1), db = declared_shape(info, 2);
      const auto w = declared_shape(info, 3), b = declared_shape(info, 4);
      const auto z = has_z_ ? declared_shape(info, 5) : std::nullopt;
      if (x && x->size() == 4 && w && w->size() == 4 && dw && dw->size() == 4) {
        epifuse::ConvProblem dwp, pw;
        s = bind(*x, *dw, db && db->size() == 1 ? &*db : nullptr, *w, b && b->size() == 1 ? &*b : nullptr,
                 z && z->size() == 4 ? &*z : nullptr, &dwp, &pw);
      }
    }
    require(s);
    dw_constant_ = constant_input(info, 1);
    w_constant_ = constant_input(info, 3);
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<float>& X, const Tensor<float>& DW,
                      const Tensor<float>& DB, const Tensor<float>& W, const Tensor<float>& B,
                      std::optional<const Tensor<float>*> Z, Tensor<float>& Y) {
    try {
      const Tensor<float>* z = has_z_ ? Z.value_or(nullptr) : nullptr;
      if (has_z_ && z == nullptr) return error("input Z is declared but ONNX Runtime gave no tensor for it");
      epifuse::ConvProblem dw, pw;
      Status s = bind(X.Shape(), DW.Shape(), &DB.Shape(), W.Shape(), &B.Shape(), z ? &z->Shape() : nullptr, &dw, &pw);
      if (s.ok()) {
        float* y = Y.Allocate({pw.N, pw.P(), pw.Q(), pw.K});
        const Ort::KernelContext ctx(context);
        ArenaBlock arena{ctx};  // the depthwise conv's whole output, where the pair runs as two convs
        auto scratch = [&](int64_t floats) { return arena.allocate(floats); };
        s = cpu_.run(dw, pw, X.Data(), DW.Data(), dw_constant_, DB.Data(), W.Data(), w_constant_, B.Data(),
                     z ? z->Data() : nullptr, y, ort_threads(ctx), scratch);
      }
      if (!s.ok()) return error(s.message());
    } catch (const std::exception& e) {
      return error(e.what(), ORT_RUNTIME_EXCEPTION);
    }
    return Ort::Status{nullptr};
  }

 private:
  // Both problems from the shapes of X, DW, DB, W, B and Z (DB, B and Z may be unknown), checked against the
  // contract.
  Status bind(const Dims& x, const Dims& dw_shape, const Dims* db, const Dims& w, const Dims* b, const Dims* z,
              epifuse::ConvProblem* dw, epifuse::ConvProblem* pw) const {
    Status s = epifuse::bind_shapes(depthwise_, DType::kFloat, x, dw_shape, db, false, nullptr, dw);
    if (!s.ok()) return Status::Error("the depthwise conv (X, DW, DB): " + s.message());
    const Dims mid = {dw->N, dw->H < 0 ? -1 : dw->P(), dw->W < 0 ? -1 : dw->Q(), dw->K};  // -1: symbolic
    s = epifuse::bind_shapes(pointwise_, DType::kFloat, mid, w, b, has_z_, z, pw);
    if (!s.ok()) return Status::Error("the 1x1 conv (W, B, Z, reading the depthwise conv's output " +
                                      epifuse::dims_text(mid) + "): " + s.message());
    if (pw->R != 1 || pw->S != 1) return Status::Error("W must be 1x1 [K, 1, 1, C], got " + epifuse::dims_text(w));
    return epifuse::CpuDepthwisePointwise::check_pair(*dw, *pw);
  }

  epifuse::ConvAttributes depthwise_, pointwise_;  // the 1x1 conv's: its activation and residual alone
  bool has_z_ = false;
  bool dw_constant_ = false, w_constant_ = false;
  epifuse::CpuDepthwisePointwise cpu_;
};

}  // namespace

void add_pointwise_depthwise_cpu_ops(OpList* ops) {
  using Ort::Custom::CreateLiteCustomOp;
  ops->emplace_back(CreateLiteCustomOp<PointwiseDepthwiseCpuKernel>(kFusedPointwiseDepthwise, "CPUExecutionProvider"));
  ops->emplace_back(
      CreateLiteCustomOp<PointwiseDepthwiseMeanCpuKernel>(kFusedPointwiseDepthwiseMean, "CPUExecutionProvider"));
  ops->emplace_back(CreateLiteCustomOp<DepthwisePointwiseCpuKernel>(kFusedDepthwisePointwise, "CPUExecutionProvider"));
}

}  // namespace epifuse::ort
