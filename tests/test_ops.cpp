// SPDX-License-Identifier: Apache-2.0
// Tests every op enrols by its row of the op list (core/op_list.hpp,
// src/ops/<op>.hpp), with no test code of its own:
//   - every CPU variant x every config point against the spec's float64
//     reference, on padded layouts, outputs poisoned (unwritten elements and
//     writes past a row are caught);
//   - key text <-> file name <-> Problem round trip;
//   - pretune_key, then a call through call_op hits the tuned row;
//   - the C ABI (kdispatch_op_call) refuses misuse by the spec's roles:
//     NULL, a missing or extra tensor, a bad dtype, a bad stride, a written
//     argument overlapping another.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/numeric.hpp"
#include "core/routing.hpp"
#include "backends/registry.hpp"
#include "dispatch/c_api.h"
#include "dispatch/dispatch.hpp"
#include "dispatch/dlpack.hpp"
#include "ops/specs.hpp"
#include "store/filename.hpp"
#include "table/key.hpp"
#include "test_util.hpp"
#include "tune/search.hpp"

namespace {

using namespace dispatch;
using core::ArgSlot;
using core::Dim;
using core::OpSpec;
using core::Plan;
using core::Problem;
using core::Role;

bool uses_dim(const OpSpec& s, Dim d) {
  for (const ArgSlot& a : s.slots)
    if ((a.rank >= 2 && a.rows.dim == d) || (a.rank == 3 && a.batch.dim == d) || a.cols.dim == d) return true;
  for (const core::ScalarSlot& x : s.scalars)  // a size no tensor carries (moe_align's block_size)
    if (x.kind == core::ScalarKind::dim && x.dim == d) return true;
  return false;
}

// A scalar's value for problem p: a size's (moe_align's block_size) its dim, else the default.
float scalar_of(const core::ScalarSlot& sc, const Problem& p) {
  return sc.kind == core::ScalarKind::dim ? static_cast<float>(core::dim_value(p, sc.dim)) : sc.default_value;
}

bool has_optional(const OpSpec& s) {
  for (const ArgSlot& a : s.slots)
    if (a.optional) return true;
  return false;
}

// Slots given exactly with quantised (fp8) weights (fused_moe's block scales).
bool has_with_quantized(const OpSpec& s) {
  for (const ArgSlot& a : s.slots)
    if (a.with_quantized) return true;
  return false;
}

// The optional slots' presence a problem of input dtype `dt` may have.
bool bias_allowed(const OpSpec& s, DType dt, bool bias) {
  return has_with_quantized(s) ? bias == core::is_quantized(dt) : !bias || has_optional(s);
}

// A problem of `s` with the given sizes (dims the op does not use stay 0).
Problem problem_of(const OpSpec& s, DType dt, int64_t m, int64_t n, int64_t k, bool bias, DType out = DType(255)) {
  Problem p;
  p.op = s.op;
  p.device = Device{DeviceType::cpu, 0};
  p.in_dtype = dt;
  p.out_dtype = out == DType(255) ? dt : out;
  p.m = m;
  p.n = uses_dim(s, Dim::n) ? n : 0;
  p.k = uses_dim(s, Dim::k) ? k : 0;
  // An MoE op's experts and top_k: 4 experts, 2 per token.
  p.extra[0] = uses_dim(s, Dim::extra0) ? 4 : 0;
  p.extra[1] = uses_dim(s, Dim::extra1) ? 2 : 0;
  p.extra[2] = uses_dim(s, Dim::extra2) ? 4 : 0;  // moe_gemm's block_size
  p.has_bias = bias;
  return p;
}

double load(DType t, const std::vector<char>& buf, size_t i) {
  switch (t) {
    case DType::fp32: {
      float f;
      std::memcpy(&f, buf.data() + i * 4, 4);
      return f;
    }
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, buf.data() + i * 2, 2);
      return core::bf16_to_float(h);
    }
    case DType::fp8_e4m3fn: return core::fp8_to_float(static_cast<uint8_t>(buf[i]), core::kE4m3fn);
    case DType::int32: {
      int32_t v;
      std::memcpy(&v, buf.data() + i * 4, 4);
      return v;
    }
    default: return 0.0;
  }
}

