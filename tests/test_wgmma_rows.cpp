// SPDX-License-Identifier: Apache-2.0
// The wgmma GEMM family's config rows (CPU side): rows naming
// gemm_<dt>__wgmma with points outside its space are dropped at load with a
// message that names the param (the file named by its report entry), good
// rows load and serve, and the same verdicts come from check_table_rows
// (merge's check). Also the plan's resolve_wgmma at its edges.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "backends/registry.hpp"
#include "dispatch/dispatch.hpp"
#include "gpu/gemm_plan.hpp"
#include "test_util.hpp"

namespace {

using namespace dispatch;
using kdtest::TempDir;

const std::string kWgRel = "cuda/gemm/N=4096,K=4096,device_name=NVIDIA_H200,dtype=bf16.json";

std::string wg_row(int64_t bn, int64_t st, int64_t g, const char* variant = "gemm_bf16__wgmma") {
  return "{\"variant\": \"" + std::string(variant) + "\", \"BLOCK_SIZE_N\": " + std::to_string(bn) +
         ", \"num_stages\": " + std::to_string(st) + ", \"GROUP_SIZE_M\": " + std::to_string(g) + "}";
}

}  // namespace

TEST_CASE("gpu gemm host: wgmma rows with points outside the space are dropped naming the param, good rows serve") {
  if (!core::backend_compiled(DeviceType::cuda)) return;  // the rows are then kept unchecked (another test)
  TempDir dir;
  kdtest::write_text(dir / kWgRel, "{\"1\": " + wg_row(64, 4, 8) +                               //
                                       ",\n \"2\": " + wg_row(256, 7, 8) +                       //
                                       ",\n \"4\": " + wg_row(256, 4, 0) +                       //
                                       ",\n \"8\": " + wg_row(256, 4, 8) +                       //
                                       ",\n \"16\": " + wg_row(128, 6, 16) +                     //
                                       ",\n \"32\": " + wg_row(256, 4, 8, "gemm_fp16__wgmma") +  //
                                       ",\n \"64\": {\"variant\": \"gemm_bf16__wgmma\", \"BLOCK_SIZE_M\": 128}" +
                                       ",\n \"128\": {\"variant\": \"gemm_bf16__wgmma\", \"num_stages\": 3}" +
                                       ",\n \"256\": {\"variant\": \"gemm_bf16__wgmma\", \"BLOCK_SIZE_N\": \"256\"}}");
  RuntimeOptions o = kdtest::options_for({dir.str()});
  o.tune.load_cache = o.tune.persist = false;
  auto rt = kdtest::make_runtime(o);
  const LoadReport rep = rt->load_report();
  const FileReport* f = kdtest::find_file(rep, kWgRel);
  REQUIRE(f != nullptr);
  INFO(kdtest::problems_text(*f));
  CHECK(f->state == FileReport::State::partial);
  CHECK(f->rows == 3);  // M = 8, 16, 128
  const std::vector<std::string> want = {
      "M=1: 'BLOCK_SIZE_N'=64 is not a point of gemm_bf16__wgmma's space; row dropped",
      "M=2: 'num_stages'=7 is not a point of gemm_bf16__wgmma's space; row dropped",
      "M=4: 'GROUP_SIZE_M'=0 is not a point of gemm_bf16__wgmma's space; row dropped",
      "M=32: variant gemm_fp16__wgmma computes fp16, the key is bf16; row dropped",
      "M=64: 'BLOCK_SIZE_M' is not a parameter of variant gemm_bf16__wgmma; row dropped",
  };
  for (const std::string& w : want) CHECK_MESSAGE(kdtest::contains(kdtest::problems_text(*f), w), w);
  CHECK(kdtest::contains(kdtest::problems_text(*f), "M=128: BLOCK_SIZE_N, GROUP_SIZE_M not in the row"));
  CHECK(kdtest::contains(kdtest::problems_text(*f), "M=256: 'BLOCK_SIZE_N' must be an integer; row dropped"));

  for (int64_t m : {8, 16, 128}) {
    LookupQuery q{.op = "gemm", .key = "N=4096,K=4096,dtype=bf16", .device = "NVIDIA_H200", .M = m};
    const LookupResult r = kdtest::lookup_ok(*rt, q);
    CHECK(r.match == LookupResult::Match::exact);
    const ConfigValue* v = config_find(r.config, "variant");
    REQUIRE(v != nullptr);
    CHECK(v->s == "gemm_bf16__wgmma");
  }

  // merge's check gives the same verdicts.
  const Config bad_bn = {{"variant", ConfigValue::string("gemm_bf16__wgmma")},
                         {"BLOCK_SIZE_N", ConfigValue::integer(64)}};
  const Config bad_st = {{"variant", ConfigValue::string("gemm_bf16__wgmma")}, {"num_stages", ConfigValue::integer(7)}};
  const Config bad_g = {{"variant", ConfigValue::string("gemm_bf16__wgmma")},
                        {"GROUP_SIZE_M", ConfigValue::integer(0)}};
  const Config good = {{"variant", ConfigValue::string("gemm_bf16__wgmma")},
                       {"BLOCK_SIZE_N", ConfigValue::integer(128)},
                       {"num_stages", ConfigValue::integer(6)},
                       {"GROUP_SIZE_M", ConfigValue::integer(16)}};
  const std::vector<TableRow> rows = {{1, &bad_bn}, {2, &bad_st}, {4, &bad_g}, {8, &good}};
  auto r = check_table_rows(kWgRel, {}, rows);
  REQUIRE(r.ok());
  CHECK(r->checked);
  CHECK(r->dropped == std::vector<std::pair<size_t, std::string>>{
                          {0, "'BLOCK_SIZE_N'=64 is not a point of gemm_bf16__wgmma's space"},
                          {1, "'num_stages'=7 is not a point of gemm_bf16__wgmma's space"},
                          {2, "'GROUP_SIZE_M'=0 is not a point of gemm_bf16__wgmma's space"}});
}

