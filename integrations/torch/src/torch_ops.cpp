// SPDX-License-Identifier: Apache-2.0
// libkdispatch_torch: kdispatch's ops registered with torch's dispatcher
// from C++, one set of registrations per row of the library's op list
// (dispatch::op_list()), never per op by hand:
//
//   torch.ops.kdispatch.<op>(inputs..., scalars) -> outputs   an op with outputs (allocated by torch)
//   torch.ops.kdispatch.<op>_out(Tensor(a!) out.., inputs.., scalars) -> ()   the same, into given outputs
//   torch.ops.kdispatch.<op>_(Tensor(a!) x.., inputs.., scalars) -> ()       an op that only works in place
//   torch.ops.kdispatch._floor_<name>(...)  the same schema and outputs; launches one empty kernel (the
//                                           binding's own cost, for benchmarks)
//   torch.ops.kdispatch_vllm.{rms_norm, fused_add_rms_norm, silu_and_mul, moe_sum}   vLLM's _C / _moe_C
//                                           names and argument order (swap torch.ops._C for
//                                           torch.ops.kdispatch_vllm); a scalar vLLM's schema lacks
//                                           takes its default (moe_sum's routed_scaling_factor: 1)
//
// One boxed kernel serves every registration: it reads the tensors off the
// dispatcher's stack (no DLPack capsule, no Python), allocates outputs with
// torch, flattens [..., cols] to rows, and calls kdispatch on torch's
// current stream of the tensors' device (a device guard makes that device
// current), with the capture flag when that stream is being captured.
// Kernels: CPU, CUDA (the same function; the GPU hooks come from
// cuda_stream.cpp), Meta (shapes only), Autograd (refuses a gradient).
// This file includes no CUDA, HIP or DLPack header.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>
#include <torch/version.h>

#include <pthread.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "bridge.hpp"
#include "dispatch/ops.hpp"