void store(DType t, std::vector<char>& buf, size_t i, float v) {
  if (t == DType::fp32) {
    std::memcpy(buf.data() + i * 4, &v, 4);
  } else if (t == DType::fp8_e4m3fn) {
    buf[i] = static_cast<char>(core::float_to_fp8(v, core::kE4m3fn, true));
  } else if (t == DType::int32) {  // an index tensor (moe_align's expert_map): whole values in [-4, 4]
    const auto x = static_cast<int32_t>(std::lround(4.f * v));
    std::memcpy(buf.data() + i * 4, &x, 4);
  } else {
    const uint16_t h = core::float_to_bf16(v);
    std::memcpy(buf.data() + i * 2, &h, 2);
  }
}

// The (input, output) dtype pairs the CPU reference variant of `s` computes
// (fp8 GEMMs: fp8 in, fp32 or bf16 out; the rest one dtype).
std::vector<std::pair<DType, DType>> cpu_dtype_pairs(const OpSpec& s) {
  std::vector<std::pair<DType, DType>> out;
  const DeviceInfo& dev = cpu_device_info();
  for (DType in : {DType::fp32, DType::bf16, DType::fp8_e4m3fn, DType::int32}) {  // int32: moe_align's ids
    const core::VariantDef* ref = core::reference_variant(s.op, DeviceType::cpu, in);
    if (ref == nullptr) continue;
    for (DType o : {in, DType::fp32, DType::bf16, DType::fp8_e4m3fn}) {
      bool seen = false;
      for (const auto& pr : out) seen = seen || pr == std::make_pair(in, o);
      const Problem p = problem_of(s, in, 2, 8, 8, false, o);
      if (!seen && ref->supports(p, nullptr, dev).ok()) out.emplace_back(in, o);
    }
  }
  return out;
}

// One slot's host buffer: rows x cols with row stride ld (padding between rows).
struct SlotBuf {
  bool present = false;
  int64_t rows = 0, cols = 0, ld = 0;
  DType dtype = DType::fp32;
  std::vector<char> bytes;
  std::vector<double> ref;  // the float64 view: inputs as the kernel sees them; outputs from the reference
};

constexpr uint32_t kPoisonWord = 0x7fc0deadu;  // a quiet NaN (fp32); as bf16 pairs: 0xdead, 0x7fc0

std::vector<SlotBuf> make_buffers(const OpSpec& s, const Problem& p, int pad, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<SlotBuf> out(static_cast<size_t>(s.slot_count()));
  for (int i = 0; i < s.slot_count(); ++i) {
    const ArgSlot& a = s.slots[static_cast<size_t>(i)];
    const core::SlotExtent e = core::slot_extent(s, i, p);
    SlotBuf& b = out[static_cast<size_t>(i)];
    b.present = e.present;
    if (!b.present) continue;
    b.rows = e.rows;
    b.cols = e.cols;
    b.ld = a.rank >= 2 ? e.cols + pad : e.cols;
    b.dtype = e.dtype;
    const size_t n = static_cast<size_t>(b.rows * b.ld);
    b.bytes.resize(n * dtype_size(b.dtype));
    for (size_t w = 0; w + 4 <= b.bytes.size(); w += 4) std::memcpy(b.bytes.data() + w, &kPoisonWord, 4);
    b.ref.assign(n, std::nan(""));
    if (a.role == Role::write) continue;  // pure outputs stay poisoned
    if (a.fill == core::Fill::aligned_sorted || a.fill == core::Fill::aligned_experts ||
        a.fill == core::Fill::aligned_total) {
      // moe_align's outputs for one uniform routing of the M * top_k pairs
      // (its own seed: the three slots hold one alignment).
      std::mt19937 pairs_rng(7u + static_cast<uint32_t>(p.m));
      std::vector<int32_t> ids(static_cast<size_t>(p.m * p.extra[1]));
      core::fill_expert_ids(ids.data(), p.m, p.extra[1], p.extra[1], p.extra[0], core::Routing::uniform, pairs_rng);
      std::vector<int32_t> v(static_cast<size_t>(b.cols));
      core::moe_gemm_spec::fill_aligned(a.fill, ids.data(), p, v.data());
      for (int64_t c = 0; c < b.cols; ++c) {
        std::memcpy(b.bytes.data() + c * 4, &v[static_cast<size_t>(c)], 4);
        b.ref[static_cast<size_t>(c)] = v[static_cast<size_t>(c)];
      }
      continue;
    }
    if (a.fill == core::Fill::expert_ids || a.fill == core::Fill::routing_weights) {
      // Routing: top_k distinct experts per token; the last token's last
      // choice -1 (an expert not local under expert parallelism) when there
      // are several tokens.
      std::vector<int32_t> ids(static_cast<size_t>(b.rows * b.ld), 0);
      std::vector<float> w(static_cast<size_t>(b.rows * b.ld), 0.f);
      core::fill_expert_ids(ids.data(), b.rows, b.cols, b.ld, p.extra[0], core::Routing::uniform, rng);
      if (b.rows > 2) ids[static_cast<size_t>((b.rows - 1) * b.ld + b.cols - 1)] = -1;
      core::fill_routing_weights(w.data(), b.rows, b.cols, b.ld, rng);
      for (int64_t r = 0; r < b.rows; ++r)
        for (int64_t c = 0; c < b.cols; ++c) {
          const size_t at = static_cast<size_t>(r * b.ld + c);
          if (a.fill == core::Fill::expert_ids)
            std::memcpy(b.bytes.data() + at * 4, &ids[at], 4);
          else
            store(b.dtype, b.bytes, at, w[at]);
          b.ref[at] = load(b.dtype, b.bytes, at);
        }
      continue;
    }
    for (int64_t r = 0; r < b.rows; ++r)
      for (int64_t c = 0; c < b.cols; ++c) {
        const float x = u(rng);
        const float v = a.fill == core::Fill::near_one ? 1.f + 0.1f * x : a.fill == core::Fill::wide ? 4.f * x : x;
        const size_t at = static_cast<size_t>(r * b.ld + c);
        store(b.dtype, b.bytes, at, v);
        b.ref[at] = load(b.dtype, b.bytes, at);
      }
  }
  return out;
}

