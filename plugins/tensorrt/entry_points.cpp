// How a process finds the creator. Two libraries are built from the same sources, because a
// library that both self-registers and exports getCreators fails loadLibrary ("creator ... exists
// already") when it is loaded both ways:
//   libepifuse_trt.so         getCreators + setLoggerFinder, for IPluginRegistry::loadLibrary
//                             (trtexec --dynamicPlugins, version-compatible engines);
//   libepifuse_trt_static.so  EPIFUSE_TRT_STATIC_REGISTRATION: REGISTER_TENSORRT_PLUGIN, which
//                             registers on dlopen through libnvinfer's getPluginRegistry()
//                             (trtexec --staticPlugins, Triton's plugins=, LD_PRELOAD, ctypes).
#include <atomic>

#include "fused_conv_plugin.h"

// TENSORRTAPI is empty outside TensorRT's own build, and the libraries hide everything else.
#define EPIFUSE_TRT_EXPORT extern "C" __attribute__((visibility("default")))

#ifdef EPIFUSE_TRT_STATIC_REGISTRATION

namespace epifuse::trt {
nvinfer1::ILogger* plugin_logger() { return getLogger(); }
}  // namespace epifuse::trt

using epifuse::trt::FusedConvCreator;
REGISTER_TENSORRT_PLUGIN(FusedConvCreator);

#else

namespace epifuse::trt {
namespace {
std::atomic<nvinfer1::ILoggerFinder*> logger_finder{nullptr};
}  // namespace

// Asked each time: the finder returns the logger of whichever builder or runtime is current.
nvinfer1::ILogger* plugin_logger() {
  nvinfer1::ILoggerFinder* finder = logger_finder.load();
  return finder ? finder->findLogger() : nullptr;
}
}  // namespace epifuse::trt

EPIFUSE_TRT_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder) { epifuse::trt::logger_finder.store(finder); }

EPIFUSE_TRT_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
  static epifuse::trt::FusedConvCreator creator;
  static nvinfer1::IPluginCreatorInterface* const creators[] = {&creator};
  nbCreators = 1;
  return creators;
}

#endif