namespace kdispatch_torch {
namespace {

using torch::jit::Stack;

/// An op's tensors (and, within it, its scalars) in fixed arrays: the
/// library's bound (an op of more is not registered: bindings()).
constexpr int kMaxArgs = dispatch::kMaxOpArgs;
static_assert(dispatch::kMaxOpScalars <= kMaxArgs, "scalars share the bound");

enum class Kind : uint8_t {
  functional,  ///< reads inputs, returns newly allocated outputs
  out,         ///< writes given outputs (schema: the outputs first, marked (a!)), returns nothing
  inplace,     ///< an op with no pure output: mutates its in-place arguments, returns nothing
};

/// One registered schema: which op, and where each schema parameter goes.
struct Binding {
  const dispatch::OpInfo* op = nullptr;
  std::string ns;      ///< "kdispatch" | "kdispatch_vllm"
  std::string name;    ///< the schema's operator name
  std::string schema;  ///< the full schema text
  Kind kind = Kind::functional;
  bool floor = false;  ///< launch one empty kernel instead of the op
  /// Schema parameter i: a tensor argument (op arg index) or a scalar (op scalar index).
  struct Param {
    bool tensor;
    int index;
  };
  std::vector<Param> params;
  std::vector<int> outputs;  ///< functional: the op args allocated and returned, in order
  /// The scalars a call starts from: each scalar's default, which a
  /// parameter overrides (a vLLM schema may leave one out).
  std::array<float, kMaxArgs> scalar_init{};
};

/// The defaults of `op`'s scalars, by index.
std::array<float, kMaxArgs> scalar_defaults(const dispatch::OpInfo& op) {
  std::array<float, kMaxArgs> d{};
  for (size_t i = 0; i < op.scalars.size() && i < d.size(); ++i) d[i] = op.scalars[i].default_value;
  return d;
}

// ---------------------------------------------------------------- the op list -> schemas

bool pure_output(const dispatch::OpArgInfo& a) { return a.written && !a.read; }
/// An op with an extent that is a formula of the dims (moe_align's sorted
/// ids): a dim of 0 gets no stand-ins (the formula would see 1 and the op
/// compute another routing); the library answers the real call.
bool any_computed(const dispatch::OpInfo& op) {
  for (const dispatch::OpArgInfo& a : op.args)
    if (a.cols_computed) return true;
  return false;
}

std::string float_text(float v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos &&
      s.find("nan") == std::string::npos)
    s += ".";  // "1" -> "1.": a float default in the schema grammar
  return s;
}

// "Tensor(a!) y" / "Tensor x" / "Tensor? bias=None" / "float eps=1e-06" /
// "bool fast_accum=False" (a switch: its default keeps older calls working).
std::string param_text(const dispatch::OpInfo& op, const Binding::Param& p, const std::string& name, char* alias,
                       bool defaults) {
  if (!p.tensor) {
    const dispatch::OpScalarInfo& s = op.scalars[static_cast<size_t>(p.index)];
    if (s.kind == "bool")
      return "bool " + name + (defaults ? std::string("=") + (s.default_value != 0.f ? "True" : "False") : "");
    if (s.kind == "int")  // a size (moe_align's num_experts, block_size)
      return "int " + name + (defaults ? "=" + std::to_string(static_cast<int64_t>(s.default_value)) : "");
    return "float " + name + (defaults ? "=" + float_text(s.default_value) : "");
  }
  const dispatch::OpArgInfo& a = op.args[static_cast<size_t>(p.index)];
  if (a.written) return std::string("Tensor(") + (*alias)++ + "!) " + name;
  if (a.optional) return "Tensor? " + name + "=None";  // trailing in every schema
  return "Tensor " + name;
}

Binding make_binding(const dispatch::OpInfo& op, Kind kind, bool floor) {
  Binding b;
  b.op = &op;
  b.ns = "kdispatch";
  b.kind = kind;
  b.floor = floor;
  b.scalar_init = scalar_defaults(op);
  const std::string base(op.name);
  b.name = (floor ? "_floor_" : "") + base + (kind == Kind::out ? "_out" : kind == Kind::inplace ? "_" : "");
  // Parameters: (out: the pure outputs first), then every argument the op
  // reads, in the op's order, then the scalars.
  if (kind == Kind::out)
    for (size_t i = 0; i < op.args.size(); ++i)
      if (pure_output(op.args[i])) b.params.push_back({true, static_cast<int>(i)});
  for (size_t i = 0; i < op.args.size(); ++i) {
    if (pure_output(op.args[i])) {
      if (kind == Kind::functional) b.outputs.push_back(static_cast<int>(i));
      continue;
    }
    b.params.push_back({true, static_cast<int>(i)});
  }
  for (size_t i = 0; i < op.scalars.size(); ++i) b.params.push_back({false, static_cast<int>(i)});
  char alias = 'a';
  std::string s = b.name + "(";
  for (size_t i = 0; i < b.params.size(); ++i) {
    const Binding::Param& p = b.params[i];
    const std::string name(p.tensor ? op.args[static_cast<size_t>(p.index)].name
                                    : op.scalars[static_cast<size_t>(p.index)].name);
    s += (i ? ", " : "") + param_text(op, p, name, &alias, true);
  }
  s += ") -> ";
  if (b.outputs.empty())
    s += "()";
  else if (b.outputs.size() == 1)
    s += "Tensor";
  else {
    s += "(";
    for (size_t i = 0; i < b.outputs.size(); ++i) s += i ? ", Tensor" : "Tensor";
    s += ")";
  }
  b.schema = s;
  return b;
}

/// vLLM's ops (csrc/torch_bindings.cpp), by name and argument order: which
/// kdispatch op, and the op's argument or scalar behind each parameter.
struct VllmOp {
  const char* name;
  const char* op;
  std::array<std::pair<const char*, const char*>, 8> params;  // (vLLM's name, the op's name)
};
constexpr VllmOp kVllmOps[] = {
    {"rms_norm", "rmsnorm", {{{"out", "y"}, {"input", "x"}, {"weight", "w"}, {"epsilon", "eps"}}}},
    {"fused_add_rms_norm",
     "fused_add_rmsnorm",
     {{{"input", "x"}, {"residual", "residual"}, {"weight", "w"}, {"epsilon", "eps"}}}},
    {"silu_and_mul", "silu_and_mul", {{{"out", "out"}, {"input", "x"}}}},
    // csrc/moe/torch_bindings.cpp: moe_sum(Tensor input, Tensor! output) -> ()
    {"moe_sum", "moe_sum", {{{"input", "input"}, {"output", "out"}}}},
    // csrc/moe/torch_bindings.cpp: moe_align_block_size(Tensor topk_ids, int
    // num_experts, int block_size, Tensor! sorted_token_ids, Tensor!
    // experts_ids, Tensor! num_tokens_post_pad, Tensor? maybe_expert_map) -> ()
    // (maybe_expert_map came later: None by default here, for both forms).
    {"moe_align_block_size",
     "moe_align",
     {{{"topk_ids", "topk_ids"},
       {"num_experts", "num_experts"},
       {"block_size", "block_size"},
       {"sorted_token_ids", "sorted_token_ids"},
       {"experts_ids", "expert_ids"},
       {"num_tokens_post_pad", "num_tokens_post_pad"},
       {"maybe_expert_map", "expert_map"}}}},
};

bool vllm_binding(const VllmOp& v, Binding* out) {
  const dispatch::OpInfo* op = nullptr;
  for (const dispatch::OpInfo& o : dispatch::op_list())
    if (o.name == v.op) op = &o;
  if (op == nullptr) return false;
  Binding b;
  b.op = op;
  b.ns = "kdispatch_vllm";
  b.name = v.name;
  b.kind = Kind::out;
  b.scalar_init = scalar_defaults(*op);
  char alias = 'a';
  std::string s = b.name + "(";
  for (const auto& [theirs, ours] : v.params) {
    if (theirs == nullptr) break;
    Binding::Param p{true, -1};
    for (size_t i = 0; i < op->args.size(); ++i)
      if (op->args[i].name == ours) p = {true, static_cast<int>(i)};
    for (size_t i = 0; i < op->scalars.size() && p.index < 0; ++i)
      if (op->scalars[i].name == ours) p = {false, static_cast<int>(i)};
    if (p.index < 0) return false;
    s += (b.params.empty() ? "" : ", ") + param_text(*op, p, theirs, &alias, false);
    b.params.push_back(p);
  }
  // Every tensor argument, and scalars where vLLM's schema has them (the
  // others keep their defaults); else the op changed: no binding.
  size_t tensors = 0;
  for (const Binding::Param& p : b.params) tensors += p.tensor ? 1 : 0;
  if (tensors != op->args.size()) return false;
  b.schema = s + ") -> ()";
  *out = std::move(b);
  return true;
}

const std::vector<Binding>& bindings() {
  static const std::vector<Binding> all = [] {
    std::vector<Binding> v;
    for (const dispatch::OpInfo& op : dispatch::op_list()) {
      if (op.args.size() > kMaxArgs || op.scalars.size() > kMaxArgs) {  // a library newer than this header
        std::fprintf(stderr, "kdispatch torch ops: %.*s has more than %d tensors or scalars; not registered\n",
                     static_cast<int>(op.name.size()), op.name.data(), kMaxArgs);
        continue;
      }
      bool has_out = false, computed = false;
      for (const dispatch::OpArgInfo& a : op.args) has_out = has_out || pure_output(a);
      for (const dispatch::OpArgInfo& a : op.args) computed = computed || (pure_output(a) && a.cols_computed);
      for (bool floor : {false, true}) {
        if (has_out) {
          // An output whose size is a formula (moe_align's): the caller allocates it.
          if (!computed) v.push_back(make_binding(op, Kind::functional, floor));
          v.push_back(make_binding(op, Kind::out, floor));
        } else {
          v.push_back(make_binding(op, Kind::inplace, floor));
        }
      }
    }
    for (const VllmOp& o : kVllmOps) {
      Binding b;
      if (vllm_binding(o, &b)) v.push_back(std::move(b));
    }
    return v;
  }();
  return all;
}

// ---------------------------------------------------------------- errors

const char* code_name(int code) {
  switch (code) {
    case 1: return "invalid_argument";
    case 2: return "unsupported_problem";
    case 3: return "unsupported_device";
    case 6: return "backend_error";
    case 9: return "internal";
    case 11: return "failed_precondition";
    default: return "error";
  }
}

/// Raises the torch error of a kdispatch status code: "<ns>::<op>: <msg>"
/// (msg from kdispatch already starts with the code's name).
[[noreturn]] void raise(const Binding& b, int code, const std::string& msg) {
  const std::string text = b.ns + "::" + b.name + ": " + msg;
  switch (code) {
    case 1:  // invalid_argument
      TORCH_CHECK_VALUE(false, text);
    case 2:  // unsupported_problem
    case 3:  // unsupported_device
      TORCH_CHECK_NOT_IMPLEMENTED(false, text);
    default: TORCH_CHECK(false, text);
  }
}

/// Raises an error this library finds itself: "<ns>::<op>: <code name>: <msg>".
[[noreturn]] void fail(const Binding& b, int code, const std::string& msg) {
  raise(b, code, std::string(code_name(code)) + ": " + msg);
}

// ---------------------------------------------------------------- interpreter exit

// Set by kdispatch.torch_ops' atexit handler (kdispatch_torch_park_at_exit):
// from then on a call on any thread but the exiting one never returns. Torch
// runs these ops with the GIL released (torch's gil_scoped_release), and a
// daemon thread that takes the GIL back after the interpreter started to
// finalize ends in pthread_exit, whose forced unwind through that noexcept
// destructor is std::terminate (SIGABRT at exit). Parked here, without the
// GIL, the thread never takes it back: the process exits around it.
std::atomic<bool> g_parking{false};
std::atomic<pthread_t> g_exiting_thread{};

void park_if_exiting() {
  if (!g_parking.load(std::memory_order_acquire)) [[likely]]
    return;
  if (pthread_equal(pthread_self(), g_exiting_thread.load(std::memory_order_acquire))) return;
  for (;;) ::pause();
}

// ---------------------------------------------------------------- the runtime

std::atomic<void*> g_runtime{nullptr};  // a kdispatch_runtime*; null: the default runtime

void* runtime(const Binding& b) {
  void* rt = g_runtime.load(std::memory_order_acquire);
  if (rt != nullptr) return rt;
  static char error[512];
  static void* const def = default_runtime(error, sizeof error);
  if (def == nullptr) raise(b, 5, std::string("the default runtime (KDISPATCH_* environment): ") + error);
  return def;
}

thread_local Served t_served;

std::tuple<int64_t, std::string, int64_t, int64_t, bool> last_info_op() {
  const Served s = t_served;
  return {s.source, s.variant, s.table_m, static_cast<int64_t>(s.source_id), s.tuned_now};
}

std::string library_path_op() { return library_path(); }

// The gemm workspace of a (runtime, device, stream): kdispatch's own device
// memory (never from torch's allocator, so never from a graph's private
// pool), attached on the stream's first call — inside a capture too (the
// allocation runs in relaxed capture mode and is not captured, as torch's
// own cuBLAS workspace is allocated there): torch.cuda.graph captures on a
// stream of its own, and a gemm there without a workspace would run another
// cuBLAS kernel than the F.linear it replaces.
void ensure_workspace(void* rt, int32_t dl_type, int32_t dev, void* stream, bool capturing) {
  struct Last {
    void* rt;
    int32_t dev;
    void* stream;
  };
  thread_local Last last{nullptr, -1, nullptr};
  if (last.rt == rt && last.dev == dev && last.stream == stream) return;
  (void)capturing;
  static std::mutex mu;
  static std::set<std::tuple<void*, int32_t, void*>> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (seen.insert({rt, dev, stream}).second)
      (void)attach_stream(rt, dl_type, dev, stream);  // a failure: no workspace
  }
  last = {rt, dev, stream};
}

