// SPDX-License-Identifier: Apache-2.0
// The GPU backends, host side: what a CPU-only machine (CI: nvcc, no driver)
// can check of a build with the CUDA/HIP backend compiled in. The device
// side is tests/gpu (kdispatch_gpu_tests).
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "backends/registry.hpp"
#include "ops/specs.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "backends/backend.hpp"
#include "test_util.hpp"

namespace {

using dispatch::Device;
using dispatch::DeviceInfo;
using dispatch::DeviceType;
using dispatch::DType;
using dispatch::core::OpKind;
using dispatch::core::Plan;
using dispatch::core::Problem;
using dispatch::core::VariantDef;

constexpr DeviceType kGpuTypes[] = {DeviceType::cuda, DeviceType::hip};

using kdtest::described;

Problem norm_problem(DeviceType t, OpKind op, DType dt, int64_t tokens, int64_t hidden) {
  Problem p;
  p.op = op;
  p.device = Device{t, 0};
  p.in_dtype = p.out_dtype = dt;
  p.m = tokens;
  p.n = hidden;
  return p;
}

}  // namespace

TEST_CASE("gpu host: a backend compiled in without a usable device says why in one line and refuses GPU tensors") {
  int compiled = 0;
  for (DeviceType t : kGpuTypes) {
    const dispatch::backends::Backend* b = dispatch::backends::find(t);
    CHECK(dispatch::core::backend_compiled(t) == (b != nullptr));
    if (!b) continue;
    ++compiled;
    CHECK(dispatch::core::backend_memory(t) != nullptr);
    const DeviceInfo& st = b->status();
    INFO(dispatch::device_type_name(t), ": ", st.available ? "available" : st.unavailable_reason);
    if (st.available) {
      MESSAGE(dispatch::device_type_name(t), " device present (", st.device_name,
              "): the no-device checks do not apply");
      continue;
    }
    // One line, with the native code (CUDA: 35 no driver, 34 stub, 100 no device; HIP: 100).
    REQUIRE(!st.unavailable_reason.empty());
    CHECK(st.unavailable_reason.find('\n') == std::string::npos);
    CHECK(st.unavailable_reason.find(" error ") != std::string::npos);
    MESSAGE(dispatch::device_type_name(t), " unavailable: ", st.unavailable_reason);
    CHECK(b->device_info(0) == nullptr);
    CHECK(dispatch::core::local_device_info(t) == nullptr);

    auto rt = kdtest::make_runtime(std::vector<std::string>{});
    auto di = rt->device_info(Device{t, 0});
    REQUIRE(!di.ok());
    CHECK(di.status().code() == dispatch::StatusCode::unsupported_device);
    CHECK(di.status().message() == st.unavailable_reason);

    // A GPU tensor is never run on the CPU: unsupported_device, with a message.
    std::vector<uint16_t> x(64 * 8), y(64 * 8), w(64);
    const Device d{t, 0};
    dispatch::RmsNormArgs args{dispatch::make_tensor_2d(y.data(), DType::bf16, 8, 64, 64, d),
                               dispatch::make_tensor_2d(x.data(), DType::bf16, 8, 64, 64, d),
                               dispatch::make_tensor_1d(w.data(), DType::bf16, 64, d), 1e-6f};
    const dispatch::Status s = dispatch::rmsnorm(*rt, args, dispatch::Stream{nullptr});
    CHECK(s.code() == dispatch::StatusCode::unsupported_device);
    CHECK(!s.message().empty());
    dispatch::FusedAddRmsNormArgs fargs{dispatch::make_tensor_2d(x.data(), DType::bf16, 8, 64, 64, d),
                                        dispatch::make_tensor_2d(y.data(), DType::bf16, 8, 64, 64, d),
                                        dispatch::make_tensor_1d(w.data(), DType::bf16, 64, d), 1e-6f};
    CHECK(dispatch::fused_add_rmsnorm(*rt, fargs, dispatch::Stream{nullptr}).code() ==
          dispatch::StatusCode::unsupported_device);
    // Nothing was written.
    for (uint16_t v : y) CHECK(v == 0);
  }
#if KDISPATCH_HAVE_CUDA
  CHECK(dispatch::backends::find(DeviceType::cuda) != nullptr);
#else
  CHECK(dispatch::backends::find(DeviceType::cuda) == nullptr);
#endif
#if KDISPATCH_HAVE_HIP
  CHECK(dispatch::backends::find(DeviceType::hip) != nullptr);
#else
  CHECK(dispatch::backends::find(DeviceType::hip) == nullptr);
#endif
  MESSAGE(compiled, " GPU backend(s) compiled in");
}

