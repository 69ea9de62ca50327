// SPDX-License-Identifier: Apache-2.0
// Pretune refuses exactly what the op refuses. For every op and every
// (input dtype, output dtype) pair, with and without the optional slot: where
// the op call (call_op) refuses, pretune (pretune_op on the same tensors, on
// descriptions without data, and pretune_key on the problem's key) answers
// the same code and message, and nothing reaches the cache dir: before the
// fix pretune searched such problems with the reference, wrote fp32 into an
// fp8 scratch (a heap overflow) and persisted gemm_fp32__ref rows keyed
// out_dtype=int32|fp16|fp8_*. And the loader drops a row of another
// device's file whose key's dtype combination no variant computes.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/registry.hpp"
#include "core/op_spec.hpp"
#include "dispatch/dispatch.hpp"
#include "table/key.hpp"
#include "test_util.hpp"

namespace {

using namespace dispatch;
namespace fs = std::filesystem;

bool uses_dim(const core::OpSpec& s, core::Dim d) {
  for (const core::ArgSlot& a : s.slots)
    if ((a.rank == 2 && a.rows.dim == d) || a.cols.dim == d) return true;
  return false;
}

bool has_optional(const core::OpSpec& s) {
  for (const core::ArgSlot& a : s.slots)
    if (a.optional) return true;
  return false;
}

int files_under(const fs::path& dir) {
  int n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file()) ++n;
  return n;
}

// The tensors of problem `p` of op `s`: with host buffers (zeroed) when
// `bufs` is given, else descriptions without data.
std::vector<TensorRef> tensors_of(const core::OpSpec& s, const core::Problem& p,
                                  std::vector<std::vector<uint64_t>>* bufs) {
  std::vector<TensorRef> out;
  for (int i = 0; i < s.slot_count(); ++i) {
    const core::SlotExtent e = core::slot_extent(s, i, p);
    if (!e.present) {
      out.emplace_back();
      continue;
    }
    void* data = nullptr;
    if (bufs) {
      const size_t bytes = static_cast<size_t>(e.rows * e.cols) * dtype_size(e.dtype);
      bufs->emplace_back((bytes + 7) / 8 + 1, 0);
      data = bufs->back().data();
    }
    out.push_back(s.slots[static_cast<size_t>(i)].rank == 2 ? make_tensor_2d(data, e.dtype, e.rows, e.cols, e.cols)
                                                            : make_tensor_1d(data, e.dtype, e.cols));
  }
  return out;
}

}  // namespace

