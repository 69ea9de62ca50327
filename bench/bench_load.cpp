// SPDX-License-Identifier: Apache-2.0
// bench_load — how long loading SGLang's config trees takes, beside the
// floors any loader pays.
//
// Input: every file under <shared>/data/sglang-configs (381 *.json files:
// fused-MoE tables in triton_X_Y_Z/ version folders, block-fp8 GEMM tables,
// and a few foreign JSON files the loader must skip and report), or the dir
// given in KDISPATCH_BENCH_CONFIG_DIR. Page cache warm (every benchmark
// reads the same files many times), as Python's numbers in
// bench/load_vs_python.py are.
//
//   BM_LoadAndBuild        store::load_config_dirs + table::Snapshot::build:
//                          walk, read, parse, file-name keys, report, version
//                          folders, merge, hash table.
//   BM_LoadOnly            store::load_config_dirs alone (BM_LoadAndBuild minus
//                          this is the Snapshot::build share).
//   BM_RuntimeCreate       dispatch::Runtime::create({.config_dirs = {dir},
//                          .load_shipped_configs = false}): the public path.
//   BM_Floor_ReadFiles     baseline: walk the tree and read every *.json file
//                          into one buffer (open/fstat/read/close): the I/O floor.
//   BM_Floor_ReadParse     baseline: the same plus a full simdjson DOM parse of
//                          each file: the floor of any loader built on simdjson.
//
// Time unit: ms. bench/load_vs_python.py runs this with
// --benchmark_format=json and compares with Python's json.load of the same tree.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/runtime.hpp"
#include "store/loader.hpp"
#include "table/snapshot.hpp"

namespace {
namespace fs = std::filesystem;
namespace store = dispatch::store;
namespace table = dispatch::table;

const std::string& config_dir() {
  static const std::string dir = [] {
    if (const char* e = std::getenv("KDISPATCH_BENCH_CONFIG_DIR"); e && *e) return std::string(e);
    return std::string(KDISPATCH_SHARED_DIR) + "/data/sglang-configs";
  }();
  return dir;
}

struct Interner {
  std::vector<std::pair<std::string, std::string>> sources;
  uint32_t operator()(const std::string& d, const std::string& r) {
    sources.emplace_back(d, r);
    return static_cast<uint32_t>(sources.size());
  }
};

store::LoadOutput load_once() {
  Interner in;
  return store::load_config_dirs({store::SourceDir{config_dir(), 0}}, {},
                                 [&in](const std::string& d, const std::string& r) { return in(d, r); });
}

void set_counters(benchmark::State& state, size_t files, int64_t keys, int64_t rows) {
  state.counters["files"] = static_cast<double>(files);
  state.counters["keys"] = static_cast<double>(keys);
  state.counters["rows"] = static_cast<double>(rows);
}

void BM_LoadAndBuild(benchmark::State& state) {
  size_t files = 0;
  int64_t keys = 0, rows = 0;
  for (auto _ : state) {
    store::LoadOutput out = load_once();
    std::vector<std::string> notes;
    auto snap = table::Snapshot::build(std::move(out.inputs), {}, &notes);
    files = out.report.files.size();
    keys = static_cast<int64_t>(snap->buckets().size());
    rows = snap->row_count();
    benchmark::DoNotOptimize(snap.get());
  }
  set_counters(state, files, keys, rows);
}
BENCHMARK(BM_LoadAndBuild)->Unit(benchmark::kMillisecond);

void BM_LoadOnly(benchmark::State& state) {
  size_t files = 0;
  for (auto _ : state) {
    store::LoadOutput out = load_once();
    files = out.report.files.size();
    benchmark::DoNotOptimize(out.inputs.data());
  }
  state.counters["files"] = static_cast<double>(files);
}
BENCHMARK(BM_LoadOnly)->Unit(benchmark::kMillisecond);

void BM_RuntimeCreate(benchmark::State& state) {
  dispatch::RuntimeOptions o;
  o.config_dirs = {config_dir()};
  o.load_shipped_configs = false;
  std::unique_ptr<dispatch::Runtime> last;
  for (auto _ : state) {
    auto rt = dispatch::Runtime::create(o);
    if (!rt.ok()) {
      state.SkipWithError(rt.status().message().c_str());
      return;
    }
    benchmark::DoNotOptimize(rt.value().get());
    last = std::move(rt.value());  // destroys the previous one, timed (as the other loads' results are)
  }
  if (last) {
    const dispatch::LoadReport rep = last->load_report();  // a copy: outside the timed loop
    set_counters(state, rep.files.size(), rep.keys, rep.rows);
  }
}
BENCHMARK(BM_RuntimeCreate)->Unit(benchmark::kMillisecond);

// ------------------------------------------------------------ floors (baselines)

std::vector<fs::path> list_json(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec) && it->path().extension() == ".json") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Reads `path` into `buf` (with simdjson's padding); returns the length or -1.
ssize_t read_whole(const fs::path& path, std::vector<char>* buf) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return -1;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (buf->size() < size + simdjson::SIMDJSON_PADDING) buf->resize(size + simdjson::SIMDJSON_PADDING);
  size_t got = 0;
  while (got < size) {
    const ssize_t r = ::read(fd, buf->data() + got, size - got);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  return static_cast<ssize_t>(got);
}

void BM_Floor_ReadFiles(benchmark::State& state) {
  std::vector<char> buf(1 << 16);
  size_t files = 0, bytes = 0;
  for (auto _ : state) {
    files = bytes = 0;
    for (const auto& f : list_json(config_dir())) {
      const ssize_t n = read_whole(f, &buf);
      if (n < 0) continue;
      ++files;
      bytes += static_cast<size_t>(n);
      benchmark::DoNotOptimize(buf.data());
    }
  }
  state.counters["files"] = static_cast<double>(files);
  state.counters["bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_Floor_ReadFiles)->Unit(benchmark::kMillisecond);

void BM_Floor_ReadParse(benchmark::State& state) {
  std::vector<char> buf(1 << 16);
  simdjson::dom::parser parser;
  size_t files = 0, parsed = 0;
  for (auto _ : state) {
    files = parsed = 0;
    for (const auto& f : list_json(config_dir())) {
      const ssize_t n = read_whole(f, &buf);
      if (n < 0) continue;
      ++files;
      simdjson::dom::element doc;
      if (parser.parse(buf.data(), static_cast<size_t>(n), false).get(doc) == simdjson::SUCCESS) ++parsed;
      benchmark::DoNotOptimize(doc);
    }
  }
  state.counters["files"] = static_cast<double>(files);
  state.counters["parsed"] = static_cast<double>(parsed);
}
BENCHMARK(BM_Floor_ReadParse)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::error_code ec;
  if (!fs::is_directory(config_dir(), ec)) {
    std::fprintf(stderr, "bench_load: config dir %s not found (set KDISPATCH_BENCH_CONFIG_DIR)\n",
                 config_dir().c_str());
    return 1;
  }
  benchmark::AddCustomContext("config_dir", config_dir());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