TEST_CASE("gpu host: the norm lists are well formed, named per STYLE.md and unique across backends") {
  CHECK(dispatch::core::registry_errors().empty());
  std::set<std::string> names;
  for (const VariantDef* v : dispatch::core::all_variants()) CHECK(names.insert(std::string(v->name)).second);
  for (DeviceType t : kGpuTypes) {
    const dispatch::backends::Backend* b = dispatch::backends::find(t);
    if (!b) continue;
    // Norms: 2 ops x 3 dtypes x (warp, block, generic, reference); silu_and_mul:
    // 3 dtypes x (vec, generic, reference); GEMM: 2 dtypes x (skinny, skinny_mma,
    // tiled, wgmma, cuBLASLt, cuBLAS, reference) on CUDA, (skinny, hipBLASLt, reference) on HIP;
    // the fp8 ops on CUDA only: 3 GEMM layouts x (skinny_mma, cuBLASLt, reference) and 3
    // quantisation layouts x 3 input dtypes x (multiply, division); fused_moe on CUDA: 2
    // dtypes x (pairs, experts, split, mma, wgmma, reference) and block fp8 (split, mma, wgmma, reference),
    // on HIP: 2 dtypes x (hip_pairs, hip_split, hip_ref); moe_sum: 3 dtypes x (vec,
    // generic, reference); moe_align: int32 x (block, reference); moe_gemm: 2 dtypes
    // x (split_vec, split, reference), and on CUDA block fp8, 3 dtypes x ring and
    // 3 dtypes x wgmma; on CUDA moe_gemm_fp8_tensor (split_vec, split, reference,
    // ring, wgmma) and moe_gemm_fp8_channel (the same five);
    // fused_moe_fp8_tensor and _channel on CUDA: (compose, reference) each.
    // A build with KDISPATCH_TEST_OPS=ON adds the test-only family's
    // variants ("__test_" in the name, kernels/cuda/test/), not counted here.
    size_t product = 0;
    for (const VariantDef* v : b->variants())
      product += std::string_view(v->name).find("__test_") == std::string_view::npos;
    CHECK(product == 24u + 9u + 9u + 2u + 6u +
                         (t == DeviceType::cuda ? 14u + 9u + 18u + 16u + 3u + 3u + 3u + 5u + 5u + 2u + 2u : 6u + 6u));
    for (OpKind op : {OpKind::rmsnorm, OpKind::fused_add_rmsnorm}) {
      for (DType dt : {DType::bf16, DType::fp16, DType::fp32}) {
        int refs = 0, n = 0;
        for (const VariantDef* v : dispatch::core::variants_for(op, t)) {
          if (v->in_dtype != dt) continue;
          ++n;
          INFO(v->name);
          const std::string what =
              std::string(dispatch::core::op_name(op)) + "_" + std::string(dispatch::dtype_name(dt)) + "__";
          CHECK(v->name.rfind(what, 0) == 0);
          CHECK(v->backend == t);
          CHECK((v->supports != nullptr && v->launch != nullptr));
          if (v->flags & dispatch::core::kVariantReference) ++refs;
          const uint32_t in_place = (1u << dispatch::core::kFusedArgX) | (1u << dispatch::core::kFusedArgResidual);
          CHECK(v->restore_args == (op == OpKind::fused_add_rmsnorm ? in_place : 0u));
          CHECK(v->reset_args == 0u);
        }
        CHECK(n == 4);
        CHECK(refs == 1);
        const VariantDef* ref = dispatch::core::reference_variant(op, t, dt);
        REQUIRE(ref != nullptr);
        CHECK(ref->params.empty());
      }
    }
  }
#if KDISPATCH_HAVE_CUDA
  for (const char* n :
       {"rmsnorm_bf16__warp_vec8", "rmsnorm_bf16__block_vec8", "rmsnorm_bf16__generic", "rmsnorm_bf16__cuda_ref",
        "fused_add_rmsnorm_fp16__block_vec8", "rmsnorm_fp32__warp_vec4", "fused_add_rmsnorm_fp32__block_vec4"})
    CHECK_MESSAGE(dispatch::core::find_variant(n) != nullptr, n);
#endif
#if KDISPATCH_HAVE_HIP
  CHECK(dispatch::core::find_variant("rmsnorm_bf16__hip_warp_vec8") != nullptr);
  CHECK(dispatch::core::find_variant("fused_add_rmsnorm_bf16__hip_ref") != nullptr);
  // fused_moe's portable decode kernels, bf16 and fp16; no tensor-core or block-fp8 ones.
  for (const char* n : {"fused_moe_bf16__hip_pairs", "fused_moe_fp16__hip_split", "fused_moe_bf16__hip_ref"}) {
    const VariantDef* v = dispatch::core::find_variant(n);
    REQUIRE_MESSAGE(v != nullptr, n);
    CHECK(v->backend == DeviceType::hip);
    CHECK(v->op == OpKind::fused_moe);
  }
  for (const VariantDef* v : dispatch::core::variants_for(OpKind::fused_moe, DeviceType::hip)) {
    INFO(v->name);
    CHECK(v->in_dtype != DType::fp8_e4m3fn);
    CHECK(static_cast<bool>(v->workspace_bytes));
  }
#endif
}

