// SPDX-License-Identifier: Apache-2.0
// The CI check of committed configs (ARCHITECTURE.md section 4): every file
// under configs/ parses and loads with no skipped file and no dropped row —
// every row names a compiled variant and a point of its space (the loader
// checks that whenever the file's backend is compiled in) — and, for the GPU
// backends, every row's point serves its own key (supports() of the row's M
// and the file's hidden/dtype on a device described by the file's
// device_name: no GPU is needed for that). CI's test build compiles the CUDA
// backend (nvcc is there), so configs/cuda is checked in full there; a build
// without a file's backend (the sanitizer presets) checks what it can and
// says what it could not. The same check also runs over a small synthetic
// CUDA table (and must catch a broken one).
#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <algorithm>

#include "backends/registry.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "backends/backend.hpp"
#include "store/filename.hpp"
#include "store/json_file.hpp"
#include "test_util.hpp"

namespace {

constexpr std::string_view kNotCompiled = "is not compiled into this build";
constexpr std::string_view kHostLacks = "which this host lacks";

/// Every file of the report loaded fully, with no problem line. Files of a
/// backend this build lacks may carry that one note and nothing else; they
/// are counted in *unchecked.
void require_clean(const dispatch::LoadReport& rep, int* unchecked = nullptr) {
  for (const auto& f : rep.files) {
    INFO(f.dir, "/", f.path, ": ", dispatch::file_state_name(f.state), " | ", kdtest::problems_text(f));
    CHECK(!f.stale);
    // CPU rows tuned on a host with an ISA this one lacks (an avx512bf16
    // micro-kernel on an AVX-512 host without BF16) are dropped here and
    // serve elsewhere: the loader's supports() check working, not a bad file.
    const bool only_isa = !f.problems.empty() && std::all_of(f.problems.begin(), f.problems.end(), [](const auto& p) {
      return kdtest::contains(p, kHostLacks);
    });
    if (only_isa) {
      MESSAGE(f.path, ": ", f.problems.size(), " row(s) need an ISA this host lacks (dropped here, kept for others)");
      continue;
    }
    CHECK(f.state == dispatch::FileReport::State::loaded);
    CHECK(f.rows > 0);
    if (unchecked && f.problems.size() == 1 && kdtest::contains(f.problems.front(), kNotCompiled)) {
      ++*unchecked;
      continue;
    }
    CHECK(f.problems.empty());
  }
}

/// A device described by a config file's device_name (no GPU needed): what
/// the GPU variants' supports() reads besides the problem is the backend and
/// warp width; the kernel-image check runs only on a probed device.
dispatch::DeviceInfo described(dispatch::DeviceType t, const std::string& device_name) {
  dispatch::DeviceInfo d;
  d.device = dispatch::Device{t, 0};
  d.available = true;
  d.device_name = device_name;
  d.warp_size = t == dispatch::DeviceType::hip ? 64 : 32;
  d.compute_units = t == dispatch::DeviceType::hip ? 304 : 132;
  return d;
}

struct RowCheck {
  int64_t rows = 0;                   ///< rows checked
  std::vector<std::string> declined;  ///< "<file> M=<m>: <plan> declines its own key: <why>"
};

/// For every own-op file of a compiled GPU backend under `dir`: each row's
/// variant accepts the file's key at the row's M.
RowCheck check_gpu_rows_serve_their_keys(const kdtest::fs::path& dir) {
  namespace fs = kdtest::fs;
  using dispatch::DeviceType;
  RowCheck out;
  for (DeviceType t : {DeviceType::cuda, DeviceType::hip}) {
    if (!dispatch::backends::find(t)) continue;
    const fs::path bdir = dir / std::string(dispatch::device_type_name(t));
    if (!fs::is_directory(bdir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(bdir)) {
      if (!e.is_regular_file() || e.path().extension() != ".json") continue;
      const std::string rel = fs::relative(e.path(), dir).generic_string();
      INFO(rel);
      const auto op = dispatch::core::parse_op(e.path().parent_path().filename().string());
      REQUIRE_MESSAGE(op.has_value(), "the folder above a config file names its op");
      auto key = dispatch::store::parse_file_name(e.path().filename().string());
      REQUIRE_MESSAGE(key.ok(), key.status().to_string());
      auto prob = dispatch::store::own_problem_from_fields(*op, key->fields);
      REQUIRE_MESSAGE(prob.ok(), prob.status().to_string());
      std::ifstream in(e.path(), std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t len = text.size();
      text.append(dispatch::store::json_padding(), '\0');
      const dispatch::store::ParsedFile parsed = dispatch::store::parse_config_json(text.data(), len);
      REQUIRE(parsed.kind == dispatch::store::ParsedFile::Kind::table);
      const dispatch::DeviceInfo dev = described(t, key->device_name);
      for (const auto& row : parsed.rows) {
        INFO("M=", row.m);
        auto plan = dispatch::core::plan_from_config(parsed.config(row), *op, t);
        REQUIRE_MESSAGE(plan.ok(), plan.status().to_string());
        dispatch::core::Problem p = *prob;
        p.device = dispatch::Device{t, 0};
        p.m = row.m;
        const dispatch::Status s = plan->variant->supports(p, plan->params, dev);
        if (!s.ok())
          out.declined.push_back(rel + " M=" + std::to_string(row.m) + ": " + dispatch::core::plan_to_string(*plan) +
                                 " declines its own key: " + s.to_string());
        ++out.rows;
      }
    }
  }
  return out;
}

std::string lines(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& l : v) s += "\n  " + l;
  return s;
}

}  // namespace

TEST_CASE("configs: every committed file under configs/ loads with no skipped file and no dropped row") {
  const std::string dir = std::string(KDISPATCH_SOURCE_DIR) + "/configs";
  if (!kdtest::fs::is_directory(dir)) {
    // git keeps no empty folders: a clean clone has no configs/ until a
    // table is committed.
    MESSAGE("no configs/ directory in this checkout: nothing committed to check");
    return;
  }
  auto rt = kdtest::make_runtime(std::vector<std::string>{dir});
  const dispatch::LoadReport rep = rt->load_report();
  int unchecked = 0;
  require_clean(rep, &unchecked);
  int64_t rows = 0;
  for (const auto& f : rep.files) rows += f.rows;
  const RowCheck gpu = check_gpu_rows_serve_their_keys(dir);
  CHECK_MESSAGE(gpu.declined.empty(), gpu.declined.size(),
                " committed GPU row(s) decline their own key:", lines(gpu.declined));
  MESSAGE(rep.files.size(), " committed config file(s), ", rows, " row(s); ", gpu.rows,
          " GPU row(s) checked against their own keys",
          unchecked ? "; " + std::to_string(unchecked) +
                          " file(s) of a backend this build lacks: parsed, variants not checked (a build with that "
                          "backend checks them)"
                    : std::string());
}

#if KDISPATCH_HAVE_CUDA
TEST_CASE("configs: a CUDA norm table names compiled variants and points of their spaces, and a broken one is caught") {
  kdtest::TempDir tmp;
  kdtest::write_text(tmp / "cuda/rmsnorm/hidden=4096,device_name=NVIDIA_H200,dtype=bf16.json",
                     R"({"kdispatch": {"schema": {"rmsnorm_bf16__block_vec8": 1}},
 "1": {"variant": "rmsnorm_bf16__block_vec8", "unroll": 1},
 "128": {"variant": "rmsnorm_bf16__warp_vec8", "rows_per_block": 4, "unroll": 16},
 "8192": {"variant": "rmsnorm_bf16__block_vec8", "unroll": 4},
 "32768": {"variant": "rmsnorm_bf16__generic", "threads": 512}})");
  kdtest::write_text(tmp / "cuda/fused_add_rmsnorm/hidden=5120,device_name=NVIDIA_H200,dtype=fp16.json",
                     R"({"1": {"variant": "fused_add_rmsnorm_fp16__block_vec8", "unroll": 1},
 "4096": {"variant": "fused_add_rmsnorm_fp16__block_vec8", "unroll": 2}})");
  {
    auto rt = kdtest::make_runtime(std::vector<std::string>{tmp.str()});
    const dispatch::LoadReport rep = rt->load_report();
    REQUIRE(rep.files.size() == 2);
    require_clean(rep);
    const RowCheck rc = check_gpu_rows_serve_their_keys(tmp.path());
    CHECK(rc.rows == 6);
    CHECK_MESSAGE(rc.declined.empty(), lines(rc.declined));
    auto q = kdtest::query("hidden=4096,dtype=bf16", "NVIDIA H200", 100, false, "rmsnorm");
    q.backend = "cuda";
    const dispatch::LookupResult r = kdtest::lookup_ok(*rt, q);
    CHECK(r.variant == "rmsnorm_bf16__warp_vec8");
    CHECK(r.table_m == 128);
  }
  // The same check catches what a bad edit or a renamed variant would leave.
  kdtest::write_text(tmp / "cuda/rmsnorm/hidden=4096,device_name=NVIDIA_H200,dtype=bf16.json",
                     R"({"1": {"variant": "rmsnorm_bf16__block_vec16", "unroll": 1},
 "2": {"variant": "rmsnorm_bf16__block_vec8", "unroll": 3},
 "3": {"variant": "fused_add_rmsnorm_bf16__block_vec8", "unroll": 1},
 "4": {"variant": "rmsnorm_bf16__warp_vec8", "rows_per_block": 4, "threads": 128},
 "5": {"variant": "rmsnorm_fp32__block_vec4", "unroll": 2},
 "6": {"variant": "rmsnorm_bf16__vec", "vec": 8},
 "7": {"variant": "rmsnorm_bf16__block_vec8", "unroll": 2}})");
  auto rt = kdtest::make_runtime(std::vector<std::string>{tmp.str()});
  const dispatch::LoadReport rep = rt->load_report();
  const dispatch::FileReport* f =
      kdtest::find_file(rep, "cuda/rmsnorm/hidden=4096,device_name=NVIDIA_H200,dtype=bf16.json");
  REQUIRE(f != nullptr);
  INFO(kdtest::problems_text(*f));
  CHECK(f->state == dispatch::FileReport::State::partial);
  CHECK(f->rows == 1);
  CHECK(f->problems.size() == 6);
  const std::string all = kdtest::problems_text(*f);
  CHECK(kdtest::contains(all, "unknown variant 'rmsnorm_bf16__block_vec16'"));
  CHECK(kdtest::contains(all, "not a point of rmsnorm_bf16__block_vec8's space"));
  CHECK(kdtest::contains(all, "'threads' is not a parameter of variant rmsnorm_bf16__warp_vec8"));
  CHECK(kdtest::contains(all, "computes fp32"));
  CHECK(kdtest::contains(all, "cpu rmsnorm variant"));

  // Points of their variants' spaces that cannot serve the file's key load
  // (the loader checks supports() only on a matching local device) but fail
  // the per-row check: a warp row of 4096 bf16 elements at unroll 1 (a
  // 32-wide warp holds 256), a vector variant for hidden 1001.
  kdtest::TempDir tmp2;
  kdtest::write_text(tmp2 / "cuda/rmsnorm/hidden=4096,device_name=NVIDIA_H200,dtype=bf16.json",
                     R"({"1": {"variant": "rmsnorm_bf16__warp_vec8", "rows_per_block": 4, "unroll": 1},
 "2": {"variant": "rmsnorm_bf16__block_vec8", "unroll": 1}})");
  kdtest::write_text(tmp2 / "cuda/fused_add_rmsnorm/hidden=1001,device_name=NVIDIA_H200,dtype=fp16.json",
                     R"({"8": {"variant": "fused_add_rmsnorm_fp16__block_vec8", "unroll": 1}})");
  const RowCheck rc = check_gpu_rows_serve_their_keys(tmp2.path());
  CHECK(rc.rows == 3);
  REQUIRE(rc.declined.size() == 2);
  INFO(lines(rc.declined));
  CHECK(kdtest::contains(lines(rc.declined), "M=1: rmsnorm_bf16__warp_vec8"));
  CHECK(kdtest::contains(lines(rc.declined), "does not fit in one warp"));
  CHECK(kdtest::contains(lines(rc.declined), "M=8: fused_add_rmsnorm_fp16__block_vec8"));
  CHECK(kdtest::contains(lines(rc.declined), "multiple of 8"));
}
#endif