// ---------------------------------------------------------------- tensors

/// An op whose inputs are all fp8 (the fp8 GEMMs) or whose outputs are fp8
/// by default (the quantisation ops).
[[maybe_unused]] bool takes_or_returns_fp8(const dispatch::OpInfo& op) {
  bool all_fp8 = !op.in_dtypes.empty();
  for (std::string_view t : op.in_dtypes) all_fp8 = all_fp8 && t.starts_with("fp8_");
  return all_fp8 || op.default_out_dtype.starts_with("fp8_");
}

/// The DLPack dtype of a torch dtype kdispatch has a DType for; false for
/// the rest (refused here, naming the argument, before kdispatch sees it).
bool dl_dtype(at::ScalarType s, View* v) {
  switch (s) {
    case at::kFloat: v->code = 2, v->bits = 32; return true;
    case at::kHalf: v->code = 2, v->bits = 16; return true;
    case at::kBFloat16: v->code = 4, v->bits = 16; return true;
    case at::kInt: v->code = 0, v->bits = 32; return true;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    // DLPack 1.1's fp8 codes (dispatch/dlpack.hpp): ops that take fp8 say so
    // in their dtype rules; the others refuse them naming the argument.
    case at::kFloat8_e4m3fn: v->code = 10, v->bits = 8; return true;
    case at::kFloat8_e5m2: v->code = 12, v->bits = 8; return true;
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
    case at::kFloat8_e4m3fnuz: v->code = 11, v->bits = 8; return true;
#endif
    default: return false;
  }
}

/// A size as a call reads it: int64_t from real tensors; c10::SymInt in a
/// meta call, where torch.compile's dynamic shapes arrive as symbols (read
/// as an int, a symbolic M would be specialized: one graph per M).
template <class I>
I size_at(const at::Tensor& t, int64_t d);
template <>
int64_t size_at<int64_t>(const at::Tensor& t, int64_t d) {
  return t.size(d);
}
template <>
c10::SymInt size_at<c10::SymInt>(const at::Tensor& t, int64_t d) {
  return t.sym_size(d < 0 ? d + t.dim() : d);
}
std::string size_text(int64_t v) { return std::to_string(v); }
std::string size_text(const c10::SymInt& v) {  // no operator<<: torch 2.x declares none beside SymInt
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (const std::optional<int64_t> i = v.maybe_as_int()) return std::to_string(*i);
#else
  if (!v.is_symbolic()) return std::to_string(v.expect_int());
#endif
  return "a symbolic size";
}

