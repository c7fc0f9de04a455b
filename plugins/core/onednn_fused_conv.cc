// FusedConv on oneDNN. Parallelism: the output is cut into chunks of whole images or of output
// rows, each chunk one single-threaded primitive execution, and the chunks run on the caller's
// ParallelFor (ORT's intra-op pool in the ORT adapter). oneDNN's own OpenMP team would otherwise
// compete with ORT's pool threads, which spin between the model's other ops: on a small machine
// the two pools steal cores from each other. A chunk of rows is a dense NHWC view of the tensors
// (the image's rows h0..h1 are contiguous), with its own top/bottom padding.
#include "onednn_fused_conv.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#if EPIFUSE_HAVE_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "bf16_vectors.h"
#include "channel_mean.h"
#include "cpu_epilogue.h"
#include "cpu_isa.h"
#include "float_types.h"
#include "prepared_filters.h"
#include "simd_math.h"

namespace epifuse {

#if EPIFUSE_HAVE_ONEDNN
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using DataType = memory::data_type;

// Below this many multiply-adds a chunked launch costs more than it saves...
constexpr int64_t kMinMacsToSplit = 1 << 18;
// ...unless the filters are this large: in a model they come from memory, each layer's read once an
// inference, and one thread streams them at half the speed two do. A squeeze-excite gate's 1x1 convs
// on one pixel (MobileNetV3-Large's 960->240->960: 0.9 MB each) ran 2-3x slower in the model than in
// a micro-model, where its filters stay in the cache between runs.
constexpr int64_t kMinFilterBytesToSplit = 1 << 17;
// How many of oneDNN's implementations for a problem are timed before the first run.
constexpr size_t kTimedImplementations = 3;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN's OpenMP runtime sizes its work split from the calling thread's omp_get_max_threads(),
// when a primitive is created and when it runs: one thread, since the chunks are the parallelism.
void single_threaded() {
  thread_local const bool set = (omp_set_num_threads(1), true);
  (void)set;
}

DataType data_type(DType t) {
  switch (t) {
    case DType::kFloat: return DataType::f32;
    case DType::kFloat16: return DataType::f16;
    case DType::kBFloat16: return DataType::bf16;
  }
  return DataType::undef;
}

size_t element_size(DType t) { return t == DType::kFloat ? 4 : 2; }

// The contract's activations as oneDNN eltwise post-ops (dnnl_types.h documents each formula).
// Returns false for the identity, which needs none.
bool eltwise_for(const Activation& a, dnnl::algorithm* alg, float* alpha, float* beta) {
  using dnnl::algorithm;
  *alpha = 0.f;
  *beta = 0.f;
  const float p0 = a.params[0], p1 = a.params[1];
  switch (a.kind) {
    case ActivationKind::kIdentity: return false;
    case ActivationKind::kRelu: *alg = algorithm::eltwise_relu; return true;
    case ActivationKind::kLeakyRelu: *alg = algorithm::eltwise_relu, *alpha = p0; return true;
    case ActivationKind::kClip: *alg = algorithm::eltwise_clip, *alpha = p0, *beta = p1; return true;
    case ActivationKind::kSigmoid: *alg = algorithm::eltwise_logistic; return true;
    case ActivationKind::kTanh: *alg = algorithm::eltwise_tanh; return true;
    case ActivationKind::kSilu: *alg = algorithm::eltwise_swish, *alpha = 1.f; return true;
    case ActivationKind::kHardSigmoid: *alg = algorithm::eltwise_hardsigmoid, *alpha = p0, *beta = p1; return true;
    case ActivationKind::kHardSwish: *alg = algorithm::eltwise_hardswish, *alpha = 1.f / 6.f, *beta = 0.5f; return true;
    case ActivationKind::kGelu: *alg = algorithm::eltwise_gelu_erf; return true;
    case ActivationKind::kGeluTanh: *alg = algorithm::eltwise_gelu_tanh; return true;
    case ActivationKind::kMish: *alg = algorithm::eltwise_mish; return true;
    case ActivationKind::kElu: *alg = algorithm::eltwise_elu, *alpha = p0; return true;
    case ActivationKind::kSoftplus: *alg = algorithm::eltwise_soft_relu, *alpha = 1.f; return true;
  }
  return false;
}

// Images [n0, n0 + nc), output rows [p0, p0 + pc) of each, output channels [k0, k0 + kc); input
// rows [h0, h0 + hc) with the padding this piece sees above and below them. `in_place`: some of
// the channels, written where they belong in y by a matmul on the pixel column (strided rows).
struct Chunk {
  int64_t n0, nc, p0, pc, h0, hc, pad_top, pad_bottom;
  int64_t k0, kc;
  bool in_place = false;
  bool all_channels(const ConvProblem& p) const { return kc == p.K; }
  // Whether it computes into a dense buffer, its channels copied out (and the residual's in).
  bool copies(const ConvProblem& p) const { return !all_channels(p) && !in_place; }
};

Chunk rows_chunk(const ConvProblem& p, int64_t n0, int64_t nc, int64_t p0, int64_t pc) {
  const int64_t extent = (p.R - 1) * p.attr.dil_h + 1;
  const int64_t first = p0 * p.attr.stride_h - p.attr.pad_top;            // first input row read
  const int64_t end = (p0 + pc - 1) * p.attr.stride_h - p.attr.pad_top + extent;  // one past the last
  const int64_t h0 = std::max<int64_t>(first, 0), h1 = std::min(end, p.H);
  return {n0, nc, p0, pc, h0, h1 - h0, h0 - first, end - h1, 0, p.K, false};
}

// Output rows that split unevenly over the threads (a 7x7 layer's 7 rows as 4 + 3 on two, 1 row
// not at all) leave threads idle; a small image's output channels split instead, in pieces of a
// multiple of 16 (oneDNN's channel block), each computed into a dense buffer and copied out (1.15x
// on a 512-channel 3x3 at 7x7, 2 threads).
int64_t channels_per_piece(const ConvProblem& p, int64_t threads) {
  return ((p.K + threads - 1) / threads + 15) / 16 * 16;
}

// A pixel column (a 1x1 with unit stride and no padding, as_pixel_column's view) of at least this
// many pixels and filters of at least this many bytes, fp32: its channel pieces are matmuls writing
// their strided rows of y in place (oneDNN's convolutions take only dense outputs; its matmul writes
// rows any distance apart). Its kernel (gemm:jit) is slower than the convolution's (brgconv) where
// the filters stay in L2 (EfficientNet-B0, RegNetY, MixNet-S 0.93-0.95x), and on fewer pixels (0.85x
// on 49); what it saves is each thread streaming all of a large filter from memory, and the copies.
constexpr int64_t kMinInPlacePixels = 96;
constexpr int64_t kMinInPlaceFilterBytes = 1 << 20;

// A 1x1 with unit stride and no padding: its pixels are independent rows of a GEMM.
bool unit_1x1(const ConvProblem& p) {
  const ConvAttributes& a = p.attr;
  return p.R == 1 && p.S == 1 && a.stride_h == 1 && a.stride_w == 1 && a.pad_top == 0 && a.pad_left == 0 &&
         a.pad_bottom == 0 && a.pad_right == 0;
}

bool in_place_pieces(const ConvProblem& p) {
  return p.dtype == DType::kFloat && p.N == 1 && p.W == 1 && unit_1x1(p) && p.attr.group == 1 &&
         p.H >= kMinInPlacePixels && p.K * p.C * 4 >= kMinInPlaceFilterBytes;
}

bool split_channels(const ConvProblem& p, int64_t threads, bool in_place) {
  constexpr int64_t kMaxOutputBytes = 1 << 20;  // the copy stays cheap beside the convolution
  if (p.N != 1 || p.attr.group != 1 || channels_per_piece(p, threads) >= p.K) return false;
  const int64_t P = p.P();
  // Filters larger than the activations they meet (a 7x7 map's 768->3072 1x1: 9.4 MB against
  // 150 KB): split by rows, every thread streams all of them; by channels, 1/threads of them
  // each, for the whole input and the copies of its output (and residual) pieces. Elements a
  // thread moves: rows W + X/T, channels W/T + X + copies/T, a copied element counted as 4 (read
  // from the piece, read for ownership, written, written back: 192->1152 at 7x7 ran 0.95x split
  // by channels with 2). 1.7x on the 768->3072 layer, 1.47x on ResNet-50's 2048->512, 2 threads.
  const int64_t filters = p.K * p.R * p.S * p.C, input = p.H * p.W * p.C;
  const int64_t copies = in_place ? 0 : (p.attr.residual == Residual::kNone ? 4 : 8) * P * p.Q() * p.K;
  if ((filters - input) * (threads - 1) > copies) return true;
  const int64_t rows = (P + threads - 1) / threads;  // the busiest thread's rows
  return rows * threads * 20 > P * 21 && P * p.Q() * p.K * 4 <= kMaxOutputBytes;
}

// Where the activation is cpu_epilogue's pass over a piece's output (SiLU, GELU), how many row
// pieces an image needs for each piece's output to be still in L2 when the pass reads it back:
// EfficientNet-B0's 16->96 1x1 at 112x112 writes 4.8 MB, 2.4 MB a thread in two pieces, and ran
// ~2x ORT's convolution, whose activation is a node of its own.
int64_t pass_pieces(const ConvProblem& p) {
  constexpr int64_t kPieceOutputBytes = 512 << 10;
  if (!activation_in_pass(p.dtype, p.attr)) return 1;
  const int64_t bytes = p.P() * p.Q() * p.K * static_cast<int64_t>(element_size(p.dtype));
  return (bytes + kPieceOutputBytes - 1) / kPieceOutputBytes;
}

// `allow_in_place`: channel pieces of a pixel column may be matmuls in place (in_place_pieces).
std::vector<Chunk> plan(const ConvProblem& p, int64_t threads, bool allow_in_place = true) {
  const bool in_place = allow_in_place && in_place_pieces(p);
  const int64_t P = p.P();
  const int64_t filter_macs = p.K * p.R * p.S * (p.C / p.attr.group);
  const int64_t macs = p.N * P * p.Q() * filter_macs;
  const int64_t filter_bytes = filter_macs * static_cast<int64_t>(element_size(p.dtype));
  const bool split = threads > 1 && (macs >= kMinMacsToSplit || filter_bytes >= kMinFilterBytesToSplit);
  const int64_t for_pass = pass_pieces(p);
  std::vector<Chunk> chunks;
  if (split && split_channels(p, threads, in_place)) {
    const int64_t kc = channels_per_piece(p, threads);
    for (int64_t k0 = 0; k0 < p.K; k0 += kc) {
      Chunk c = rows_chunk(p, 0, 1, 0, P);
      c.k0 = k0;
      c.kc = std::min(kc, p.K - k0);
      c.in_place = in_place;
      chunks.push_back(c);
    }
  } else if ((split && p.N < threads) || for_pass > 1) {
    // fewer images than threads, or an activation pass: each image cut into row pieces
    int64_t pieces = split ? (threads + p.N - 1) / p.N : 1;
    pieces = std::min(P, std::max(pieces, (for_pass + pieces - 1) / pieces * pieces));
    const int64_t rows = (P + pieces - 1) / pieces;
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t p0 = 0; p0 < P; p0 += rows) chunks.push_back(rows_chunk(p, n, 1, p0, std::min(rows, P - p0)));
  } else {
    // Several images make one dense view only when each is read whole: a strided conv whose last
    // input rows are never read takes its images one at a time.
    const bool whole_images = rows_chunk(p, 0, 1, 0, P).hc == p.H;
    const int64_t groups = std::min(p.N, whole_images ? (split ? threads : 1) : p.N);
    for (int64_t t = 0, n0 = 0; t < groups; ++t) {  // images, as evenly as they divide
      const int64_t nc = p.N / groups + (t < p.N % groups ? 1 : 0);
      chunks.push_back(rows_chunk(p, n0, nc, 0, P));
      n0 += nc;
    }
  }
  for (const Chunk& c : chunks)  // a piece wholly inside huge padding: images whole, one at a time
    if (c.hc <= 0) {
      chunks.clear();
      for (int64_t n = 0; n < p.N; ++n) chunks.push_back(rows_chunk(p, n, 1, 0, P));
      break;
    }
  return chunks;
}