TEST_CASE("gpu host: config spaces keep the points that hold the row in registers, decline the rest with reasons") {
  for (DeviceType t : kGpuTypes) {
    if (!dispatch::backends::find(t)) continue;
    const DeviceInfo dev = described(t);
    const int warp = dev.warp_size;
    // bf16, hidden 4096: 512 16-byte chunks per row.
    const Problem p = norm_problem(t, OpKind::rmsnorm, DType::bf16, 64, 4096);
    for (const VariantDef* v : dispatch::core::variants_for(OpKind::rmsnorm, t)) {
      if (v->in_dtype != DType::bf16) continue;
      INFO(v->name);
      const auto space = dispatch::core::config_space(*v, p, dev);
      const std::string n(v->name);
      if (n.find("warp_vec8") != std::string::npos) {
        // the row fits one warp only at unroll 512/warp; launch bound of that unroll caps rows_per_block
        for (const Plan& pl : space) CHECK(pl.params[1] == 512 / warp);
        // CUDA: unroll 16, launch bound 256 threads: rows_per_block 1..8.
        // HIP (wave64): unroll 8, launch bound 256 threads: rows_per_block 1..4.
        CHECK(space.size() == (warp == 32 ? 4u : 3u));
      } else if (n.find("block_vec8") != std::string::npos) {
        // unroll 1..16 -> 512..32 threads on CUDA; on HIP unroll 16 would
        // leave half of a 64-thread block's chunks empty (declined).
        CHECK(space.size() == (warp == 32 ? 5u : 4u));
      } else if (n.find("generic") != std::string::npos) {
        CHECK(space.size() == 5u);
      } else {
        CHECK(space.size() == 1u);  // the reference: one point
      }
    }
    // Declines say why.
    const Problem odd = norm_problem(t, OpKind::rmsnorm, DType::bf16, 4, 1001);
    const VariantDef* block = dispatch::core::find_variant(t == DeviceType::cuda ? "rmsnorm_bf16__block_vec8"
                                                                                 : "rmsnorm_bf16__hip_block_vec8");
    REQUIRE(block != nullptr);
    const int64_t u2[] = {2, 0};
    const dispatch::Status s = block->supports(odd, u2, dev);
    CHECK(s.code() == dispatch::StatusCode::unsupported_problem);
    CHECK(kdtest::contains(s.message(), "multiple of 8"));
    const Problem fp16 = norm_problem(t, OpKind::rmsnorm, DType::fp16, 4, 4096);
    CHECK(!block->supports(fp16, u2, dev).ok());
    Problem cpu = p;
    cpu.device = Device{};
    CHECK(block->supports(cpu, u2, dev).code() == dispatch::StatusCode::unsupported_device);
  }
}