std::string plan_text(const Plan& p) { return core::plan_to_string(p); }

}  // namespace

TEST_CASE("every op: every CPU variant and config point agrees with its spec's float64 reference") {
  const DeviceInfo& dev = cpu_device_info();
  std::mt19937 rng(20261201);
  int ops_checked = 0;
  for (const OpSpec* spec : core::all_specs()) {
    CAPTURE(spec->name);
    int points = 0;
    for (const auto& [dt, out_dt] : cpu_dtype_pairs(*spec)) {
      CAPTURE(dtype_name(dt));
      CAPTURE(dtype_name(out_dt));
      struct Shape {
        int64_t m, n, k;
      };
      // {5, 130, 300}: a partial last 128-block along N and K (the fp8 block scales).
      for (const Shape sh : {Shape{1, 1, 1}, Shape{3, 7, 5}, Shape{17, 64, 33}, Shape{4, 100, 9}, Shape{5, 130, 300}}) {
        for (bool bias : {false, true}) {
          if (!bias_allowed(*spec, dt, bias)) continue;
          const Problem p = problem_of(*spec, dt, sh.m, sh.n, sh.k, bias, out_dt);
          // The reference on the inputs, in float64.
          std::vector<SlotBuf> inputs = make_buffers(*spec, p, 3, rng);
          core::RefArgs ra;
          for (int i = 0; i < spec->slot_count(); ++i) ra.ld[i] = inputs[static_cast<size_t>(i)].ld;
          for (size_t j = 0; j < spec->scalars.size(); ++j) ra.scalar[j] = scalar_of(spec->scalars[j], p);
          std::vector<SlotBuf> want = inputs;
          for (int i = 0; i < spec->slot_count(); ++i) {
            SlotBuf& w = want[static_cast<size_t>(i)];
            ra.data[i] = w.present ? w.ref.data() : nullptr;
          }
          spec->reference(p, ra);
          for (const core::VariantDef* v : core::variants_for(spec->op, DeviceType::cpu)) {
            if (v->in_dtype != dt) continue;
            const std::vector<Plan> plans = core::config_space(*v, p, dev);
            for (const Plan& plan : plans) {
              ++points;
              CAPTURE(plan_text(plan));
              CAPTURE(sh.m);
              CAPTURE(sh.n);
              CAPTURE(sh.k);
              CAPTURE(bias);
              std::vector<SlotBuf> run = inputs;
              core::LaunchArgs la;
              for (int i = 0; i < spec->slot_count(); ++i) {
                SlotBuf& b = run[static_cast<size_t>(i)];
                la.data[i] = b.present ? b.bytes.data() : nullptr;
                la.ld[i] = spec->slots[static_cast<size_t>(i)].rank >= 2 ? b.ld : 0;
              }
              for (size_t j = 0; j < spec->scalars.size(); ++j) la.scalar[j] = scalar_of(spec->scalars[j], p);
              REQUIRE(plan.variant->launch(la, p, plan.params).ok());
              for (int i = 0; i < spec->slot_count(); ++i) {
                const ArgSlot& a = spec->slots[static_cast<size_t>(i)];
                const SlotBuf& got = run[static_cast<size_t>(i)];
                if (!got.present || a.role == Role::read) {
                  if (got.present) CHECK(got.bytes == inputs[static_cast<size_t>(i)].bytes);  // inputs untouched
                  continue;
                }
                const SlotBuf& w = want[static_cast<size_t>(i)];
                double scale = 0;
                for (int64_t r = 0; r < got.rows; ++r)
                  for (int64_t c = 0; c < got.cols; ++c)
                    scale = std::max(scale, std::fabs(w.ref[static_cast<size_t>(r * got.ld + c)]));
                const core::Tolerance tol = core::tolerance_of(*spec, p, got.dtype);
                int bad = 0;
                for (int64_t r = 0; r < got.rows; ++r) {
                  for (int64_t c = 0; c < got.ld; ++c) {
                    const size_t at = static_cast<size_t>(r * got.ld + c);
                    if (c >= got.cols) {  // padding: never written
                      const size_t es = dtype_size(got.dtype);
                      bad += std::memcmp(got.bytes.data() + at * es,
                                         inputs[static_cast<size_t>(i)].bytes.data() + at * es, es) != 0;
                      continue;
                    }
                    const double g = load(got.dtype, got.bytes, at), want_v = w.ref[at];
                    if (!(std::fabs(g - want_v) <= tol.atol_rel * scale + tol.rtol * std::fabs(want_v))) {
                      if (bad++ == 0)
                        FAIL_CHECK(a.name << "[" << r << "," << c << "] = " << g << ", reference " << want_v);
                    }
                  }
                }
                CHECK(bad == 0);
              }
            }
          }
        }
      }
    }
    CHECK(points > 0);
    ops_checked += points > 0;
  }
  CHECK(ops_checked == core::kOpCount);
}