// A 1x1 convolution with unit stride and no padding is one GEMM over the pixels. Seen as one image
// of N*H*W rows of a pixel each, its chunks split evenly: a 7x7 layer's 49 pixels as 25 + 24 where
// whole rows split 28 + 21 (1.13x on EfficientNet-B0's 7x7 1x1s, 2 threads), as fast per pixel.
ConvProblem as_pixel_column(const ConvProblem& p) {
  if (!unit_1x1(p)) return p;
  ConvProblem column = p;
  column.N = 1;
  column.H = p.N * p.H * p.W;
  column.W = 1;
  return column;
}

memory::desc nhwc(int64_t n, int64_t c, int64_t h, int64_t w, DataType t) {
  return memory::desc({n, c, h, w}, t, Tag::nhwc);
}

// The filters of `k` output channels as the model stores them: KRSC, i.e. ohwi (gohwi with groups).
memory::desc krsc(const ConvProblem& p, int64_t k, DataType t) {
  const int64_t g = p.attr.group;
  if (g == 1) return memory::desc({k, p.C, p.R, p.S}, t, Tag::ohwi);
  return memory::desc({g, k / g, p.C / g, p.R, p.S}, t, Tag::gohwi);
}

memory::desc any_weights(const ConvProblem& p, int64_t k, DataType t) {
  const int64_t g = p.attr.group;
  if (g == 1) return memory::desc({k, p.C, p.R, p.S}, t, Tag::any);
  return memory::desc({g, k / g, p.C / g, p.R, p.S}, t, Tag::any);
}

