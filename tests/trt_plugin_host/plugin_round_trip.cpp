// Drives libepifuse_trt.so through its loadLibrary entry points, without TensorRT: getCreators ->
// createPlugin(kBUILD) with the fields TensorRT's ONNX parser would pass -> getFieldsToSerialize ->
// createPlugin(kRUNTIME) with exactly those -> getFieldsToSerialize again, which must write the
// same fields. Then a bad field: createPlugin returns null and the error reaches the logger
// given through setLoggerFinder. Built and run by tests/test_tensorrt_build.py (headers only).
//   plugin_round_trip LIB.so      prints "ok" and exits 0, or says what differs and exits 1
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "NvInferRuntime.h"

using namespace nvinfer1;

namespace {

struct Logger : ILogger {
  std::string errors;
  void log(Severity severity, const char* msg) noexcept override {
    if (severity <= Severity::kERROR) errors += std::string(msg) + "\n";
  }
};
struct Finder : ILoggerFinder {
  Logger logger;
  ILogger* findLogger() override { return &logger; }
};

size_t element_size(PluginFieldType t) {
  return t == PluginFieldType::kCHAR ? 1 : t == PluginFieldType::kINT64 || t == PluginFieldType::kFLOAT64 ? 8 : 4;
}

// name, type, length and bytes of each field, in order.
std::string dump(const PluginFieldCollection* fc) {
  std::string s;
  for (int32_t i = 0; i < fc->nbFields; ++i) {
    const PluginField& f = fc->fields[i];
    s += std::string(f.name) + ":" + std::to_string(static_cast<int>(f.type)) + "x" + std::to_string(f.length) + "=";
    s.append(static_cast<const char*>(f.data), f.length * element_size(f.type));
    s += ";";
  }
  return s;
}

IPluginV3OneRuntime* runtime_of(IPluginV3* p) {
  return static_cast<IPluginV3OneRuntime*>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
}

int fail(const std::string& what) {
  std::printf("FAIL: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return fail("usage: plugin_round_trip LIB.so");
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) return fail(dlerror());
  using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
  using SetLoggerFinder = void (*)(ILoggerFinder*);
  auto get_creators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
  auto set_logger_finder = reinterpret_cast<SetLoggerFinder>(dlsym(lib, "setLoggerFinder"));
  if (!get_creators || !set_logger_finder) return fail("getCreators/setLoggerFinder not exported");
  static Finder finder;
  set_logger_finder(&finder);
  int32_t n = 0;
  IPluginCreatorInterface* const* creators = get_creators(n);
  if (n != 1) return fail("expected one creator, got " + std::to_string(n));
  auto* creator = static_cast<IPluginCreatorV3One*>(creators[0]);
  if (std::strcmp(creator->getPluginName(), "FusedConv") || std::strcmp(creator->getPluginVersion(), "1") ||
      std::strcmp(creator->getPluginNamespace(), "epifuse"))
    return fail("creator is not FusedConv/1/epifuse");

  // As the ONNX parser forwards them: INTS -> kINT32, STRING -> kCHAR with NUL, FLOATS -> kFLOAT32.
  const int32_t strides[] = {2, 1}, pads[] = {1, 0, 2, 1}, dilations[] = {1, 2}, group[] = {2}, tf32[] = {1};
  const float params[] = {0.5f, 3.0f};
  std::vector<PluginField> fields = {
      {"strides", strides, PluginFieldType::kINT32, 2},     {"pads", pads, PluginFieldType::kINT32, 4},
      {"dilations", dilations, PluginFieldType::kINT32, 2}, {"group", group, PluginFieldType::kINT32, 1},
      {"activation", "clip", PluginFieldType::kCHAR, 5},    {"activation_params", params, PluginFieldType::kFLOAT32, 2},
      {"residual", "pre", PluginFieldType::kCHAR, 4},      {"allow_tf32", tf32, PluginFieldType::kINT32, 1},
  };
  PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.data()};
  IPluginV3* built = creator->createPlugin("node_a", &fc, TensorRTPhase::kBUILD);
  if (!built) return fail("createPlugin(kBUILD) returned null: " + finder.logger.errors);
  const PluginFieldCollection* written = runtime_of(built)->getFieldsToSerialize();
  if (!written) return fail("getFieldsToSerialize returned null");
  const std::string first = dump(written);
  if (first != dump(&fc)) return fail("serialized fields differ from the parser's:\n" + first + "\n" + dump(&fc));

  IPluginV3* restored = creator->createPlugin("node_a", written, TensorRTPhase::kRUNTIME);
  if (!restored) return fail("createPlugin(kRUNTIME) returned null: " + finder.logger.errors);
  IPluginV3* copy = restored->clone();
  const std::string second = dump(runtime_of(copy)->getFieldsToSerialize());
  if (second != first) return fail("round trip changed the fields:\n" + first + "\n" + second);
  auto* core = static_cast<IPluginV3OneCore*>(copy->getCapabilityInterface(PluginCapabilityType::kCORE));
  if (std::strcmp(core->getPluginName(), "FusedConv") || std::strcmp(core->getPluginNamespace(), "epifuse"))
    return fail("plugin core names");
  delete copy;
  delete restored;
  delete built;

  PluginField bad{"activation", "swish", PluginFieldType::kCHAR, 6};
  PluginFieldCollection bad_fc{1, &bad};
  if (creator->createPlugin("node_b", &bad_fc, TensorRTPhase::kBUILD)) return fail("bad activation accepted");
  if (finder.logger.errors.find("FusedConv 'node_b': unknown activation 'swish'") == std::string::npos)
    return fail("the logger got: " + finder.logger.errors);
  std::printf("ok\n");
  return 0;
}