TEST_CASE("every op: key text, file name and Problem round trip") {
  for (const OpSpec* spec : core::all_specs()) {
    CAPTURE(spec->name);
    for (DType want_out : {DType::bf16, DType::fp32}) {
      const core::ArgSlot& out_slot = spec->slots[static_cast<size_t>(spec->out_dtype_slot)];
      const DType out = out_slot.dtype == core::SlotDType::fixed ? out_slot.fixed_dtype : want_out;
      bool has_out = false, has_accum = false;
      for (const core::KeyField& f : spec->fields) has_out = has_out || f.kind == core::FieldKind::out_dtype;
      for (const core::KeyField& f : spec->fields) has_accum = has_accum || f.kind == core::FieldKind::accum;
      if (want_out == DType::fp32 && !has_out) continue;
      const core::ArgSlot& in_slot = spec->slots[static_cast<size_t>(spec->in_dtype_slot)];
      const DType in = in_slot.dtype == core::SlotDType::fixed           ? in_slot.fixed_dtype  // moe_align's int32 ids
                       : has_with_quantized(*spec) && out == DType::fp32 ? DType::fp8_e4m3fn
                                                                         : DType::bf16;
      Problem p =
          problem_of(*spec, in, 0, 896, 4864, has_with_quantized(*spec) ? core::is_quantized(in) : has_optional(*spec));
      p.out_dtype = out;
      // Ops with an accumulation field: fast with fp32 out (precise with bf16).
      if (has_accum && out == DType::fp32) p.accum = core::Accum::fast;
      table::KeyBuffer fields;
      table::append_own_fields(p, &fields);
      const std::string name = store::own_file_name(spec->op, fields.view(), "NVIDIA_H200");
      CAPTURE(name);
      auto key = store::parse_file_name(name);
      REQUIRE(key.ok());
      CHECK(key->device_name == "NVIDIA_H200");
      auto back = store::own_problem_from_fields(spec->op, key->fields);
      REQUIRE_MESSAGE(back.ok(), back.status().to_string());
      CHECK(back->n == p.n);
      CHECK(back->k == p.k);
      CHECK(back->extra[0] == p.extra[0]);
      CHECK(back->extra[1] == p.extra[1]);
      CHECK(back->in_dtype == p.in_dtype);
      CHECK(back->out_dtype == p.out_dtype);
      CHECK(back->has_bias == p.has_bias);
      CHECK(back->accum == p.accum);
      CHECK((fields.view().find("accum=fast") != std::string_view::npos) == (p.accum == core::Accum::fast));
      table::KeyBuffer again;
      table::append_own_fields(*back, &again);
      CHECK(again.view() == fields.view());
      // The file name puts the dims first (SGLang's order), then device_name.
      int first_pos = -1;
      for (const core::KeyField& f : spec->fields)
        if (f.file_pos == 0) first_pos = 0;
      if (first_pos == 0) CHECK(name.find(",device_name=") != std::string::npos);
    }
  }
}