TEST_CASE("gpu host: get_default gives a supported, non-reference plan on a described device") {
  for (DeviceType t : kGpuTypes) {
    if (!dispatch::backends::find(t)) continue;
    const DeviceInfo dev = described(t);
    for (OpKind op : {OpKind::rmsnorm, OpKind::fused_add_rmsnorm})
      for (DType dt : {DType::bf16, DType::fp16, DType::fp32})
        for (int64_t hidden : {1, 7, 64, 512, 1000, 1001, 2048, 4096, 4104, 5120, 7168, 8192, 16384, 32768, 131072})
          for (int64_t tokens : {1, 16, 128, 1024, 8192, 32768}) {
            const Problem p = norm_problem(t, op, dt, tokens, hidden);
            INFO(dispatch::core::op_name(op), " ", dispatch::dtype_name(dt), " hidden=", hidden, " tokens=", tokens);
            const Plan plan = dispatch::core::get_default(p, dev);
            REQUIRE(plan.valid());
            CHECK(plan.variant->supports(p, plan.params, dev).ok());
            CHECK((plan.variant->flags & dispatch::core::kVariantReference) == 0);
            const std::string n(plan.variant->name);
            if (hidden % (dt == DType::fp32 ? 4 : 8) != 0) CHECK(n.find("generic") != std::string::npos);
          }
    // Few tokens: one block per row, the widest block (latency).
    if (t == DeviceType::cuda) {
      const Plan one = dispatch::core::get_default(norm_problem(t, OpKind::rmsnorm, DType::bf16, 1, 4096), dev);
      CHECK(std::string(one.variant->name) == "rmsnorm_bf16__block_vec8");
      CHECK(one.params[0] == 1);
    }
    // Mixed problems get no plan rather than a wrong one.
    Problem mixed = norm_problem(t, OpKind::rmsnorm, DType::bf16, 4, 4096);
    mixed.out_dtype = DType::fp32;
    CHECK(!dispatch::core::get_default(mixed, dev).valid());
    if (t != DeviceType::cuda) continue;
    // fused_moe: the tensor-core default is staged (the ring kernels) at
    // every pairs-per-expert count it serves; where __mma declines, the split
    // plan has no params and equals its config row (no staged=1 left in params[0]).
    auto moe = [&](DType dt, int64_t M, int64_t E, int64_t top_k, int64_t H, int64_t I) {
      Problem p;
      p.op = OpKind::fused_moe;
      p.device = dispatch::Device{t, 0};
      p.in_dtype = dt;
      p.out_dtype = DType::bf16;
      p.has_bias = dt == DType::fp8_e4m3fn;
      p.m = M, p.k = H, p.n = I, p.extra[0] = E, p.extra[1] = top_k;
      return p;
    };
    struct Want {
      Problem p;
      const char* plan;
    };
    const Want wants[] = {
        {moe(DType::bf16, 16, 8, 2, 2048, 768), "fused_moe_bf16__mma{staged=true,block_m=32}"},  // 4 pairs/expert
        {moe(DType::bf16, 128, 8, 2, 2048, 768),
         "fused_moe_bf16__mma{staged=true,block_m=64}"},                     // 32 pairs/expert: wide
        {moe(DType::bf16, 4, 8, 2, 2048, 768), "fused_moe_bf16__split{}"},   // 1 pair/expert
        {moe(DType::bf16, 16, 8, 2, 2048, 40), "fused_moe_bf16__split{}"},   // I % 32: no __mma
        {moe(DType::bf16, 128, 8, 2, 2048, 40), "fused_moe_bf16__split{}"},  // the same, past 32
        {moe(DType::fp8_e4m3fn, 64, 256, 8, 7168, 256), "fused_moe_fp8_e4m3fn__mma{staged=true,block_m=32}"},
        {moe(DType::fp8_e4m3fn, 4096, 2048, 1, 1024, 256), "fused_moe_fp8_e4m3fn__split{}"},  // E > 1024
    };
    for (const Want& w : wants) {
      INFO(std::string(w.plan), " M=", w.p.m, " E=", w.p.extra[0], " I=", w.p.n);
      const Plan plan = dispatch::core::get_default(w.p, dev);
      REQUIRE(plan.valid());
      CHECK(dispatch::core::plan_to_string(plan) == w.plan);
      // The plan its config row resolves to (plan_to_config writes the
      // variant's params alone) and the tuner's config space: the same plan.
      const auto from_row =
          dispatch::core::plan_from_config(dispatch::core::plan_to_config(plan), OpKind::fused_moe, t);
      REQUIRE(from_row.ok());
      CHECK(*from_row == plan);
      const std::vector<Plan> space = dispatch::core::config_space(*plan.variant, w.p, dev);
      CHECK(std::count(space.begin(), space.end(), plan) == 1);
      for (int i = static_cast<int>(plan.variant->params.size()); i < dispatch::core::kMaxParams; ++i)
        CHECK(plan.params[i] == 0);
    }
    // A row or a forced plan naming __mma without "staged" or "block_m": staged, 32-pair items (the defaults).
    dispatch::Config bare;
    bare.emplace_back("variant", dispatch::ConfigValue::string("fused_moe_bf16__mma"));
    const auto staged = dispatch::core::plan_from_config(bare, OpKind::fused_moe, t);
    REQUIRE(staged.ok());
    CHECK(dispatch::core::plan_to_string(*staged) == "fused_moe_bf16__mma{staged=true,block_m=32}");
  }
}