/// A functional op's output `a` allocated beside `lead` (its first 2-D
/// input): the input's dtype, except "out" arguments of an op with a
/// default output dtype (the fp8 GEMMs: bf16, what engines run them into;
/// the quantisation ops: float8_e4m3fn) and fixed-dtype arguments (fp32
/// scales).
at::TensorOptions output_options(const at::Tensor& lead, const dispatch::OpInfo& op, const dispatch::OpArgInfo& a) {
  at::TensorOptions o = lead.options();
  if (a.dtype == "fp32") return o.dtype(at::kFloat);
  if (a.dtype != "out" || op.default_out_dtype.empty()) return o;
  if (op.default_out_dtype == "bf16") return o.dtype(at::kBFloat16);
  if (op.default_out_dtype == "fp16") return o.dtype(at::kHalf);
  if (op.default_out_dtype == "fp32") return o.dtype(at::kFloat);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (op.default_out_dtype == "fp8_e4m3fn") return o.dtype(at::kFloat8_e4m3fn);
#endif
  return o;  // a dtype this torch lacks: the call then names it
}

/// The sizes of `t` as [rows, cols]: the leading dims multiplied.
template <class I = int64_t>
I rows_of(const at::Tensor& t) {
  I r = I(1);
  for (int64_t d = 0; d + 1 < t.dim(); ++d) r = r * size_at<I>(t, d);
  return r;
}

/// `t` ([..., cols]) as a [rows, cols] view; false when its leading dims do
/// not collapse into one row stride.
bool rows_view(const at::Tensor& t, View* v) {
  const int64_t nd = t.dim();
  const int64_t cols = t.size(nd - 1);
  v->ndim = 2;
  v->shape[1] = cols;
  v->strides[1] = t.stride(nd - 1);
  if (nd == 2) {
    v->shape[0] = t.size(0);
    v->strides[0] = t.stride(0);
    return true;
  }
  const int64_t rows = rows_of(t);
  v->shape[0] = rows;
  v->strides[0] = cols;  // no rows, or one: the contiguous stride
  if (rows <= 1) return true;
  int64_t stride = -1, expect = 0;
  for (int64_t d = nd - 2; d >= 0; --d) {
    const int64_t n = t.size(d);
    if (n == 1) continue;
    if (stride < 0)
      stride = t.stride(d);
    else if (t.stride(d) != expect)
      return false;
    expect = t.stride(d) * n;
  }
  v->strides[0] = stride;
  return true;
}