TEST_CASE(
    "pretune dtypes: every op, every refused dtype pair: pretune answers the op's code and message, writes nothing") {
  kdtest::TempDir cache;
  RuntimeOptions o;
  o.load_shipped_configs = false;
  o.log_level = LogLevel::off;
  o.tune.cache_dir = cache.str();
  o.tune.cold_cache = false;
  o.tune.time_budget_ms = 20;
  o.tune.reps = 1;
  auto rt = Runtime::create(o).value();
  int refused = 0, computes_refusals = 0, accepted = 0;
  for (const core::OpSpec* spec : core::all_specs()) {
    for (int bias = 0; bias < (has_optional(*spec) ? 2 : 1); ++bias)
      for (int in = 0; in < kDTypeCount; ++in)
        for (int out = 0; out < kDTypeCount; ++out) {
          core::Problem p;
          p.op = spec->op;
          p.device = Device{DeviceType::cpu, 0};
          p.in_dtype = static_cast<DType>(in);
          p.out_dtype = static_cast<DType>(out);
          p.m = 4;
          p.n = uses_dim(*spec, core::Dim::n) ? 128 : 0;
          p.k = uses_dim(*spec, core::Dim::k) ? 256 : 0;
          p.has_bias = bias == 1;
          CAPTURE(spec->name);
          CAPTURE(dtype_name(p.in_dtype));
          CAPTURE(dtype_name(p.out_dtype));
          CAPTURE(bias);
          std::vector<float> scalars;
          for (const core::ScalarSlot& sc : spec->scalars) scalars.push_back(sc.default_value);
          std::vector<std::vector<uint64_t>> bufs;
          const std::vector<TensorRef> tensors = tensors_of(*spec, p, &bufs);
          const Status op = call_op(*rt, spec->name, tensors, scalars);
          if (op.ok()) {
            ++accepted;
            continue;
          }
          ++refused;
          // The same tensors, through the generic entry point (the C ABI's
          // kdispatch_op_pretune and Python's) and the typed pretune behind it.
          auto r = pretune_op(*rt, spec->name, tensors, scalars);
          REQUIRE_MESSAGE(!r.ok(), "pretune accepted what the op refuses: ", op.to_string());
          CHECK(r.status().code() == op.code());
          CHECK(r.status().message() == op.message());
          // Descriptions without data (pretune's usual input).
          const std::vector<TensorRef> desc = tensors_of(*spec, p, nullptr);
          auto d = pretune_op(*rt, spec->name, desc, scalars);
          REQUIRE_MESSAGE(!d.ok(), "pretune of descriptions accepted what the op refuses: ", op.to_string());
          CHECK(d.status().code() == op.code());
          CHECK(d.status().message() == op.message());
          // The key of a problem the op refuses for its dtype combination
          // (`kdispatch tune`'s path, pretune_key).
          if (op.message().rfind("no cpu variant computes ", 0) == 0) {
            ++computes_refusals;
            CHECK(op.code() == StatusCode::unsupported_problem);
            table::KeyBuffer fields;
            table::append_own_fields(p, &fields);
            auto k = pretune_key(*rt, spec->name, fields.view(), p.m);
            REQUIRE_MESSAGE(!k.ok(), "pretune_key accepted what the op refuses: ", op.to_string());
            CHECK(k.status().code() == op.code());
            CHECK(k.status().message() == op.message());
          }
          CHECK(files_under(cache.path()) == 0);
        }
  }
  CHECK(accepted > 0);
  CHECK(refused > 0);
  CHECK(computes_refusals > 0);
  // The attacker's calls, by name: fp32 inputs, an fp8 / int32 / fp16 output.
  for (DType out : {DType::fp8_e5m2, DType::fp8_e4m3fnuz, DType::int32, DType::fp16}) {
    CAPTURE(dtype_name(out));
    GemmArgs g{make_tensor_2d(nullptr, DType::fp32, 8, 16, 16), make_tensor_2d(nullptr, DType::fp32, 4, 16, 16),
               make_tensor_2d(nullptr, out, 8, 4, 4), TensorRef{}};
    auto r = pretune(*rt, g);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::unsupported_problem);
    CHECK(r.status().message() ==
          "no cpu variant computes gemm with fp32 inputs and " + std::string(dtype_name(out)) + " output");
  }
  CHECK(files_under(cache.path()) == 0);
  // The dir is the one pretune writes: an accepted problem persists there.
  auto ok = pretune(
      *rt, GemmArgs{make_tensor_2d(nullptr, DType::fp32, 8, 16, 16), make_tensor_2d(nullptr, DType::fp32, 4, 16, 16),
                    make_tensor_2d(nullptr, DType::fp32, 8, 4, 4), TensorRef{}});
  REQUIRE_MESSAGE(ok.ok(), ok.status().to_string());
  CHECK(ok->persisted);
  CHECK(files_under(cache.path()) >= 1);
}

TEST_CASE("pretune dtypes: the loader drops another device's row whose key's dtype pair no variant computes") {
  const DeviceInfo* local = core::local_device_info(DeviceType::cpu);
  REQUIRE(local != nullptr);
  const std::string other = local->device_name == "CPU_x86_64_AVX2" ? "CPU_x86_64_AVX512" : "CPU_x86_64_AVX2";
  kdtest::TempDir dir;
  const std::string bad = "N=4,K=16,device_name=" + other + ",dtype=fp32,out_dtype=int32.json";
  const std::string good = "N=4,K=16,device_name=" + other + ",dtype=fp32.json";
  kdtest::write_text(dir / ("cpu/gemm/" + bad), R"({"8": {"variant": "gemm_fp32__ref"}})");
  kdtest::write_text(dir / ("cpu/gemm/" + good), R"({"8": {"variant": "gemm_fp32__ref"}})");
  auto rt = Runtime::create(kdtest::options_for({dir.str()})).value();
  const LoadReport rep = rt->load_report();
  int seen = 0;
  for (const FileReport& f : rep.files) {
    CAPTURE(f.path);
    if (f.path == "cpu/gemm/" + bad) {
      ++seen;
      CHECK(f.state == FileReport::State::skipped);
      CHECK(f.rows == 0);
      bool said = false;
      for (const std::string& why : f.problems)
        said = said || why == "M=8: no cpu variant computes gemm with fp32 inputs and int32 output; row dropped";
      CHECK_MESSAGE(said, "problems: ", f.problems.size());
    } else if (f.path == "cpu/gemm/" + good) {
      ++seen;
      CHECK(f.state == FileReport::State::loaded);
      CHECK(f.rows == 1);
    }
  }
  CHECK(seen == 2);
}
