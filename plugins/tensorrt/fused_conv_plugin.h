// TensorRT IPluginV3 adapter of epifuse::FusedConv (plugin "FusedConv", version "1", namespace
// "epifuse"). A thin layer: field parsing, serialization, shape rule, tactic list and timing-cache
// id live in plugins/core (plugin_fields.h); the kernels in plugins/kernels. Every method is
// noexcept: failures go to TensorRT's error recorder or logger and return a failure value.
#pragma once
#include <NvInferRuntime.h>

#include <string>
#include <vector>

#include "conv_problem.h"
#include "kernel_api.h"
#include "plugin_fields.h"

namespace epifuse::trt {

constexpr const char* kPluginName = "FusedConv";
constexpr const char* kPluginVersion = "1";
constexpr const char* kPluginNamespace = "epifuse";

// The logger of the variant's entry points (entry_points.cpp): the ILoggerFinder's for
// loadLibrary, libnvinfer's getLogger() for static registration. May be null.
nvinfer1::ILogger* plugin_logger();

class FusedConvPlugin final : public nvinfer1::IPluginV3,
                              public nvinfer1::IPluginV3OneCore,
                              public nvinfer1::IPluginV3OneBuild,
                              public nvinfer1::IPluginV3OneRuntime {
 public:
  FusedConvPlugin(std::string node_name, const ConvAttributes& attributes);
  FusedConvPlugin(const FusedConvPlugin& other);
  FusedConvPlugin& operator=(const FusedConvPlugin&) = delete;
  ~FusedConvPlugin() override = default;

  // IPluginV3
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
  nvinfer1::IPluginV3* clone() noexcept override;

  // IPluginV3OneCore
  const char* getPluginName() const noexcept override { return kPluginName; }
  const char* getPluginVersion() const noexcept override { return kPluginVersion; }
  const char* getPluginNamespace() const noexcept override { return kPluginNamespace; }

  // IPluginV3OneBuild
  int32_t getNbOutputs() const noexcept override { return 1; }
  int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                             const nvinfer1::DataType* inputTypes, int32_t nbInputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs, const nvinfer1::DimsExprs* shapeInputs,
                          int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                          nvinfer1::IExprBuilder& exprBuilder) noexcept override;
  bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* inOut, int32_t nbInputs,
                                 int32_t nbOutputs) noexcept override;
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                          const nvinfer1::DynamicPluginTensorDesc* out, int32_t nbOutputs) noexcept override;
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nbInputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs, int32_t nbOutputs) const noexcept override;
  int32_t getNbTactics() noexcept override { return static_cast<int32_t>(tactics_.size()); }
  int32_t getValidTactics(int32_t* tactics, int32_t nbTactics) noexcept override;
  const char* getTimingCacheID() noexcept override;

  // IPluginV3OneRuntime
  int32_t setTactic(int32_t tactic) noexcept override;
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs, const nvinfer1::PluginTensorDesc* out,
                        int32_t nbOutputs) noexcept override;
  int32_t enqueue(const nvinfer1::PluginTensorDesc* inputDesc, const nvinfer1::PluginTensorDesc* outputDesc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
  const nvinfer1::PluginFieldCollection* getFieldsToSerialize() noexcept override;

 private:
  // Logs "FusedConv '<node>': <message>" to the error recorder (runtime) or the logger; returns -1.
  int32_t fail(const std::string& message, nvinfer1::ErrorCode code = nvinfer1::ErrorCode::kINVALID_ARGUMENT) const;
  // Problems at the profile's min, opt and max dimensions.
  Status profile_corners(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                         std::vector<ConvProblem>* corners) const;

  std::string node_name_;
  ConvAttributes attributes_;
  DType dtype_ = DType::kFloat;
  std::vector<int32_t> tactics_;   // configurePlugin's valid tactics for the current profile
  size_t workspace_bytes_ = 0;     // declared workspace: max over tactics_ at the profile's max
  int32_t tactic_ = 0;             // 0: TensorRT's default, the registry's first valid kernel
  ConvProblem problem_;            // onShapeChange's problem
  const cuda::KernelImpl* kernel_ = nullptr;
  size_t kernel_workspace_ = 0;
  bool has_residual_ = false;
  nvinfer1::IErrorRecorder* recorder_ = nullptr;  // the execution context's, after attachToContext
  std::string timing_cache_id_;
  SerializedFields serialized_;
  std::vector<nvinfer1::PluginField> fields_;
  nvinfer1::PluginFieldCollection field_collection_{};
};

class FusedConvCreator final : public nvinfer1::IPluginCreatorV3One {
 public:
  FusedConvCreator();
  nvinfer1::IPluginV3* createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase phase) noexcept override;
  const nvinfer1::PluginFieldCollection* getFieldNames() noexcept override { return &field_names_; }
  const char* getPluginName() const noexcept override { return kPluginName; }
  const char* getPluginVersion() const noexcept override { return kPluginVersion; }
  const char* getPluginNamespace() const noexcept override { return kPluginNamespace; }

 private:
  std::vector<nvinfer1::PluginField> fields_;
  nvinfer1::PluginFieldCollection field_names_{};
};

}  // namespace epifuse::trt