TEST_CASE("gpu host: moe_align's block kernel declines past 48 KiB of per-warp counts, get_default falls back") {
  for (DeviceType t : kGpuTypes) {
    if (!dispatch::backends::find(t)) continue;
    const DeviceInfo dev = described(t);
    const bool hip = t == DeviceType::hip;
    const VariantDef* block =
        dispatch::core::find_variant(hip ? "moe_align_int32__hip_block" : "moe_align_int32__block");
    const VariantDef* ref =
        dispatch::core::find_variant(hip ? "moe_align_int32__hip_ref" : "moe_align_int32__cuda_ref");
    REQUIRE((block != nullptr && ref != nullptr));
    CHECK((ref->flags & dispatch::core::kVariantReference) != 0);
    CHECK(ref->params.empty());
    CHECK(block->in_dtype == DType::int32);
    auto problem = [&](int64_t tokens, int64_t top_k, int64_t experts, int64_t bs) {
      Problem p;
      p.op = OpKind::moe_align;
      p.device = Device{t, 0};
      p.in_dtype = p.out_dtype = DType::int32;
      p.m = tokens, p.n = bs, p.extra[0] = experts, p.extra[1] = top_k;
      return p;
    };
    // 4 * (E * (warps + 1) + warps + 1) bytes: 1024 threads hold E = 371
    // (CUDA, 32 warps) or 721 (HIP, 16 wavefronts), 256 threads 1364 or 2456.
    const int64_t most_1024 = hip ? 721 : 371, most_256 = hip ? 2456 : 1364;
    const int64_t t1024[] = {1024}, t256[] = {256}, t128[] = {128};
    CHECK(block->supports(problem(64, 8, most_1024, 64), t1024, dev).ok());
    const dispatch::Status s = block->supports(problem(64, 8, most_1024 + 1, 64), t1024, dev);
    CHECK(s.code() == dispatch::StatusCode::unsupported_problem);
    CHECK(kdtest::contains(s.message(), "48 KiB"));
    CHECK(block->supports(problem(64, 8, most_256, 64), t256, dev).ok());
    CHECK(!block->supports(problem(64, 8, most_256 + 1, 64), t256, dev).ok());
    CHECK(!block->supports(problem(64, 8, 8, 64), t128, dev).ok());  // not a point
    CHECK(dispatch::core::config_space(*block, problem(64, 8, 256, 64), dev).size() == 3u);
    CHECK(dispatch::core::config_space(*block, problem(64, 8, most_256 + 1, 64), dev).empty());
    // int32 outputs: M*top_k + min(E, M*top_k)*(block_size - 1) must fit.
    for (const VariantDef* v : {block, ref}) {
      INFO(v->name);
      CHECK(!v->supports(problem(int64_t{1} << 28, 8, 8, 64), t1024, dev).ok());
      CHECK(!v->supports(problem(int64_t{1} << 24, 8, 256, 1 << 24), t1024, dev).ok());
      CHECK(v->supports(problem(int64_t{1} << 20, 8, 8, 64), t1024, dev).ok());
      Problem fp = problem(4, 2, 8, 16);
      fp.in_dtype = DType::fp32;
      CHECK(!v->supports(fp, t1024, dev).ok());
      Problem cpu = problem(4, 2, 8, 16);
      cpu.device = Device{};
      CHECK(v->supports(cpu, t1024, dev).code() == dispatch::StatusCode::unsupported_device);
    }
    // get_default: the most threads that fit, else the reference.
    const Plan p8 = dispatch::core::get_default(problem(1, 8, 256, 64), dev);
    REQUIRE(p8.valid());
    CHECK(p8.variant == block);
    CHECK(p8.params[0] == 1024);
    const Plan p512 = dispatch::core::get_default(problem(1, 8, most_1024 + 1, 64), dev);
    REQUIRE(p512.valid());
    CHECK(p512.variant == block);
    CHECK(p512.params[0] == 512);
    const Plan big = dispatch::core::get_default(problem(1, 8, most_256 + 1, 64), dev);
    REQUIRE(big.valid());
    CHECK(big.variant == ref);
  }
}
