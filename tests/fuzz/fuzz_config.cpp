// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness over the config store's in-memory parts: the file-name
// grammar and the JSON row parser, then what the loader does with a parsed
// own-op row (key fields -> Problem, row -> Plan, the variant's supports()).
// No file system, no Runtime: the loader's pure layers only.
//
// Input layout (text, so seeds are readable): the first line is the file's
// path relative to a config dir ("cpu/gemm/N=64,K=64,device_name=cpu,dtype=f32.json",
// "triton_3_4_0/E=8,N=14336,device_name=NVIDIA_H200.json"); the rest is the
// file's content. An input without a newline is a file name only.
//
// Invariants checked (abort = a finding, besides every ASan/UBSan report):
//  - every row's config index is inside the file's config pool;
//  - no M appears twice among a file's rows;
//  - an unparsable file reports at least one problem;
//  - a parsed name re-joined and re-parsed gives the same fields;
//  - a row accepted as a Plan names a variant of the file's op whose
//    supports() is callable on the key with that row's M.
// Build: cmake --preset fuzz && cmake --build --preset fuzz (clang only).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "backends/registry.hpp"
#include "core/op.hpp"
#include "store/filename.hpp"
#include "store/json_file.hpp"

namespace {

using namespace dispatch;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_config: invariant broken: %s\n", what);
  std::abort();
}

// "a/b/c.json" -> {grand "a", parent "b", base "c.json"}.
void split_path(std::string_view path, std::string_view* grand, std::string_view* parent, std::string_view* base) {
  *grand = *parent = {};
  size_t s = path.rfind('/');
  *base = s == std::string_view::npos ? path : path.substr(s + 1);
  if (s == std::string_view::npos) return;
  std::string_view dir = path.substr(0, s);
  s = dir.rfind('/');
  *parent = s == std::string_view::npos ? dir : dir.substr(s + 1);
  if (s != std::string_view::npos) {
    std::string_view up = dir.substr(0, s);
    size_t g = up.rfind('/');
    *grand = g == std::string_view::npos ? up : up.substr(g + 1);
  }
}

void check_name(std::string_view base) {
  auto key = store::parse_file_name(base);
  if (key.ok() && !key->fields.empty()) {
    // The canonical field string re-parses to the same fields.
    auto again = store::parse_key_fields(store::join_fields(key->fields));
    if (!again.ok()) finding("a parsed file name's canonical fields do not re-parse");
    store::Fields sorted = *again;
    store::sort_fields(sorted);
    if (sorted != key->fields) finding("a parsed file name's canonical fields re-parse to other fields");
  }
  (void)store::parse_key_fields(base);
}

void check_own_rows(const store::FileKey& key, core::OpKind op, const store::ParsedFile& pf) {
  auto prob = store::own_problem_from_fields(op, key.fields);
  if (!prob.ok()) return;
  const DeviceInfo* local = core::local_device_info(DeviceType::cpu);
  for (const auto& row : pf.rows) {
    auto plan = core::plan_from_config(pf.config(row), op, DeviceType::cpu);
    if (!plan.ok()) continue;
    if (plan->variant == nullptr) finding("a Plan without a variant");
    core::Problem pm = *prob;
    pm.m = row.m;
    if (local) (void)plan->variant->supports(pm, plan->params, *local);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* text = reinterpret_cast<const char*>(data);
  const void* nl = std::memchr(text, '\n', size);
  if (nl == nullptr) {
    check_name(std::string_view(text, size));
    return 0;
  }
  const size_t name_len = static_cast<const char*>(nl) - text;
  std::string_view grand, parent, base;
  split_path(std::string_view(text, name_len), &grand, &parent, &base);
  check_name(base);
  std::vector<int> version;
  (void)store::parse_version_folder(parent, &version);
  (void)store::parse_runtime_version(parent, &version);

  // The body with the padding simdjson reads past its end.
  const size_t len = size - name_len - 1;
  std::vector<char> buf(len + store::json_padding());
  if (len) std::memcpy(buf.data(), text + name_len + 1, len);
  const store::ParsedFile pf = store::parse_config_json(buf.data(), len);

  if (pf.kind == store::ParsedFile::Kind::error && pf.problems.empty()) finding("an unparsable file without a problem");
  std::set<int64_t> seen;
  for (const auto& row : pf.rows) {
    if (row.config >= pf.configs.size()) finding("a row's config index outside the file's pool");
    if (!seen.insert(row.m).second) finding("one M twice among a file's rows");
  }
  if (pf.kind != store::ParsedFile::Kind::table) return 0;
  auto key = store::parse_file_name(base);
  if (!key.ok() || grand != "cpu") return 0;
  if (auto op = core::parse_op(parent)) check_own_rows(*key, *op, pf);
  return 0;
}