struct Primitive {
  dnnl::primitive prim;  // a convolution, or a chunk in place's matmul
  memory::desc src, dst, weights, bias, scratchpad;  // queried once: each query of a pd builds a new desc
  std::string impl;
  uint64_t serial;  // never reused: names this primitive in the threads' caches of memory objects
};

uint64_t next_primitive_serial() {
  static std::atomic<uint64_t> serial{0};
  return ++serial;
}

// Everything that shapes a chunk's primitive; a plan's key adds the batch and the input height. A
// fixed array: a call looks its plan up with no allocation.
using Key = std::array<int64_t, 26>;

Key primitive_key(const ConvProblem& p, const Chunk& c) {
  const ConvAttributes& a = p.attr;
  int32_t bits[2];
  std::memcpy(bits, a.activation.params, sizeof bits);
  return {static_cast<int64_t>(p.dtype), c.nc, c.hc, p.W, p.C, p.K, p.R, p.S, c.pc,
          a.stride_h, a.stride_w, a.dil_h, a.dil_w, c.pad_top, c.pad_bottom, a.pad_left, a.pad_right,
          a.group, static_cast<int64_t>(a.activation.kind), bits[0], bits[1], static_cast<int64_t>(a.residual),
          c.kc, c.in_place, 0, 0};
}

// Index of the residual's binary post-op: first for pre-activation, after the eltwise for post.
int residual_post_op(const ConvAttributes& a) {
  return a.residual == Residual::kPost && a.activation.kind != ActivationKind::kIdentity ? 1 : 0;
}

// Where the activation runs as cpu_epilogue's pass, the primitive has no eltwise post-op, and a
// residual added after the activation is added by the pass too.
bool residual_in_primitive(const ConvProblem& p) {
  return p.attr.residual == Residual::kPre ||
         (p.attr.residual == Residual::kPost && !activation_in_pass(p.dtype, p.attr));
}

using ConvPd = dnnl::convolution_forward::primitive_desc;