// The shortest text that reads back as d (0.99999999999 is not "1").
std::string double_text(double d) {
  char buf[40];
  for (int digits = 9; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  return buf;
}

template <class I = int64_t>
std::string sizes_text(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + size_text(size_at<I>(t, d));
  return s + "]";
}

/// The op's dims ("M", "K", "d", ...) bound from the tensors it reads
/// (I: int64_t, or c10::SymInt in a meta call).
template <class I>
struct DimsT {
  std::array<std::string_view, 16> name{};
  std::array<I, 16> value{};
  std::array<const char*, 16> from{};  // the argument that gave it
  int n = 0;
  const I* find(std::string_view d) const {
    for (int i = 0; i < n; ++i)
      if (name[static_cast<size_t>(i)] == d) return &value[static_cast<size_t>(i)];
    return nullptr;
  }
  void bind(const Binding& b, const dispatch::OpArgInfo& a, std::string_view dim, int32_t mul, int32_t div,
            const I& size) {
    if (dim.empty() || div != 1 || find(dim) != nullptr || n == 16) return;
    if (mul != 1 && size % I(mul) != 0)  // x [..., 2*d] with an odd last dim: no d (refused even when empty)
      fail(b, 1,
           std::string(a.name) + ": size " + size_text(size) + " is not " + std::to_string(mul) + "*" +
               std::string(dim) + " (a multiple of " + std::to_string(mul) + ")");
    name[static_cast<size_t>(n)] = dim;
    from[static_cast<size_t>(n)] = a.name.data();
    value[static_cast<size_t>(n++)] = mul == 1 ? size : size / I(mul);
  }
  /// A dim a scalar gives (top_k), before any tensor binds it.
  void seed(std::string_view dim, const I& v, const char* scalar) {
    if (find(dim) != nullptr || n == 16) return;
    name[static_cast<size_t>(n)] = dim;
    from[static_cast<size_t>(n)] = scalar;
    value[static_cast<size_t>(n++)] = v;
  }
  /// The extent `mul * dim / div` (rounded up); none when the dim is
  /// unbound. No dim ("": quant_fp8_tensor's scale [1]) is 1.
  std::optional<I> extent(std::string_view dim, int32_t mul, int32_t div) const {
    const I one(1);
    const I* v = dim.empty() ? &one : find(dim);
    if (v == nullptr) return std::nullopt;
    const I x = mul == 1 ? *v : *v * I(mul);
    if (div == 1) return x;
    return (x + I(div - 1)) / I(div);
  }
  bool has_zero_except(std::string_view m) const {
    for (int i = 0; i < n; ++i)
      if (value[static_cast<size_t>(i)] == 0 && name[static_cast<size_t>(i)] != m) return true;
    return false;
  }
};
using Dims = DimsT<int64_t>;

// ---------------------------------------------------------------- the kernels

enum class Mode : uint8_t { run, meta, autograd };

class Kernel final : public c10::OperatorKernel {
 public:
  Kernel(const Binding* b, Mode mode) : b_(b), mode_(mode), name_(b->op->name) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet ks, Stack* stack) {
    if (mode_ == Mode::autograd) return autograd(handle, ks, stack);
    if (mode_ == Mode::meta) return call<c10::SymInt>(stack);
    try {
      call<int64_t>(stack);
    } catch (...) {
      park_if_exiting();
      throw;
    }
    park_if_exiting();
  }

 private:
  using Tensors = std::array<const at::Tensor*, kMaxArgs>;

  void autograd(const c10::OperatorHandle& handle, c10::DispatchKeySet ks, Stack* stack) {
    if (c10::GradMode::is_enabled()) {
      for (const c10::IValue& v : torch::jit::last(*stack, b_->params.size()))
        if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad())
          fail(*b_, 11,
               "kdispatch ops are inference-only: an argument requires grad (run under torch.no_grad() or "
               "torch.inference_mode(), or detach it)");
    }
    handle.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
  }

  std::string arg(size_t i) const { return std::string(b_->op->args[i].name); }

  /// One call: I is int64_t for a real call, c10::SymInt for a meta call
  /// (shapes and dtypes only; symbolic sizes stay symbols).
  template <class I>
  void call(Stack* stack) {
    const Binding& b = *b_;
    const dispatch::OpInfo& op = *b.op;
    const size_t nparams = b.params.size();
    const size_t nargs = op.args.size();
    if (mode_ == Mode::run) t_served = Served{};
#if !(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))
    // fp8 in or out: no tensor of this torch can hold it (else the call
    // would go on with float32 and end in "no cpu variant ... fp32").
    if (takes_or_returns_fp8(op))
      fail(b, 2,
           "this torch (" TORCH_VERSION ") has no float8 dtype (torch.float8_e4m3fn came with torch 2.1): " +
               std::string(op.name) + " takes or returns float8 tensors");
#endif
    Tensors t{};
    std::array<float, kMaxArgs> scalars = b.scalar_init;
    auto in = torch::jit::last(*stack, nparams);
    for (size_t i = 0; i < nparams; ++i) {
      const Binding::Param& p = b.params[i];
      const size_t k = static_cast<size_t>(p.index);
      const c10::IValue& v = in[i];
      if (!p.tensor) {
        if (v.isBool()) {  // a switch (fast_accum): 0 or 1 to kdispatch
          scalars[k] = v.toBool() ? 1.f : 0.f;
          continue;
        }
        if (v.isInt()) {  // a size: exact in a float32 up to 2^24, else refused by the op as -1
          const int64_t x = v.toInt();
          scalars[k] = x >= -(int64_t{1} << 24) && x <= (int64_t{1} << 24) ? static_cast<float>(x) : -1.f;
          continue;
        }
        const double d = v.toDouble();
        const float f = static_cast<float>(d);
        if (std::isfinite(d) && d != 0.0 && (f == 0.0f || !std::isfinite(f)))
          fail(b, 1,
               std::string(op.scalars[k].name) + ": " + double_text(d) +
                   " is not representable as a float32 (kdispatch's scalars are float32)");
        // A choice's index (schema float) a float32 would round to a label
        // (0.999999999 to 1): refused here; one it holds goes on (named there).
        if (op.scalars[k].kind == "choice" && d != std::trunc(d) && f == std::trunc(f))
          fail(b, 1, std::string(op.scalars[k].name) + ": must be a whole number, got " + double_text(d));
        scalars[k] = f;
      } else if (v.isTensor() && v.toTensor().defined()) {
        t[k] = &v.toTensor();
      } else if (!op.args[k].optional) {
        fail(b, 1, arg(k) + ": a tensor is required, got None");
      }
    }
    // One device for every tensor (a meta tensor beside a CPU one brings
    // the call here, to the meta kernel: refused, as torch's ops refuse it).
    const at::Tensor* first = nullptr;
    size_t first_i = 0;
    for (size_t i = 0; i < nargs; ++i) {
      if (t[i] == nullptr) continue;
      if (first == nullptr) {
        first = t[i], first_i = i;
      } else if (t[i]->device() != first->device()) {
        fail(b, 1,
             arg(i) + ": on " + t[i]->device().str() + ", while " + arg(first_i) + " is on " + first->device().str() +
                 " (every tensor of a call on one device)");
      }
    }
    // Dims from the tensors the op reads; the first 2-D one gives an
    // output's leading dims, the first one its dtype and device.
    DimsT<I> dims;
    seed_dim_scalars(scalars, &dims);
    const at::Tensor* lead = nullptr;
    const at::Tensor* like = nullptr;
    for (size_t i = 0; i < nargs; ++i) {
      const dispatch::OpArgInfo& a = op.args[i];
      const at::Tensor* x = t[i];
      if (x == nullptr || pure_output(a)) continue;
      if (x->dim() < 1) fail(b, 1, arg(i) + ": must have at least one dimension");
      if (like == nullptr) like = x;
      if (a.rank == 3) {  // [batch, rows, cols] as it is (experts' weights [E, N, K])
        if (x->dim() != 3) fail(b, 1, arg(i) + ": must be 3-D, got " + std::to_string(x->dim()) + "-D");
        dims.bind(b, a, a.batch_dim, a.batch_mul, a.batch_div, size_at<I>(*x, 0));
        dims.bind(b, a, a.rows_dim, a.rows_mul, a.rows_div, size_at<I>(*x, 1));
      }
      if (a.rank == 2) {
        if (lead == nullptr) lead = x;
        dims.bind(b, a, a.rows_dim, a.rows_mul, a.rows_div, rows_of<I>(*x));
      }
      dims.bind(b, a, a.cols_dim, a.cols_mul, a.cols_div, size_at<I>(*x, -1));
    }
    std::array<at::Tensor, kMaxArgs> made;
    if (b.kind == Kind::functional) {
      if (like == nullptr) fail(b, 9, "no input gives the outputs' dtype and device");
      for (int o : b.outputs) {
        const dispatch::OpArgInfo& a = op.args[static_cast<size_t>(o)];
        c10::SmallVector<I, 6> shape;  // no heap allocation for up to 6 dims
        // Rows of M (y [M, N]): the lead input's leading dims, so [B, T, K]
        // in gives [B, T, N] out. Rows of another dim (quant_fp8_group's
        // scale [ceil(K/128), M]), or of M read from a 3-D input only
        // (moe_sum's input [M, top_k, hidden]): that dim's extent. Rank 3
        // (moe_gemm's out [M, top_k, N]): its batch and rows extents.
        if (a.rank == 3) {
          const std::optional<I> batch = dims.extent(a.batch_dim, a.batch_mul, a.batch_div);
          if (!batch) fail(b, 9, "the size of dim " + std::string(a.batch_dim) + " is not given by any input");
          shape.push_back(*batch);
        }
        if (a.rank == 2 && lead != nullptr && a.rows_dim == op.m_name && a.rows_mul == 1 && a.rows_div == 1) {
          for (int64_t d = 0; d + 1 < lead->dim(); ++d) shape.push_back(size_at<I>(*lead, d));
        } else if (a.rank >= 2) {
          const std::optional<I> rows = dims.extent(a.rows_dim, a.rows_mul, a.rows_div);
          if (!rows) fail(b, 9, "the size of dim " + std::string(a.rows_dim) + " is not given by any input");
          shape.push_back(*rows);
        }
        const std::optional<I> cols = dims.extent(a.cols_dim, a.cols_mul, a.cols_div);
        if (!cols) fail(b, 9, "the size of dim " + std::string(a.cols_dim) + " is not given by any input");
        shape.push_back(*cols);
        const at::TensorOptions opts = output_options(*like, op, a);
        if constexpr (std::is_same_v<I, int64_t>)
          made[static_cast<size_t>(o)] = at::empty(shape, opts);
        else
          made[static_cast<size_t>(o)] = at::empty_symint(shape, opts);
        t[static_cast<size_t>(o)] = &made[static_cast<size_t>(o)];
      }
    }
    // Arguments the call updates: an inference tensor only inside
    // inference mode (as torch's in-place ops); version counters bumped.
    for (size_t i = 0; i < nargs; ++i)
      if (t[i] != nullptr && op.args[i].written && made[i].defined() == false && t[i]->is_inference() &&
          !c10::InferenceMode::is_enabled())
        fail(b, 11,
             arg(i) +
                 ": an inference tensor cannot be updated in place outside torch.inference_mode() "
                 "(clone it first)");
    if constexpr (!std::is_same_v<I, int64_t>) {
      check_shapes(t, dims);  // the checks a meta call can make: shapes and dtypes (inputs first)
      for (int pass = 0; pass < 2; ++pass)
        for (size_t i = 0; i < nargs; ++i) {
          View v;
          if (t[i] != nullptr && pure_output(op.args[i]) == (pass == 1) && !dl_dtype(t[i]->scalar_type(), &v))
            dtype_error(i, *t[i]);
        }
    } else if (dims.has_zero_except(op.m_name) && !any_computed(op)) {
      empty_dim_call(t, scalars, dims);
    } else {
      launch(t, scalars);
    }
    for (size_t i = 0; i < nargs; ++i)
      if (t[i] != nullptr && op.args[i].written && !made[i].defined() && !t[i]->is_inference())
        t[i]->unsafeGetTensorImpl()->bump_version();
    torch::jit::drop(*stack, nparams);
    for (int o : b.outputs) torch::jit::push(*stack, std::move(made[static_cast<size_t>(o)]));
  }

  /// The dims an "int" scalar sets (moe_gemm's top_k, block_size), bound
  /// before any tensor's, as kdispatch binds them: a meta call then checks
  /// the tensors against them (topk_weights [M, 2] with top_k 3 refused
  /// naming topk_weights), and a functional call's outputs take them. A
  /// value kdispatch would refuse is refused here in its words (a meta call
  /// reaches no kdispatch check).
  template <class I>
  void seed_dim_scalars(const std::array<float, kMaxArgs>& scalars, DimsT<I>* dims) const {
    const dispatch::OpInfo& op = *b_->op;
    for (size_t k = 0; k < op.scalars.size(); ++k) {
      const dispatch::OpScalarInfo& s = op.scalars[k];
      if (s.kind != "int" || s.dim.empty()) continue;
      const float v = scalars[k];
      if (!(v >= 1.f && v <= 16777216.f && v == std::trunc(v)))
        fail(*b_, 1,
             std::string(s.name) + ": must be a whole number in [1, 16777216], got " + double_text(v) +
                 (v == -1.f ? " (an integer size past 2^24 arrives as -1)" : ""));
      dims->seed(s.dim, I(static_cast<int64_t>(v)), s.name.data());
    }
  }

  [[noreturn]] void dtype_error(size_t i, const at::Tensor& x) const {
    fail(
        *b_, 2,
        arg(i) + ": dtype " + std::string(c10::toString(x.scalar_type())) +
            " is not one kdispatch takes (float32, float16, bfloat16, float8_e4m3fn / e4m3fnuz / e5m2 on torch >= 2.1; "
            "int32 where an op reads indices)");
  }

  /// Every tensor's sizes against the bound dims (what kdispatch checks, for
  /// the calls that do not reach it: meta calls, a dim of 0).
  template <class I>
  void check_shapes(const Tensors& t, const DimsT<I>& dims) const {
    const dispatch::OpInfo& op = *b_->op;
    for (size_t i = 0; i < op.args.size(); ++i) {
      const at::Tensor* x = t[i];
      if (x == nullptr) continue;
      const dispatch::OpArgInfo& a = op.args[i];
      const std::optional<I> cols = dims.extent(a.cols_dim, a.cols_mul, a.cols_div);
      if (a.rank == 1) {
        if (x->dim() != 1) fail(*b_, 1, arg(i) + ": must be 1-D, got " + std::to_string(x->dim()) + "-D");
        if (cols && size_at<I>(*x, 0) != *cols)
          fail(*b_, 1, arg(i) + ": must have " + size_text(*cols) + " elements, has " + size_text(size_at<I>(*x, 0)));
        continue;
      }
      if (x->dim() < 1) fail(*b_, 1, arg(i) + ": must have at least one dimension");
      const std::optional<I> rows = dims.extent(a.rows_dim, a.rows_mul, a.rows_div);
      if (a.rank == 3) {
        const std::optional<I> batch = dims.extent(a.batch_dim, a.batch_mul, a.batch_div);
        if (x->dim() != 3) fail(*b_, 1, arg(i) + ": must be 3-D, got " + std::to_string(x->dim()) + "-D");
        if ((batch && size_at<I>(*x, 0) != *batch) || (rows && size_at<I>(*x, 1) != *rows) ||
            (cols && size_at<I>(*x, 2) != *cols))
          fail(*b_, 1,
               arg(i) + ": sizes " + sizes_text<I>(*x) + " are not [" + std::string(a.batch_dim) + ", " +
                   std::string(a.rows_dim) + ", " + std::string(a.cols_dim) + "]");
        continue;
      }
      if ((cols && size_at<I>(*x, -1) != *cols) || (rows && rows_of<I>(*x) != *rows))
        fail(*b_, 1,
             arg(i) + ": sizes " + sizes_text<I>(*x) + " are not [" + (rows ? size_text(*rows) : "?") + " rows, " +
                 (cols ? size_text(*cols) : "?") + "] (" + std::string(a.rows_dim) + ", " + std::string(a.cols_dim) +
                 ")");
    }
  }

  /// A dim other than the batch dim is 0 (gemm's K or N, a hidden of 0):
  /// kdispatch refuses it, torch answers it. The shapes are checked here;
  /// then kdispatch runs on stand-ins where that dim is 1 (zeros for what
  /// it reads, scratch for what it writes) and on the real tensors that do
  /// not span it — so it checks the dtypes, devices, strides and scalars,
  /// and an output that is not empty gets the empty reduction's answer
  /// (gemm with K = 0: zeros plus the bias, as F.linear).
  void empty_dim_call(const Tensors& t, const std::array<float, kMaxArgs>& scalars, const Dims& dims) {
    check_shapes(t, dims);
    const dispatch::OpInfo& op = *b_->op;
    Dims one = dims;
    for (int i = 0; i < one.n; ++i)
      if (one.value[static_cast<size_t>(i)] == 0 && one.name[static_cast<size_t>(i)] != op.m_name)
        one.value[static_cast<size_t>(i)] = 1;
    Tensors u = t;
    std::array<at::Tensor, kMaxArgs> stand_in;
    for (size_t i = 0; i < op.args.size(); ++i) {
      const at::Tensor* x = t[i];
      if (x == nullptr) continue;
      const dispatch::OpArgInfo& a = op.args[i];
      const int64_t cols = one.extent(a.cols_dim, a.cols_mul, a.cols_div).value_or(-1);
      if (a.rank == 3) {  // a stand-in when any of its three extents is the zero dim
        const int64_t bt = one.extent(a.batch_dim, a.batch_mul, a.batch_div).value_or(x->size(0));
        const int64_t rw = one.extent(a.rows_dim, a.rows_mul, a.rows_div).value_or(x->size(1));
        if (x->size(0) == bt && x->size(1) == rw && x->size(2) == cols) continue;
        stand_in[i] = at::zeros({bt, rw, cols}, x->options());
        u[i] = &stand_in[i];
        continue;
      }
      const int64_t rows_one = a.rank == 2 ? one.extent(a.rows_dim, a.rows_mul, a.rows_div).value_or(-1) : 1;
      const int64_t rows = a.rank == 2 ? (rows_one >= 0 ? rows_one : rows_of(*x)) : 1;
      const bool spans = x->size(-1) != cols || (a.rank == 2 && rows_of(*x) != rows);  // the zero dim is in its extents
      if (!spans) continue;
      stand_in[i] = a.rank == 2 ? at::zeros({rows, cols}, x->options()) : at::zeros({cols}, x->options());
      u[i] = &stand_in[i];
    }
    launch(u, scalars);
  }

  void launch(const Tensors& t, const std::array<float, kMaxArgs>& scalars) {
    const Binding& b = *b_;
    const dispatch::OpInfo& op = *b.op;
    const size_t nargs = op.args.size();
    std::array<View, kMaxArgs> views{};
    std::array<at::Tensor, kMaxArgs> copies;  // read inputs whose leading dims do not collapse
    // The inputs first, then the outputs: an unusable dtype is named on
    // the argument the caller passed, not on an output allocated from it.
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < nargs; ++i) {
        const at::Tensor* x = t[i];
        const dispatch::OpArgInfo& a = op.args[i];
        if (x == nullptr || pure_output(a) != (pass == 1)) continue;
        View& v = views[i];
        if (!dl_dtype(x->scalar_type(), &v)) dtype_error(i, *x);
        if (a.rank == 2 && a.col_major_ok && x->dim() == 2 && x->size(1) > 1 && x->stride(1) != 1) {
          // A column-major view the op takes as it is (gemm_fp8_block's
          // K-major scale_a: x_s.t()); the library checks its strides.
          v.ndim = 2;
          for (int64_t d = 0; d < 2; ++d) v.shape[d] = x->size(d), v.strides[d] = x->stride(d);
          v.data = x->data_ptr();
        } else if (a.rank == 2) {
          if (x->size(-1) > 1 && x->stride(-1) != 1)
            fail(b, 1,
                 arg(i) + ": needs unit stride along its last dimension, got stride " + std::to_string(x->stride(-1)));
          if (!rows_view(*x, &v)) {
            if (a.written)
              fail(b, 1,
                   arg(i) + ": the leading dims of a tensor of sizes " + sizes_text(*x) +
                       " do not collapse into rows (a view of rows, as .view(-1, cols) needs)");
            copies[i] = x->reshape({-1, x->size(-1)});
            if (!rows_view(copies[i], &v)) fail(b, 9, arg(i) + ": reshape gave no rows view");
            v.data = copies[i].data_ptr();
          } else {
            v.data = x->data_ptr();
          }
        } else {
          if (x->dim() > 4) fail(b, 1, arg(i) + ": " + std::to_string(x->dim()) + " dims (at most 4)");
          v.ndim = static_cast<int32_t>(x->dim());
          for (int64_t d = 0; d < x->dim(); ++d) v.shape[d] = x->size(d), v.strides[d] = x->stride(d);
          v.data = x->data_ptr();
        }
        if (v.data == nullptr) v.data = reinterpret_cast<void*>(alignof(std::max_align_t));  // present, empty
      }
    }
    const at::Tensor* first = nullptr;
    for (size_t i = 0; i < nargs && first == nullptr; ++i) first = t[i];
    const c10::Device device = first->device();
    if (device.is_cpu()) {
      for (View& v : views) v.device_type = 1, v.device_id = 0;
      run(views, scalars, nullptr, false);
      return;
    }
    const GpuHooks* gpu = gpu_hooks();
    if (!device.is_cuda() || gpu == nullptr)
      fail(b, 3,
           arg(0) + ": tensors on " + device.str() + " are not supported" +
               (device.is_cuda() ? " (libkdispatch_torch was built against a torch without CUDA)" : ""));
    const c10::DeviceGuard guard(device);
    for (size_t i = 0; i < nargs; ++i) {
      if (t[i] == nullptr) continue;
      views[i].device_type = gpu->dl_device_type;
      views[i].device_id = device.index() < 0 ? 0 : device.index();
    }
    void* stream = gpu->current_stream(device.index());
    const bool capturing = gpu->is_capturing(stream);
    if (b.floor) {
      if (!gpu->launch_empty(stream)) fail(b, 6, "the empty kernel did not launch");
      return;
    }
    void* rt = runtime(b);
    if (op.uses_workspace) {
      // More than the stream's attached workspace (fused_moe's tensor-core
      // plans, long prefills): this call's own, from torch's caching
      // allocator on the current stream, so a graph capture takes it from
      // the graph's private pool and keeps it for the graph's replays.
      // (The GEMMs' cuBLASLt and split-K plans take the stream's workspace,
      // as torch's own cuBLAS calls do: no query, nothing per call.)
      const int64_t need = op.name.starts_with("gemm") ? 0 : call_workspace_bytes(views, scalars);
      if (need > kStreamWorkspaceBytes) {
        const at::Tensor ws = at::empty({need}, at::TensorOptions().dtype(at::kByte).device(device));
        run(views, scalars, stream, capturing, rt, ws.data_ptr(), need);
        return;
      }
      ensure_workspace(rt, gpu->dl_device_type, device.index(), stream, capturing);
    }
    run(views, scalars, stream, capturing, rt);
  }

  /// kdispatch_op_workspace_bytes of this call, memoised per thread by the
  /// op, the views' shapes and dtypes and the scalars (a hit: a compare);
  /// 0 when the library refuses the call (the call then says why).
  int64_t call_workspace_bytes(const std::array<View, kMaxArgs>& views, const std::array<float, kMaxArgs>& scalars) {
    struct Memo {
      const Kernel* k = nullptr;
      std::array<int64_t, kMaxArgs * 6> dims{};
      std::array<float, kMaxArgs> scalars{};
      int64_t bytes = 0;
    };
    thread_local std::array<Memo, 8> memo;
    Memo key;
    key.k = this;
    for (size_t i = 0; i < kMaxArgs; ++i) {
      const View& v = views[i];
      const size_t o = i * 6;
      key.dims[o] = v.data == nullptr ? -1 : v.ndim;
      for (size_t d = 0; d < 4; ++d) key.dims[o + 1 + d] = v.shape[d];
      key.dims[o + 5] = (int64_t{v.code} << 8) | v.bits;
    }
    key.scalars = scalars;
    const uint64_t h = std::hash<std::string_view>{}(
        std::string_view(reinterpret_cast<const char*>(key.dims.data()), sizeof key.dims));
    Memo& slot = memo[(h ^ reinterpret_cast<uintptr_t>(this)) % memo.size()];
    if (slot.k == this && slot.dims == key.dims && std::memcmp(&slot.scalars, &key.scalars, sizeof key.scalars) == 0)
      return slot.bytes;
    const Binding& b = *b_;
    const int64_t bytes =
        kdispatch_torch::workspace_bytes(name_.c_str(), views.data(), static_cast<int32_t>(b.op->args.size()),
                                         scalars.data(), static_cast<int32_t>(b.op->scalars.size()));
    key.bytes = bytes < 0 ? 0 : bytes;
    slot = key;
    return key.bytes;
  }

  void run(const std::array<View, kMaxArgs>& views, const std::array<float, kMaxArgs>& scalars, void* stream,
           bool capturing, void* rt = nullptr, void* workspace = nullptr, int64_t workspace_bytes = 0) {
    const Binding& b = *b_;
    if (b.floor) return;  // CPU: the binding's cost only
    if (rt == nullptr) rt = runtime(b);
    char error[1024];
    const int s = kdispatch_torch::call(rt, name_.c_str(), views.data(), static_cast<int32_t>(b.op->args.size()),
                                        scalars.data(), static_cast<int32_t>(b.op->scalars.size()), stream, capturing,
                                        &t_served, error, sizeof error, workspace, workspace_bytes);
    if (s != 0) raise(b, s, error);
  }

  const Binding* b_;
  Mode mode_;
  std::string name_;  ///< the op's name, NUL-terminated for the C ABI
};