TEST_CASE("op_list(): gemm's, silu_and_mul's and gemm_fp8_block's key fields, exactly, with their file-name places") {
  auto fields_of = [](std::string_view op) {
    std::string out;
    for (const OpInfo& o : op_list())
      if (o.name == op)
        for (const OpKeyFieldInfo& f : o.key_fields)
          out += std::string(f.name) + ":" + std::string(f.kind) + ":" +
                 std::string(f.csv_name.empty() ? f.name : f.csv_name) + ":" + std::to_string(f.file_pos) + " ";
    return out;
  };
  // In key-text order (by name); file_pos gives the file name's order.
  CHECK(fields_of("gemm") ==
        "K:dim:K:1 N:dim:N:0 bias:flag:bias:-1 dtype:dtype:dtype:-1 out_dtype:out_dtype:outdtype:-1 "
        "stride:stride:stride:-1 ");
  CHECK(fields_of("silu_and_mul") == "d:dim:d:0 dtype:dtype:dtype:-1 stride:stride:stride:-1 ");
  CHECK(fields_of("gemm_fp8_block") ==
        "K:dim:K:1 N:dim:N:0 accum:accum:accum:-1 bias:flag:bias:-1 dtype:dtype:dtype:-1 "
        "out_dtype:out_dtype:outdtype:-1 stride:stride:stride:-1 ");
  // The places match the file names the library writes: dims first, then device_name.
  Problem p;
  p.op = core::OpKind::gemm;
  p.n = 4096;
  p.k = 7168;
  p.in_dtype = p.out_dtype = DType::bf16;
  table::KeyBuffer kb;
  table::append_own_fields(p, &kb);
  CHECK(store::own_file_name(core::OpKind::gemm, kb.view(), "NVIDIA_H200") ==
        "N=4096,K=7168,device_name=NVIDIA_H200,dtype=bf16.json");
}

// Bindings hold a call's tensors in fixed arrays (libkdispatch_torch's were
// 8 while the fp8_w8a8 ops take 9 and 10: a torch >= 2.1 call wrote past
// them); the bounds they size them by cover every op, the largest exactly.
TEST_CASE("op_list(): every op's tensors and scalars within the bindings' bounds, fused_moe_fp8's 10 the most") {
  static_assert(kMaxOpArgs == KDISPATCH_MAX_OP_TENSORS && kMaxOpScalars == KDISPATCH_MAX_OP_SCALARS);
  size_t most = 0, most_scalars = 0;
  std::string widest;
  for (const OpInfo& o : op_list()) {
    CAPTURE(o.name);
    CHECK(o.args.size() <= size_t{kMaxOpArgs});
    CHECK(o.scalars.size() <= size_t{kMaxOpScalars});
    most_scalars = std::max(most_scalars, o.scalars.size());
    if (o.args.size() > most) most = o.args.size(), widest = std::string(o.name);
  }
  CHECK(most == 10);
  CHECK(widest == "fused_moe_fp8_tensor");
  CHECK(most_scalars == 3);
  // More than the bound: refused by count, never read past.
  std::vector<const DLTensor*> many(KDISPATCH_MAX_OP_TENSORS + 1, nullptr);
  const float scalars[2] = {1.f, 0.f};
  int64_t bytes = 0;
  CHECK(kdispatch_op_workspace_bytes("fused_moe_fp8_tensor", many.data(), static_cast<int32_t>(many.size()), scalars, 2,
                                     &bytes) == KDISPATCH_INVALID_ARGUMENT);
  CHECK(std::string(kdispatch_last_error_message()).find("takes 10 tensors") != std::string::npos);
}