constexpr int64_t h100 = 227 * 1024;

TEST_CASE("gpu gemm host: wgmma resolve_wgmma at its edges") {
  using dispatch::gpu::gemm::resolve_wgmma;
  using dispatch::gpu::gemm::Wgmma;
  Wgmma w;
  auto res = [&](int64_t n, int64_t k, int64_t bn, int64_t st, int64_t g, int64_t optin = h100) {
    const int64_t prm[3] = {bn, st, g};
    const char* why = resolve_wgmma(n, k, prm, optin, &w);
    return why ? std::string(why) : std::string();
  };
  CHECK(res(8, 8, 256, 4, 8).empty());  // tiny N and K: the TMA box covers past the tensor
  CHECK(w.kernel == 1);
  CHECK(res(1, 8, 128, 6, 16).empty());
  CHECK(w.kernel == 0);
  CHECK(res(8, 4, 128, 3, 8) == "K must be a multiple of 8 (the TMA's 16-byte row stride)");
  CHECK(res(8, 8, 256, 5, 8) == "the stages do not fit the device's shared memory");
  CHECK(res(8, 8, 64, 3, 8) == "BLOCK_SIZE_N must be 128 or 256");
  CHECK(res(8, 8, 128, 7, 8) == "num_stages must be 3, 4, 5 or 6");
  CHECK(res(8, 8, 128, 3, 0) == "GROUP_SIZE_M must be 8 or 16");
  // Every point the family lists fits the smem the probe raises (227 KiB):
  // the largest, 256 x 4 stages, is 197,696 bytes.
  CHECK(dispatch::gpu::gemm::wgmma_smem_bytes(256, 4) == 197696);
  CHECK(dispatch::gpu::gemm::wgmma_smem_bytes(128, 6) <= h100);
  CHECK(dispatch::gpu::gemm::wgmma_smem_bytes(256, 5) > h100);
}