torch::CppFunction kernel(const Binding& b, Mode mode) {
  return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(&b, mode));
}

void register_impls(torch::Library& m, const std::string& ns, Mode mode) {
  for (const Binding& b : bindings())
    if (b.ns == ns) m.impl(b.name.c_str(), kernel(b, mode));
}

}  // namespace
}  // namespace kdispatch_torch

// ---------------------------------------------------------------- registrations

/// The runtime the ops use from now on: a kdispatch_runtime* (the C ABI's
/// handle), or null for the default runtime. Not a torch op (an op taking a
/// raw address would let any caller crash the process): kdispatch.torch_ops
/// calls it through ctypes with the handle of a kdispatch.Runtime.
extern "C" __attribute__((visibility("default"))) void kdispatch_torch_set_runtime(void* runtime) {
  kdispatch_torch::g_runtime.store(runtime, std::memory_order_release);
}

/// Called by kdispatch.torch_ops' atexit handler on the exiting thread:
/// calls on other threads park instead of returning (park_if_exiting).
extern "C" __attribute__((visibility("default"))) void kdispatch_torch_park_at_exit(void) {
  kdispatch_torch::g_exiting_thread.store(pthread_self(), std::memory_order_release);
  kdispatch_torch::g_parking.store(true, std::memory_order_release);
}