TEST_CASE("every op: pretune_key persists a row, and the same call then hits it") {
  kdtest::TempDir cache;
  RuntimeOptions o;
  o.load_shipped_configs = false;
  o.log_level = LogLevel::off;
  o.tune.cache_dir = cache.str();
  o.tune.cold_cache = false;
  o.tune.time_budget_ms = 20;
  o.tune.reps = 2;
  auto rt = Runtime::create(o).value();
  for (const OpSpec* spec : core::all_specs()) {
    CAPTURE(spec->name);
    const auto pairs = cpu_dtype_pairs(*spec);
    REQUIRE(!pairs.empty());
    const Problem p = problem_of(*spec, pairs[0].first, 3, 16, 24, false, pairs[0].second);
    table::KeyBuffer fields;
    table::append_own_fields(p, &fields);
    auto d = describe_key(spec->name, fields.view(), 3);
    REQUIRE_MESSAGE(d.ok(), d.status().to_string());
    CHECK(d->flops > 0);
    CHECK(d->bytes > 0);
    auto r = pretune_key(*rt, spec->name, d->key_fields, 3);
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    CHECK(r->persisted);
    // The same problem as real tensors through the generic entry point.
    std::vector<std::vector<float>> bufs;
    std::vector<TensorRef> tensors;
    for (int i = 0; i < spec->slot_count(); ++i) {
      const core::SlotExtent e = core::slot_extent(*spec, i, p);
      if (!e.present) {
        tensors.emplace_back();
        continue;
      }
      bufs.emplace_back(static_cast<size_t>(e.rows * e.cols), 0.5f);  // as fp8 bytes: 0x00, 0x3f (finite)
      const ArgSlot& a = spec->slots[static_cast<size_t>(i)];
      tensors.push_back(a.rank == 3   ? kdtest::tensor_3d(bufs.back().data(), e.dtype, a.batch.value(p),
                                                          e.rows / a.batch.value(p), e.cols)
                        : a.rank == 2 ? make_tensor_2d(bufs.back().data(), e.dtype, e.rows, e.cols, e.cols)
                                      : make_tensor_1d(bufs.back().data(), e.dtype, e.cols));
    }
    std::vector<float> scalars;
    for (const core::ScalarSlot& sc : spec->scalars) scalars.push_back(scalar_of(sc, p));
    DispatchInfo info;
    std::string key;
    info.key = &key;
    REQUIRE(call_op(*rt, spec->name, tensors, scalars, {}, {.info = &info}).ok());
    CHECK(info.source == PlanSource::table);
    CHECK(info.table_m == 3);
    CHECK(key == r->key);
  }
}

TEST_CASE("time_configs: given configs validated and timed on scratch, per-config errors, nothing persisted") {
  kdtest::TempDir cache;
  RuntimeOptions o;
  o.load_shipped_configs = false;
  o.log_level = LogLevel::off;
  o.tune.cache_dir = cache.str();
  o.tune.cold_cache = false;
  o.tune.reps = 2;
  auto rt = Runtime::create(o).value();
  auto unit = [](const char* k, int64_t v) { return std::pair{std::string(k), ConfigValue::integer(v)}; };
  const Config ref = {{"variant", ConfigValue::string("rmsnorm_fp32__ref")}};
  const Config vec = {{"variant", ConfigValue::string("rmsnorm_fp32__vec")}, unit("vec", 4), unit("unroll", 1)};
  const Config unknown = {{"variant", ConfigValue::string("rmsnorm_fp32__nope")}};
  const Config other_dtype = {{"variant", ConfigValue::string("rmsnorm_bf16__ref")}};
  const std::vector<Config> configs = {ref, vec, unknown, other_dtype};
  auto r = time_configs(*rt, "rmsnorm", "hidden=256,dtype=fp32", 8, configs, {}, 3);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->key.find("hidden=256") != std::string::npos);
  CHECK(r->device_name == cpu_device_info().device_name);
  CHECK(r->fingerprint.find("\"kernels\"") != std::string::npos);
  REQUIRE(r->configs.size() == 4);
  for (int i : {0, 1}) {
    CAPTURE(i);
    const ConfigTiming& c = r->configs[static_cast<size_t>(i)];
    REQUIRE_MESSAGE(c.status.ok(), c.status.to_string());
    REQUIRE(c.round_us.size() == 3);
    double sum = 0;
    for (double u : c.round_us) {
      CHECK(u > 0);
      sum += u;
    }
    CHECK(c.us == doctest::Approx(sum / 3));
  }
  CHECK(r->configs[2].status.code() == StatusCode::config_error);
  CHECK(r->configs[3].status.code() == StatusCode::unsupported_problem);
  CHECK(r->configs[3].status.message().find("computes bf16, the key is fp32") != std::string::npos);
  int64_t files = 0;  // nothing persisted
  for (const auto& e : std::filesystem::recursive_directory_iterator(cache.str())) files += e.is_regular_file();
  CHECK(files == 0);
  // Errors of the call itself: rounds, the key.
  CHECK(time_configs(*rt, "rmsnorm", "hidden=256,dtype=fp32", 8, configs, {}, 0).status().code() ==
        StatusCode::invalid_argument);
  CHECK(time_configs(*rt, "rmsnorm", "hidden=x", 8, configs).status().code() == StatusCode::invalid_argument);
}