// The best of a few runs of `pd` on scratch buffers, in seconds (zeros: a CPU convolution's speed
// does not depend on the values).
double seconds(const ConvPd& pd, const ConvProblem& p) {
  dnnl::engine& engine = cpu_engine();
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, memory(pd.src_desc(), engine)}, {DNNL_ARG_WEIGHTS, memory(pd.weights_desc(), engine)},
      {DNNL_ARG_BIAS, memory(pd.bias_desc(), engine)}, {DNNL_ARG_DST, memory(pd.dst_desc(), engine)},
      {DNNL_ARG_SCRATCHPAD, memory(pd.scratchpad_desc(), engine)}};
  if (residual_in_primitive(p)) {
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(residual_post_op(p.attr)) | DNNL_ARG_SRC_1,
                 memory(pd.dst_desc(), engine));
  }
  for (auto& [arg, m] : args)
    if (m.get_desc().get_size() != 0) std::memset(m.get_data_handle(), 0, m.get_desc().get_size());
  dnnl::convolution_forward conv(pd);
  dnnl::stream stream(engine);
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {  // the first run warms caches and pages
    const auto start = std::chrono::steady_clock::now();
    conv.execute(stream, args);
    stream.wait();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (run > 0) best = std::min(best, took);
  }
  return best;
}

// The residual and activation as post-ops on an output (and residual) of layout `dst`.
dnnl::primitive_attr post_ops_for(const ConvProblem& p, const memory::desc& dst) {
  const ConvAttributes& a = p.attr;
  dnnl::post_ops ops;
  dnnl::algorithm alg;
  float alpha, beta;
  const bool has_act = !activation_in_pass(p.dtype, a) && eltwise_for(a.activation, &alg, &alpha, &beta);
  if (a.residual == Residual::kPre) ops.append_binary(dnnl::algorithm::binary_add, dst);
  if (has_act) ops.append_eltwise(alg, alpha, beta);
  if (a.residual == Residual::kPost && residual_in_primitive(p)) ops.append_binary(dnnl::algorithm::binary_add, dst);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// A chunk in place: rows [p0, p0 + pc) of the pixel column times output channels [k0, k0 + kc) of
// the filters, a matmul whose output (and residual) rows are K apart, as they lie in y.
std::optional<Primitive> create_in_place(const ConvProblem& p, const Chunk& c) {
  const memory::desc src({c.pc, p.C}, DataType::f32, Tag::ab);
  const memory::desc dst({c.pc, c.kc}, DataType::f32, memory::dims{p.K, 1});
  const memory::desc weights({p.C, c.kc}, DataType::f32, Tag::any);
  const memory::desc bias({1, c.kc}, DataType::f32, Tag::ab);
  const dnnl::primitive_attr attr = post_ops_for(p, dst);
  try {
    dnnl::matmul::primitive_desc pd(cpu_engine(), src, weights, bias, dst, attr);
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) == 0) return std::nullopt;
    return Primitive{dnnl::matmul(pd), src, dst, pd.weights_desc(), bias, pd.scratchpad_desc(),
                     "matmul " + impl, next_primitive_serial()};
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

// The chunk's primitive, or nullopt when oneDNN has only its reference implementation for it.
// oneDNN lists its implementations in its own order of preference, tuned for Intel cores; on
// others (AMD Zen measured) a later one is sometimes faster: brgconv against jit on layers of
// 32 channels, 1.3x apart. So the first few optimized ones are timed once and the fastest kept.
// A chunk in place is a matmul instead (create_in_place).
std::optional<Primitive> create(const ConvProblem& p, const Chunk& c) {
  single_threaded();
  if (c.in_place) return create_in_place(p, c);
  const DataType t = data_type(p.dtype);
  const memory::desc src = nhwc(c.nc, p.C, c.hc, p.W, t);
  const memory::desc dst = nhwc(c.nc, c.kc, c.pc, p.Q(), t);
  const memory::desc bias({c.kc}, DataType::f32, Tag::a);
  const ConvAttributes& a = p.attr;
  const dnnl::primitive_attr attr = post_ops_for(p, dst);

  try {
    ConvPd pd(cpu_engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src,
              any_weights(p, c.kc, t), bias, dst, {a.stride_h, a.stride_w}, {a.dil_h - 1, a.dil_w - 1},
              {c.pad_top, a.pad_left}, {c.pad_bottom, a.pad_right}, attr);
    std::vector<ConvPd> candidates;
    do {
      const std::string impl = pd.impl_info_str();
      if (impl.rfind("ref", 0) == 0) break;  // the rest are slower than the reference kernel
      // an older ISA's kernel after a newer one's (sse41 after avx2) never wins
      if (candidates.empty() || impl.find("sse41") == std::string::npos) {
        dnnl_primitive_desc_t copy;  // a C++ copy would share the handle that next_impl() advances
        dnnl::error::wrap_c_api(dnnl_primitive_desc_clone(&copy, pd.get()), "could not clone a primitive descriptor");
        candidates.emplace_back(copy);
      }
    } while (candidates.size() < kTimedImplementations && pd.next_impl());
    if (candidates.empty()) return std::nullopt;
    size_t best = 0;
    if (candidates.size() > 1) {
      std::vector<double> times;
      for (const ConvPd& candidate : candidates) times.push_back(seconds(candidate, p));
      best = static_cast<size_t>(std::min_element(times.begin(), times.end()) - times.begin());
    }
    const ConvPd& chosen = candidates[best];
    return Primitive{dnnl::convolution_forward(chosen),
                     src,
                     dst,
                     chosen.weights_desc(),
                     chosen.bias_desc(),
                     chosen.scratchpad_desc(),
                     chosen.impl_info_str(),
                     next_primitive_serial()};
  } catch (const dnnl::error&) {
    return std::nullopt;  // unimplemented for this problem, type or CPU
  }
}

}  // namespace

// A problem's chunks and their primitives (null where oneDNN refuses one), found once per shape:
// a call then costs one map lookup before the primitives run.
struct Plan {
  std::vector<Chunk> chunks;
  std::vector<const Primitive*> prims;
  bool refused = false;
};

