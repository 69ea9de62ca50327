// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the store, table, cases, oracle and runtime tests.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dispatch/config.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"

namespace kdtest {
namespace fs = std::filesystem;

/// The project's shared folder (read in place, never copied into the repo).
/// Sets environment variables for one scope (nullptr: unset) and puts the
/// old values back when it ends. Not thread-safe (setenv).
class EnvScope {
 public:
  EnvScope(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k);
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      if (v)
        ::setenv(k, v, 1);
      else
        ::unsetenv(k);
    }
  }
  ~EnvScope() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second)
        ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        ::unsetenv(it->first.c_str());
    }
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

/// A contiguous rank-3 tensor [batch, rows, cols] (an MoE op's expert weights).
inline dispatch::TensorRef tensor_3d(void* data, dispatch::DType dtype, int64_t batch, int64_t rows, int64_t cols,
                                     dispatch::Device device = {}) {
  dispatch::TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.rank = 3;
  t.shape[0] = batch, t.shape[1] = rows, t.shape[2] = cols;
  t.strides[0] = rows * cols, t.strides[1] = cols, t.strides[2] = 1;
  t.device = device;
  return t;
}

inline fs::path shared_dir() { return fs::path(KDISPATCH_SHARED_DIR); }
inline fs::path sglang_dir() { return shared_dir() / "data" / "sglang-configs"; }
inline fs::path moe_dir() { return sglang_dir() / "fused_moe_triton"; }
inline fs::path quant_dir() { return sglang_dir() / "quantization"; }

/// A fresh directory under the system temp dir, removed with everything in
/// it when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kdispatch-test-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    REQUIRE_MESSAGE(p != nullptr, "mkdtemp failed for ", tmpl);
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  fs::path operator/(std::string_view rel) const { return path_ / fs::path(rel); }

 private:
  fs::path path_;
};

inline std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "cannot read ", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// Writes `text` to `p` (creating parent dirs), replacing any old content.
inline void write_text(const fs::path& p, std::string_view text) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  REQUIRE_MESSAGE(f.good(), "cannot write ", p.string());
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  REQUIRE(f.good());
}

/// Options for a test runtime: only the given dirs, no shipped configs, quiet.
inline dispatch::RuntimeOptions options_for(std::vector<std::string> dirs) {
  dispatch::RuntimeOptions o;
  o.config_dirs = std::move(dirs);
  o.load_shipped_configs = false;
  o.log_level = dispatch::LogLevel::off;
  return o;
}

inline std::unique_ptr<dispatch::Runtime> make_runtime(dispatch::RuntimeOptions o) {
  auto r = dispatch::Runtime::create(std::move(o));
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  return std::move(r).value();
}

inline std::unique_ptr<dispatch::Runtime> make_runtime(std::vector<std::string> dirs) {
  return make_runtime(options_for(std::move(dirs)));
}

/// lookup() that must succeed.
inline dispatch::LookupResult lookup_ok(const dispatch::Runtime& rt, const dispatch::LookupQuery& q) {
  auto r = dispatch::lookup(rt, q);
  REQUIRE_MESSAGE(r.ok(), "lookup(", q.key, " @ ", q.device, ", M=", q.M, "): ", r.status().to_string());
  return std::move(r).value();
}

inline dispatch::LookupQuery query(std::string key, std::string device, int64_t m, bool down = false,
                                   std::string op = {}) {
  dispatch::LookupQuery q;
  q.key = std::move(key);
  q.device = std::move(device);
  q.M = m;
  q.down = down;
  q.op = std::move(op);
  return q;
}

/// The row text as config_to_json writes it: {"BLOCK_SIZE_M": 64, ...}.
inline std::string row(std::initializer_list<std::pair<const char*, int64_t>> ints) {
  dispatch::Config c;
  for (const auto& [k, v] : ints) c.emplace_back(k, dispatch::ConfigValue::integer(v));
  return dispatch::config_to_json(c);
}

inline bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != std::string_view::npos;
}

/// All problems of a file report joined (for messages and `contains`).
inline std::string problems_text(const dispatch::FileReport& f) {
  std::string s;
  for (const auto& p : f.problems) s += p + " | ";
  return s;
}

/// The report entry whose path is exactly `rel` (relative to its dir), or nullptr.
inline const dispatch::FileReport* find_file(const dispatch::LoadReport& rep, std::string_view rel) {
  for (const auto& f : rep.files)
    if (f.path == rel) return &f;
  return nullptr;
}

/// Copies a shared data file into `dst` (the data is never modified in place).
inline void copy_data_file(const fs::path& src, const fs::path& dst) {
  fs::create_directories(dst.parent_path());
  fs::copy_file(src, dst, fs::copy_options::overwrite_existing);
}

/// A described (not probed) device of a backend, for the host-side checks of
/// supports() and get_default(): an H200 for CUDA, an MI250X for HIP.
inline dispatch::DeviceInfo described(dispatch::DeviceType t) {
  dispatch::DeviceInfo d;
  d.device = dispatch::Device{t, 0};
  d.available = true;
  if (t == dispatch::DeviceType::cuda) {
    d.device_name = "NVIDIA_H200";
    d.reported_name = "NVIDIA H200";
    d.arch = "sm_90a";
    d.compute_units = 132;
    d.memory_bytes = 150109880320;
    d.l2_bytes = 62914560;
    d.smem_per_block_bytes = 49152;
    d.warp_size = 32;
  } else {
    d.device_name = "AMD_Instinct_MI250X";
    d.reported_name = "AMD Instinct MI250X";
    d.arch = "gfx90a";
    d.compute_units = 110;
    d.memory_bytes = 68702699520;
    d.l2_bytes = 8388608;
    d.smem_per_block_bytes = 65536;
    d.warp_size = 64;
  }
  return d;
}

}  // namespace kdtest
