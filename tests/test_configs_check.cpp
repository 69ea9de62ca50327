// SPDX-License-Identifier: Apache-2.0
// The CI check of committed configs (ARCHITECTURE.md section 4): every file
// under configs/ parses and loads with no skipped file and no dropped row —
// every row names a compiled variant and a point of its space (the loader
// checks that whenever the file's backend is compiled in). configs/cuda is
// empty until the H200 tuning lands, so the same check also runs over a
// small synthetic CUDA table (and must catch a broken one).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/registry.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "test_util.hpp"

namespace {

/// Every file of the report loaded fully, with no problem line.
void require_clean(const dispatch::LoadReport& rep) {
  for (const auto& f : rep.files) {
    INFO(f.dir, "/", f.path, ": ", dispatch::file_state_name(f.state), " | ", kdtest::problems_text(f));
    CHECK(f.state == dispatch::FileReport::State::loaded);
    CHECK(f.problems.empty());
    CHECK(!f.stale);
    CHECK(f.rows > 0);
  }
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
  require_clean(rep);
  int64_t rows = 0;
  for (const auto& f : rep.files) rows += f.rows;
  MESSAGE(rep.files.size(), " committed config file(s), ", rows, " row(s), all clean");
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
 "4096": {"variant": "fused_add_rmsnorm_fp16__block_vec8"}})");
  {
    auto rt = kdtest::make_runtime(std::vector<std::string>{tmp.str()});
    const dispatch::LoadReport rep = rt->load_report();
    REQUIRE(rep.files.size() == 2);
    require_clean(rep);
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
  const dispatch::FileReport* f = kdtest::find_file(rep, "cuda/rmsnorm/hidden=4096,device_name=NVIDIA_H200,dtype=bf16.json");
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
}
#endif