// Where each input channel's taps lie in reordered filters: runs of `run` elements, run i's element j of
// channel[i] + j % interleave. oneDNN's fp32 filter layouts keep a block of output channels innermost
// (Acdb32a, ABcd16b16a: interleave 1), its bf16 ones pairs of input channels inside that (AcdB16a2b,
// ABcd16b16a2b: interleave 2); runs of 1 where neither holds.
struct ChannelRuns {
  int64_t run = 1;
  int64_t interleave = 1;
  std::vector<int32_t> channel;
};

struct ReorderedWeights {
  memory::desc layout;
  int64_t k0;
  memory data;
  std::shared_ptr<const ChannelRuns> runs;  // made at the first scaled call
};

struct OnednnConv::State {
  const VectorIsa isa = best_vector_isa();  // of the activation pass: EPIFUSE_CPU_ISA read once a node
  std::mutex mutex;
  std::map<Key, std::optional<Primitive>> primitives;
  std::map<Key, Plan> plans;
  // Constant filters reordered into each layout a primitive asked for, keyed by that layout and
  // the first output channel of the chunk that reads them.
  std::vector<ReorderedWeights> weights;
  const void* weights_source = nullptr;

  const Plan& plan_for(const ConvProblem& p) {
    Key key = primitive_key(p, rows_chunk(p, 0, p.N, 0, p.P()));
    key[key.size() - 2] = p.N;
    key[key.size() - 1] = p.H;
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan made = make_plan(p, true);
    if (made.refused) made = make_plan(p, false);  // a matmul in place refused: the convolution's pieces
    return plans.emplace(std::move(key), std::move(made)).first->second;
  }

  Plan make_plan(const ConvProblem& p, bool allow_in_place) {
    Plan made;
    made.chunks = plan(p, hardware_threads(), allow_in_place);
    for (const Chunk& c : made.chunks) {
      const auto& prim = primitive(p, c);
      made.prims.push_back(prim ? &*prim : nullptr);
      made.refused = made.refused || !prim;
    }
    return made;
  }

  const std::optional<Primitive>& primitive(const ConvProblem& p, const Chunk& c) {
    const Key key = primitive_key(p, c);
    auto it = primitives.find(key);
    if (it == primitives.end()) it = primitives.emplace(key, create(p, c)).first;
    return it->second;
  }
};

namespace {

// Output channels [k0, k0 + want's count) of the KRSC filters `w`, in the layout `want`.
// A matmul's `want` is [C][k]: the KRSC filters of a 1x1 read with their rows as columns.
memory reorder_weights(const ConvProblem& p, const void* w, int64_t k0, const memory::desc& want) {
  single_threaded();
  const bool matmul = want.get_ndims() == 2;
  const int64_t k = matmul ? want.get_dims()[1] : want.get_dims()[p.attr.group == 1 ? 0 : 1] * p.attr.group;
  const memory::desc have = matmul ? memory::desc({p.C, k}, data_type(p.dtype), memory::dims{1, p.C})
                                   : krsc(p, k, data_type(p.dtype));
  const int64_t offset = k0 * p.R * p.S * (p.C / p.attr.group) * static_cast<int64_t>(element_size(p.dtype));
  memory source(have, cpu_engine(), const_cast<char*>(static_cast<const char*>(w)) + offset);
  memory out(want, cpu_engine());
  dnnl::stream stream(cpu_engine());
  dnnl::reorder(source, out).execute(stream, source, out);
  stream.wait();
  return out;
}

// The input channel of each element of the filters reordered into `layout` (chunk k0's): filters of
// channel numbers reordered as the filters were, in two parts that both p's types hold exactly (1 + c % 128
// and 1 + c / 128: bfloat16 has 8 significant bits). Padding comes out 0, a channel of none: its filters are
// zero, and any scale leaves them so.
constexpr int64_t kMaxScaledChannels = 128 * 256;

std::shared_ptr<const ChannelRuns> channel_runs(const ConvProblem& p, int64_t k0, const memory::desc& layout) {
  constexpr int32_t kPadding = -1;
  const int64_t cg = p.C / p.attr.group, kg = p.K / p.attr.group, taps = p.R * p.S;
  const size_t esize = element_size(p.dtype);
  const int64_t elements = static_cast<int64_t>(layout.get_size() / esize);
  std::vector<int32_t> channel(static_cast<size_t>(elements), 0);
  for (int part = 0; part < 2; ++part) {
    std::vector<char> numbers(static_cast<size_t>(p.K * taps * cg) * esize);
    for (int64_t k = 0; k < p.K; ++k)
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t c = 0; c < cg; ++c) {
          const int64_t input = k / kg * cg + c, i = (k * taps + t) * cg + c;
          const float v = static_cast<float>(1 + (part == 0 ? input % 128 : input / 128));
          if (p.dtype == DType::kFloat) reinterpret_cast<float*>(numbers.data())[i] = v;
          else reinterpret_cast<bfloat16_t*>(numbers.data())[i] = from_float<bfloat16_t>(v);
        }
    const memory reordered = reorder_weights(p, numbers.data(), k0, layout);
    const char* data = static_cast<const char*>(reordered.get_data_handle());
    for (int64_t i = 0; i < elements; ++i) {
      const int32_t v = static_cast<int32_t>(p.dtype == DType::kFloat ? reinterpret_cast<const float*>(data)[i]
                                             : to_float(reinterpret_cast<const bfloat16_t*>(data)[i]));
      channel[i] = v == 0 || channel[i] == kPadding ? kPadding : channel[i] + (v - 1) * (part == 0 ? 1 : 128);
    }
  }
  // The longest runs, of one channel or of pairs, that cut the filters evenly (padding joins any).
  const auto run_channel = [&](int64_t i, int64_t run, int64_t interleave) {
    int32_t first = kPadding;
    for (int64_t j = 0; j < run; ++j) {
      const int32_t v = channel[i + j];
      if (v == kPadding) continue;
      const int32_t base = v - static_cast<int32_t>(j % interleave);
      if (first != kPadding && base != first) return std::optional<int32_t>();
      first = base;
    }
    return std::optional<int32_t>(first == kPadding ? 0 : first);
  };
  auto runs = std::make_shared<ChannelRuns>();
  for (const auto [run, interleave] : {std::pair<int64_t, int64_t>{64, 1}, {32, 1}, {16, 1}, {64, 2}, {32, 2},
                                       {16, 2}, {8, 1}, {1, 1}}) {
    if (elements % run != 0) continue;
    std::vector<int32_t> of_runs;
    for (int64_t i = 0; i < elements; i += run) {
      const std::optional<int32_t> first = run_channel(i, run, interleave);
      if (!first || *first + interleave > p.C) break;  // a pair's second channel past C: not this shape
      of_runs.push_back(*first);
    }
    if (static_cast<int64_t>(of_runs.size()) * run == elements) {
      runs->run = run;
      runs->interleave = interleave;
      runs->channel = std::move(of_runs);
      break;
    }
  }
  return runs;
}