namespace {

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::fp8_e4m3fn: return {kDLPackFloat8_e4m3fn, 8, 1};
    case DType::int32: return {kDLInt, 32, 1};
    default: return {kDLFloat, 32, 1};
  }
}

// A DLTensor over a host matrix (fp32 unless told).
struct Dl {
  DLTensor t{};
  int64_t shape[3] = {0, 0, 0};
  int64_t strides[3] = {0, 1, 1};
  // rank 3: rows = batch * per-matrix rows (batch given), the batch dense.
  Dl(float* data, int64_t rows, int64_t cols, int rank = 2, DType dtype = DType::fp32, int64_t batch = 1) {
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = rank;
    t.dtype = dl_dtype(dtype);
    if (rank == 3) {
      shape[0] = batch, shape[1] = rows / batch, shape[2] = cols;
      strides[0] = (rows / batch) * cols, strides[1] = cols, strides[2] = 1;
    } else if (rank == 2) {
      shape[0] = rows, shape[1] = cols;
      strides[0] = cols, strides[1] = 1;
    } else {
      shape[0] = cols, strides[0] = 1;
    }
    t.shape = shape;
    t.strides = strides;
  }
};

}  // namespace

TEST_CASE("every op: the C ABI refuses misuse by the spec's roles") {
  kdispatch_options opts;
  kdispatch_options_init(&opts);
  opts.load_shipped_configs = 0;
  opts.log_level = KDISPATCH_LOG_OFF;
  kdispatch_runtime* rt = nullptr;
  REQUIRE(kdispatch_runtime_create(&opts, &rt) == KDISPATCH_OK);
  for (const OpSpec* spec : core::all_specs()) {
    CAPTURE(spec->name);
    const std::string name(spec->name);
    const auto pairs = cpu_dtype_pairs(*spec);
    REQUIRE(!pairs.empty());
    const Problem p = problem_of(*spec, pairs[0].first, 4, 8, 8, false, pairs[0].second);
    std::vector<std::vector<float>> bufs;
    std::vector<Dl> dls;
    dls.reserve(static_cast<size_t>(spec->slot_count()));  // no reallocation: a Dl points into itself
    for (int i = 0; i < spec->slot_count(); ++i) {
      const core::SlotExtent e = core::slot_extent(*spec, i, p);
      bufs.emplace_back(static_cast<size_t>(std::max<int64_t>(1, e.rows * e.cols)), 0.25f);
      const ArgSlot& a = spec->slots[static_cast<size_t>(i)];
      dls.emplace_back(bufs.back().data(), e.rows, e.cols, a.rank, e.dtype, a.rank == 3 ? a.batch.value(p) : 1);
    }
    std::vector<const DLTensor*> ptrs;
    for (int i = 0; i < spec->slot_count(); ++i)
      ptrs.push_back(spec->slots[static_cast<size_t>(i)].optional ? nullptr : &dls[static_cast<size_t>(i)].t);
    std::vector<float> scalars;
    for (const core::ScalarSlot& sc : spec->scalars) scalars.push_back(scalar_of(sc, p));
    const int32_t nt = static_cast<int32_t>(ptrs.size()), ns = static_cast<int32_t>(scalars.size());
    auto call = [&](kdispatch_runtime* r, const DLTensor* const* t, int32_t n) {
      return kdispatch_op_call(r, name.c_str(), t, n, scalars.data(), ns, nullptr, 0, nullptr, 0, nullptr);
    };
    // The valid call.
    CHECK(call(rt, ptrs.data(), nt) == KDISPATCH_OK);
    // No runtime; an unknown op; a tensor too few.
    CHECK(call(nullptr, ptrs.data(), nt) == KDISPATCH_INVALID_ARGUMENT);
    CHECK(kdispatch_op_call(rt, "conv9d", ptrs.data(), nt, scalars.data(), ns, nullptr, 0, nullptr, 0, nullptr) ==
          KDISPATCH_INVALID_ARGUMENT);
    CHECK(call(rt, ptrs.data(), nt - 1) == KDISPATCH_INVALID_ARGUMENT);
    CHECK(std::string(kdispatch_last_error_message()).find("takes " + std::to_string(nt) + " tensors") !=
          std::string::npos);
    for (int i = 0; i < spec->slot_count(); ++i) {
      const ArgSlot& a = spec->slots[static_cast<size_t>(i)];
      const std::string an(a.name);
      CAPTURE(an);
      std::vector<const DLTensor*> bad = ptrs;
      if (!a.optional) {
        // NULL where a tensor is required: named.
        bad[static_cast<size_t>(i)] = nullptr;
        CHECK(call(rt, bad.data(), nt) == KDISPATCH_INVALID_ARGUMENT);
        CHECK(std::string(kdispatch_last_error_message()) == an + " is NULL");
      }
      // A dtype no variant computes (int32): unsupported, or named when the
      // argument must match another's dtype.
      Dl wrong = dls[static_cast<size_t>(i)];
      wrong.t.shape = wrong.shape;
      wrong.t.strides = wrong.strides;
      // (An int32 slot, expert ids, gets fp32 instead.)
      wrong.t.dtype = a.dtype == core::SlotDType::fixed && a.fixed_dtype == DType::int32 ? DLDataType{kDLFloat, 32, 1}
                                                                                         : DLDataType{kDLInt, 32, 1};
      bad = ptrs;
      bad[static_cast<size_t>(i)] = &wrong.t;
      const kdispatch_status st = call(rt, bad.data(), nt);
      CHECK((st == KDISPATCH_UNSUPPORTED_PROBLEM || st == KDISPATCH_INVALID_ARGUMENT));
      // A 2-D argument with a non-unit last stride: named (a stride along a
      // dim of one element is no stride at all).
      if (a.rank == 2 && dls[static_cast<size_t>(i)].shape[1] > 1) {
        Dl strided = dls[static_cast<size_t>(i)];
        strided.t.shape = strided.shape;
        strided.t.strides = strided.strides;
        strided.strides[1] = 2;
        bad = ptrs;
        bad[static_cast<size_t>(i)] = &strided.t;
        if (!a.col_major_ok) {
          CHECK(call(rt, bad.data(), nt) == KDISPATCH_INVALID_ARGUMENT);
          CHECK(std::string(kdispatch_last_error_message()).rfind(an + ": needs unit stride", 0) == 0);
        } else if (strided.shape[0] > 1) {
          // A slot also taken column-major (gemm_fp8_block's scale_a): its
          // row stride must then be 1, and the message says so.
          CHECK(call(rt, bad.data(), nt) == KDISPATCH_INVALID_ARGUMENT);
          CHECK(std::string(kdispatch_last_error_message()).rfind(an + ": column-major", 0) == 0);
        }
      }
      // A written 2-D argument on top of another 2-D argument: refused,
      // named (unless the spec allows exactly that in place).
      if (a.role != Role::read && a.rank == 2) {
        for (int j = 0; j < spec->slot_count(); ++j) {
          const ArgSlot& o = spec->slots[static_cast<size_t>(j)];
          if (j == i || o.rank != 2 || o.optional) continue;
          Dl over = dls[static_cast<size_t>(i)];
          over.t.shape = over.shape;
          over.t.strides = over.strides;
          over.t.data = static_cast<float*>(dls[static_cast<size_t>(j)].t.data) + 1;  // partly on top of j
          if (over.shape[0] * over.shape[1] > static_cast<int64_t>(bufs[static_cast<size_t>(j)].size()) - 1) continue;
          bad = ptrs;
          bad[static_cast<size_t>(i)] = &over.t;
          CHECK(call(rt, bad.data(), nt) == KDISPATCH_INVALID_ARGUMENT);
          CHECK(std::string(kdispatch_last_error_message()).find("overlaps") != std::string::npos);
        }
      }
    }
  }
  kdispatch_runtime_destroy(rt);
}