namespace kt = kdispatch_torch;

TORCH_LIBRARY(kdispatch, m) {
  for (const kt::Binding& b : kt::bindings())
    if (b.ns == "kdispatch") m.def(b.schema.c_str());
  m.def("_last_info() -> (int, str, int, int, bool)", &kt::last_info_op);
  m.def("_library_path() -> str", &kt::library_path_op);
}
TORCH_LIBRARY(kdispatch_vllm, m) {
  for (const kt::Binding& b : kt::bindings())
    if (b.ns == "kdispatch_vllm") m.def(b.schema.c_str());
}
TORCH_LIBRARY_IMPL(kdispatch, CPU, m) { kt::register_impls(m, "kdispatch", kt::Mode::run); }
TORCH_LIBRARY_IMPL(kdispatch, CUDA, m) { kt::register_impls(m, "kdispatch", kt::Mode::run); }
TORCH_LIBRARY_IMPL(kdispatch, Meta, m) { kt::register_impls(m, "kdispatch", kt::Mode::meta); }
TORCH_LIBRARY_IMPL(kdispatch, Autograd, m) { kt::register_impls(m, "kdispatch", kt::Mode::autograd); }
TORCH_LIBRARY_IMPL(kdispatch_vllm, CPU, m) { kt::register_impls(m, "kdispatch_vllm", kt::Mode::run); }
TORCH_LIBRARY_IMPL(kdispatch_vllm, CUDA, m) { kt::register_impls(m, "kdispatch_vllm", kt::Mode::run); }
TORCH_LIBRARY_IMPL(kdispatch_vllm, Meta, m) { kt::register_impls(m, "kdispatch_vllm", kt::Mode::meta); }
TORCH_LIBRARY_IMPL(kdispatch_vllm, Autograd, m) { kt::register_impls(m, "kdispatch_vllm", kt::Mode::autograd); }