// Runs of 16 or more elements, interleave 1 or 2 (run % 16 == 0): a vector of 16 scales at a time, one
// channel's or a pair's alternating.
EPIFUSE_AVX512 void scale_runs_avx512(const ChannelRuns& runs, const float* w, const float* s, float* out) {
  const int64_t n = runs.run;
  for (size_t r = 0; r < runs.channel.size(); ++r) {
    const float* sc = s + runs.channel[r];
    const __m512 scale = runs.interleave == 1 ? _mm512_set1_ps(sc[0]) : _mm512_set4_ps(sc[1], sc[0], sc[1], sc[0]);
    for (int64_t i = static_cast<int64_t>(r) * n, end = i + n; i < end; i += 16)
      _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(w + i), scale));
  }
}

EPIFUSE_AVX512 void scale_runs_avx512(const ChannelRuns& runs, const bfloat16_t* w, const bfloat16_t* s,
                                      bfloat16_t* out) {
  const int64_t n = runs.run;
  for (size_t r = 0; r < runs.channel.size(); ++r) {
    const bfloat16_t* sc = s + runs.channel[r];
    const float s0 = to_float(sc[0]), s1 = runs.interleave == 1 ? s0 : to_float(sc[1]);
    const __m512 scale = _mm512_set4_ps(s1, s0, s1, s0);
    for (int64_t i = static_cast<int64_t>(r) * n, end = i + n; i < end; i += 16)
      store_bf16x16(out + i, _mm512_mul_ps(load_bf16x16(w + i), scale));
  }
}

// out = w with each element times its channel's scale in s ([C]), rounded once to T.
template <class T>
void scale_runs(const ChannelRuns& runs, const T* w, const T* s, T* out, VectorIsa isa) {
  if (isa == VectorIsa::kAvx512 && runs.run % 16 == 0) return scale_runs_avx512(runs, w, s, out);
  const int64_t n = runs.run;
  for (size_t r = 0; r < runs.channel.size(); ++r) {
    const T* from = w + static_cast<int64_t>(r) * n;
    T* to = out + static_cast<int64_t>(r) * n;
    for (int64_t i = 0; i < n; ++i)
      to[i] = from_float<T>(to_float(from[i]) * to_float(s[runs.channel[r] + i % runs.interleave]));
  }
}

// `channels` values of each of `pixels` rows, from rows `from_stride` values apart to rows `to_stride` apart.
void copy_channels(char* to, int64_t to_stride, const char* from, int64_t from_stride, int64_t pixels,
                   int64_t channels, size_t esize) {
  for (int64_t i = 0; i < pixels; ++i)
    std::memcpy(to + i * to_stride * static_cast<int64_t>(esize), from + i * from_stride * static_cast<int64_t>(esize),
                static_cast<size_t>(channels) * esize);
}

// One thread's memory objects for a primitive's tensors, made at its first call on that thread and
// re-pointed at each: making them per call (a malloc and a oneDNN object per tensor) cost more
// than a small layer's convolution. Per thread, since re-pointing a shared one would race.
struct ThreadMemories {
  memory src, bias, dst, scratchpad, residual, weights;
};

// Past this many primitives a thread drops them all (some may be a closed session's): a few MB at most.
constexpr size_t kThreadMemoriesCap = 1024;

ThreadMemories& thread_memories(const Primitive& prim) {
  thread_local std::unordered_map<uint64_t, ThreadMemories> cache;
  auto it = cache.find(prim.serial);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kThreadMemoriesCap) cache.clear();
  dnnl::engine& engine = cpu_engine();
  ThreadMemories made{memory(prim.src, engine, nullptr), memory(prim.bias, engine, nullptr),
                      memory(prim.dst, engine, nullptr), memory(prim.scratchpad, engine, nullptr),
                      memory(prim.dst, engine, nullptr), memory(prim.weights, engine, nullptr)};
  return cache.emplace(prim.serial, std::move(made)).first->second;
}

}  // namespace

OnednnConv::OnednnConv() : state_(std::make_unique<State>()) {}
OnednnConv::~OnednnConv() = default;

void OnednnConv::release_filters() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->weights.clear();
  state_->weights_source = nullptr;
}

std::string OnednnConv::implementation(const ConvProblem& problem) {
  const ConvProblem p = as_pixel_column(problem);
  std::lock_guard<std::mutex> lock(state_->mutex);
  const Plan& plan = state_->plan_for(p);
  if (plan.refused) return "";
  const Primitive* prim = plan.prims.front();
  return activation_in_pass(p.dtype, p.attr) ? prim->impl + " + activation pass" : prim->impl;
}

Status OnednnConv::run(const ConvProblem& problem, const void* x, const void* w, bool w_constant, const void* b,
                       const void* z, void* y, const ParallelFor& parallel_for, bool* refused,
                       const void* w_scale, float* mean, bool* mean_done) {
  const ConvProblem p = as_pixel_column(problem);
  *refused = true;
  if (mean_done != nullptr) *mean_done = false;
  if (problem.N != 1 || p.dtype != DType::kFloat || mean_done == nullptr) mean = nullptr;  // the caller's pass
  if (w_scale != nullptr && (!w_constant || (p.dtype != DType::kFloat && p.dtype != DType::kBFloat16)))
    return Status::Error("filters scaled in oneDNN's layout must be constant, float or bfloat16");
  if (w_scale != nullptr && p.C > kMaxScaledChannels) return Status::Ok();  // refused: channel_runs' numbers
  if (p.attr.activation.kind == ActivationKind::kClip && p.attr.activation.params[0] > p.attr.activation.params[1])
    return Status::Ok();  // min > max: ONNX's Clip returns max everywhere, oneDNN's clip differs
  // Primitives and filters under the lock; executions run unlocked (each has its own scratchpad).
  const Plan* plan_ptr;
  std::vector<memory> weights;
  std::vector<std::shared_ptr<const ChannelRuns>> runs;  // where w_scale: each chunk's filters' channel runs
  try {
    std::lock_guard<std::mutex> lock(state_->mutex);
    plan_ptr = &state_->plan_for(p);  // map nodes stay put: the pointer outlives the lock
    if (plan_ptr->refused) return Status::Ok();
    // Constant filters are reordered once per layout; others on every call, kept for this call only.
    std::vector<ReorderedWeights> this_call;
    auto& cache = w_constant ? state_->weights : this_call;
    if (w_constant && state_->weights_source != w) {
      state_->weights.clear();
      state_->weights_source = w;
    }
    for (size_t i = 0; i < plan_ptr->prims.size(); ++i) {
      const memory::desc& layout = plan_ptr->prims[i]->weights;
      const int64_t k0 = plan_ptr->chunks[i].k0;
      auto it = std::find_if(cache.begin(), cache.end(),
                             [&](const ReorderedWeights& e) { return e.k0 == k0 && e.layout == layout; });
      if (it == cache.end()) it = cache.insert(cache.end(), {layout, k0, reorder_weights(p, w, k0, layout), nullptr});
      weights.push_back(it->data);
      if (w_scale != nullptr) {
        if (!it->runs) it->runs = channel_runs(p, k0, layout);
        runs.push_back(it->runs);
        // runs shorter than a vector: a scalar loop over every filter value, slower than scaling x
        if (it->runs->run < 16) return Status::Ok();  // refused
      }
    }
  } catch (const dnnl::error& e) {
    return Status::Error(std::string("oneDNN: ") + e.what());
  }
  const std::vector<Chunk>& chunks = plan_ptr->chunks;
  const std::vector<const Primitive*>& prims = plan_ptr->prims;
  *refused = false;

  std::vector<float> bias32;
  const float* bias = static_cast<const float*>(b);
  if (p.dtype != DType::kFloat) {
    bias32.resize(static_cast<size_t>(p.K));
    for (int64_t k = 0; k < p.K; ++k)
      bias32[k] = p.dtype == DType::kFloat16 ? to_float(static_cast<const float16_t*>(b)[k])
                                             : to_float(static_cast<const bfloat16_t*>(b)[k]);
    bias = bias32.data();
  }

  const size_t esize = element_size(p.dtype);
  const int64_t Q = p.Q(), P = p.P();
  // Numbers this call (for the scaled filters a thread keeps: its pieces of one call share them).
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = w_scale != nullptr ? ++calls : 0;
  std::vector<float> piece_sums(mean ? chunks.size() * static_cast<size_t>(p.K) : 0, 0.f);  // [chunk][K]
  std::mutex error_mutex;
  std::string error;
  parallel_for(static_cast<int64_t>(chunks.size()), [&](int64_t i) {
    try {
      single_threaded();
      const Chunk& c = chunks[i];
      const Primitive& prim = *prims[i];
      auto at = [](const void* base, int64_t elements, size_t size) {
        return const_cast<char*>(static_cast<const char*>(base)) + elements * static_cast<int64_t>(size);
      };
      const int64_t x_offset = ((c.n0 * p.H + c.h0) * p.W) * p.C;
      const int64_t y_offset = ((c.n0 * P + c.p0) * Q) * p.K + c.k0;
      const int64_t pixels = c.nc * c.pc * Q;
      // A chunk of all the channels is a dense view of y (and z), one in place a strided one; one of
      // some channels otherwise computes into this thread's buffers, z's channels copied in and the
      // output copied out.
      char* out = at(y, y_offset, esize);
      const char* residual = z ? at(z, y_offset, esize) : nullptr;
      thread_local std::vector<char> channels_out, channels_residual;
      if (c.copies(p)) {
        channels_out.resize(static_cast<size_t>(pixels * c.kc) * esize);
        out = channels_out.data();
        if (residual) {
          channels_residual.resize(channels_out.size());
          copy_channels(channels_residual.data(), c.kc, residual, p.K, pixels, c.kc, esize);
          residual = channels_residual.data();
        }
      }
      thread_local std::vector<char> scratch;
      if (scratch.size() < prim.scratchpad.get_size()) scratch.resize(prim.scratchpad.get_size());
      ThreadMemories& m = thread_memories(prim);
      if (w_scale != nullptr) {  // the chunk's filters scaled on its own thread: they stay in that core's cache
        // 64-byte aligned, as oneDNN's own copies: its kernels read the filters a cache line at a time
        thread_local std::vector<float> buffer;
        thread_local std::pair<uint64_t, const void*> scaled_for{0, nullptr};  // (call, filters) the buffer holds
        const void* from = weights[i].get_data_handle();
        const int64_t bytes = static_cast<int64_t>(runs[i]->channel.size() * static_cast<size_t>(runs[i]->run) * esize);
        float* scaled = aligned(buffer, (bytes + 3) / 4);
        if (scaled_for != std::make_pair(call, from)) {  // not already this call's, from an earlier piece
          if (p.dtype == DType::kFloat)
            scale_runs(*runs[i], static_cast<const float*>(from), static_cast<const float*>(w_scale), scaled,
                       state_->isa);
          else
            scale_runs(*runs[i], static_cast<const bfloat16_t*>(from), static_cast<const bfloat16_t*>(w_scale),
                       reinterpret_cast<bfloat16_t*>(scaled), state_->isa);
          scaled_for = {call, from};
        }
        m.weights.set_data_handle(scaled);
      }
      m.src.set_data_handle(at(x, x_offset, esize));
      m.bias.set_data_handle(const_cast<float*>(bias + c.k0));
      m.dst.set_data_handle(out);
      m.scratchpad.set_data_handle(scratch.data());
      dnnl_exec_arg_t args[6] = {{DNNL_ARG_SRC, m.src.get()},
                                 {DNNL_ARG_WEIGHTS, w_scale ? m.weights.get() : weights[i].get()},
                                 {DNNL_ARG_BIAS, m.bias.get()},
                                 {DNNL_ARG_DST, m.dst.get()},
                                 {DNNL_ARG_SCRATCHPAD, m.scratchpad.get()}};
      int nargs = 5;
      if (residual_in_primitive(p)) {
        m.residual.set_data_handle(const_cast<char*>(residual));
        args[nargs++] = {DNNL_ARG_ATTR_MULTIPLE_POST_OP(residual_post_op(p.attr)) | DNNL_ARG_SRC_1, m.residual.get()};
      }
      thread_local dnnl::stream stream(cpu_engine());
      dnnl::error::wrap_c_api(dnnl_primitive_execute(prim.prim.get(), stream.get(), nargs, args),
                              "could not run a convolution");
      stream.wait();
      if (activation_in_pass(p.dtype, p.attr)) {  // the chunk's output is still in cache
        const bool add_z = p.attr.residual == Residual::kPost;
        float* o = reinterpret_cast<float*>(out);
        const float* r = add_z ? reinterpret_cast<const float*>(residual) : nullptr;
        if (c.in_place) {  // rows of kc values, K apart
          for (int64_t i = 0; i < pixels; ++i)
            activation_pass(p.attr, state_->isa, o + i * p.K, r ? r + i * p.K : nullptr, c.kc);
        } else {  // dense
          activation_pass(p.attr, state_->isa, o, r, pixels * c.kc);
        }
      }
      if (mean)  // the piece's output, still in this core's cache: rows of kc values, kc or K apart
        channel_sums_cpu(reinterpret_cast<const float*>(out), c.copies(p) ? c.kc : p.K,
                         piece_sums.data() + i * p.K + c.k0, pixels, c.kc);
      if (c.copies(p)) copy_channels(at(y, y_offset, esize), p.K, out, c.kc, pixels, c.kc, esize);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (error.empty()) error = std::string("oneDNN: ") + e.what();
    }
  });
  if (!error.empty()) return Status::Error(error);
  if (mean) {  // the pieces' sums in a fixed order: the same mean whichever thread ran which piece
    const float scale = 1.f / static_cast<float>(problem.P() * problem.Q());
    for (int64_t k = 0; k < p.K; ++k) {
      float total = 0.f;
      for (size_t i = 0; i < chunks.size(); ++i) total += piece_sums[i * p.K + k];
      mean[k] = total * scale;
    }
    *mean_done = true;
  }
  return Status::Ok();
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

#else  // built without oneDNN: every problem goes to the reference kernel

struct OnednnConv::State {};
OnednnConv::OnednnConv() = default;
OnednnConv::~OnednnConv() = default;
void OnednnConv::release_filters() {}
std::string OnednnConv::implementation(const ConvProblem&) { return ""; }
Status OnednnConv::run(const ConvProblem&, const void*, const void*, bool, const void*, const void*, void*,
                       const ParallelFor&, bool* refused, const void*, float*, bool* mean_done) {
  *refused = true;
  if (mean_done != nullptr) *mean_done = false;
  return Status::Ok();
}
std::string onednn_version() { return ""; }

#endif

}  // namespace epifuse
