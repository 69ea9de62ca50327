// SPDX-License-Identifier: Apache-2.0
#include "store/loader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <simdjson.h>
#include <string_view>

#include "backends/registry.hpp"
#include "store/filename.hpp"
#include "store/fingerprint.hpp"
#include "store/json_file.hpp"
#include "table/key.hpp"

namespace dispatch::store {
namespace fs = std::filesystem;
namespace {

std::optional<DeviceType> own_backend(std::string_view name) {
  auto t = parse_device_type(name);
  return t.ok() ? std::optional<DeviceType>(*t) : std::nullopt;
}

// Reads a whole file into `buf` (with simdjson padding after it).
// A read buffer that is not zero-filled when it grows (a 125 MB file was
// written twice: memset, then read).
struct ReadBuffer {
  std::unique_ptr<char[]> bytes;
  size_t capacity = 0;
  char* data() { return bytes.get(); }
  void ensure(size_t need) {
    if (need <= capacity) return;
    capacity = std::max(need, capacity * 2);
    bytes.reset(new char[capacity]);  // default-initialised: no zeroing
  }
};

bool read_file(const std::string& path, ReadBuffer* buf, size_t* len, std::string* err) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *err = std::string("cannot open: ") + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *err = std::string("cannot stat: ") + std::strerror(errno);
    ::close(fd);
    return false;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const size_t need = size + json_padding();
  buf->ensure(need);
  size_t got = 0;
  while (got < size) {
    const ssize_t r = ::read(fd, buf->data() + got, size - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      *err = std::string("read error: ") + std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (r == 0) break;  // file shrank while reading: parse what is there
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  std::memset(buf->data() + got, 0, json_padding());
  *len = got;
  return true;
}

// Per-variant config-space schema versions from our metadata object
// {"kdispatch": {"schema": {"<variant>": <int>, ...}, ...}}.
std::vector<std::pair<std::string, int64_t>> schema_versions(const std::string& raw) {
  std::vector<std::pair<std::string, int64_t>> out;
  simdjson::padded_string json(raw);
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  if (parser.iterate(json).get(doc)) return out;
  simdjson::ondemand::object schema;
  if (doc["schema"].get_object().get(schema)) return out;
  for (auto f : schema) {
    std::string_view k;
    int64_t v = 0;
    if (f.unescaped_key().get(k) || f.value().get_int64().get(v)) break;
    out.emplace_back(std::string(k), v);
  }
  return out;
}

// The file's path relative to its config dir, as the report names it.
// `path` is src.dir / <rel> as the directory walk built it, so <rel> is its
// lexical remainder. fs::relative would canonicalise both sides (a readlink
// syscall per path component, most of the load's system time:
// bench/bench_load.cpp); it stays for a symlinked file, whose report path it
// resolves to the link's target.
std::string report_path(const SourceDir& src, const fs::path& path, bool symlink, bool plain_path) {
  const std::string& native = path.native();
  std::string rel;
  if (!symlink && plain_path && !src.dir.empty() && native.size() > src.dir.size() &&
      native.compare(0, src.dir.size(), src.dir) == 0) {
    // What lexically_relative answers here, by string: src.dir, a separator, the rest.
    const size_t from = src.dir.back() == '/' ? src.dir.size() : src.dir.size() + 1;
    if (from == src.dir.size() || native[src.dir.size()] == '/') rel = native.substr(from);
  }
  if (rel.empty() && !symlink) {
    const fs::path r = path.lexically_relative(src.dir);
    if (!r.empty() && *r.begin() != "..") rel = r.generic_string();
  }
  if (rel.empty()) {
    std::error_code ec;
    rel = fs::relative(path, src.dir, ec).generic_string();
    if (ec || rel.empty()) rel = path.generic_string();
  }
  return rel;
}

// The file name, its folder and the folder above: what path.filename(),
// parent_path().filename() and parent_path().parent_path().filename()
// answer, found by string search on a plain path (fs::path splits the path
// anew on every call: bench/bench_load.cpp); fs::path otherwise.
struct PathNames {
  std::string base, parent, grand;
};
PathNames path_names(const fs::path& path, bool plain_path) {
  PathNames n;
  if (!plain_path) {
    const fs::path parent = path.parent_path();
    n.base = path.filename().string();
    n.parent = parent.filename().string();
    n.grand = parent.parent_path().filename().string();
    return n;
  }
  const std::string& native = path.native();
  const size_t a = native.rfind('/');
  n.base = native.substr(a == std::string::npos ? 0 : a + 1);
  if (a != std::string::npos && a > 0) {
    const size_t b = native.rfind('/', a - 1);
    const size_t b0 = b == std::string::npos ? 0 : b + 1;
    n.parent = native.substr(b0, a - b0);
    if (b != std::string::npos && b > 0) {
      const size_t c = native.rfind('/', b - 1);
      const size_t c0 = c == std::string::npos ? 0 : c + 1;
      n.grand = native.substr(c0, b - c0);
    }
  }
  return n;
}

// One row of an own-op file as a plan: the variant exists and takes the
// row's params (when the backend is compiled in), its config schema is the
// file's, it computes the key's dtype and, on the local device, accepts
// the key. "" or why the row is dropped.
struct OwnFile {
  core::OpKind op;
  DeviceType backend;
  core::Problem problem;
  std::vector<std::pair<std::string, int64_t>> schema;
  bool compiled = false;
  const DeviceInfo* local = nullptr;  ///< the local device when it is the file's, else null
};
std::string own_row(const OwnFile& f, const Config& config, ParsedRow& row, table::TableInput::InputRow* ir) {
  if (!f.compiled) {
    const ConfigValue* vn = config_find(config, "variant");
    if (!vn || vn->kind != ConfigValue::Kind::string) return "row has no \"variant\"";
    return "";
  }
  auto plan = core::plan_from_config(config, f.op, f.backend);
  if (!plan.ok()) return plan.status().message();
  const core::VariantDef* v = plan->variant;
  for (const auto& [vn, ver] : f.schema)
    if (vn == v->name && ver != v->schema_version)
      return "variant " + std::string(v->name) + " has config schema " + std::to_string(v->schema_version) +
             " but the file was written for another";
  if (v->in_dtype != f.problem.in_dtype)
    return "variant " + std::string(v->name) + " computes " + std::string(dtype_name(v->in_dtype)) + ", the key is " +
           std::string(dtype_name(f.problem.in_dtype));
  if (f.local) {
    core::Problem pm = f.problem;
    pm.m = row.m;
    if (Status s = v->supports(pm, plan->params, *f.local); !s.ok())
      return std::string(v->name) + " declines this key: " + s.message();
  }
  ir->plan = *plan;
  return "";
}

// The rows of a file under <backend>/<op>/: the key from the file name,
// the fingerprint check of a tuning cache, every row resolved (own_row).
// "" or why the whole file is skipped.
std::string own_file(const SourceDir& src, const FileKey& key, const PathNames& names, core::OpKind op,
                     DeviceType backend, const std::string& device, ParsedFile& parsed, FileReport& rep,
                     table::TableInput& in) {
  if (key.down) return "_down tables exist only for fused_moe, not for own op " + names.parent;
  auto prob = own_problem_from_fields(op, key.fields);
  if (!prob.ok()) return "file name: " + prob.status().message();
  OwnFile f{op, backend, *prob, {}, core::backend_compiled(backend), nullptr};
  f.problem.device = Device{backend, 0};
  table::KeyBuffer kb;
  table::build_own_key(f.problem, names.grand, device, &kb);
  if (kb.overflow) return "key longer than " + std::to_string(table::kMaxKeyBytes) + " bytes";
  in.key = std::string(kb.view());
  in.has_own_key = true;
  in.own_key = table::make_own_key(f.problem, table::key_hash(device));
  in.device_name = device;
  std::string meta;
  for (const auto& [mk, raw] : parsed.metadata)
    if (mk == "kdispatch") meta = raw;
  if (!meta.empty()) f.schema = schema_versions(meta);
  if (src.check_fingerprint) {
    // A persisted tuning result is served only while every axis of its
    // validity fingerprint matches this process.
    const Fingerprint* now = backend_fingerprint(backend);
    if (now == nullptr) return "tuning result for backend '" + names.grand + "' with no local device to check it on";
    const std::string why = fingerprint_mismatch(parse_fingerprint(meta), *now);
    if (!why.empty()) {
      rep.stale = true;
      return "stale tuning result, not served: " + why;
    }
  }
  if (!f.compiled)
    rep.problems.push_back("backend '" + names.grand +
                           "' is not compiled into this build: rows kept for lookup, not checked against variants");
  const DeviceInfo* local = core::local_device_info(backend);
  if (f.compiled && local && local->device_name == device) f.local = local;
  for (auto& row : parsed.rows) {
    table::TableInput::InputRow ir;
    ir.m = row.m;
    if (const std::string why = own_row(f, parsed.config(row), row, &ir); !why.empty()) {
      rep.problems.push_back("M=" + std::to_string(row.m) + ": " + why + "; row dropped");
      ++parsed.dropped_rows;
      continue;
    }
    ir.config = row.config;
    in.rows.push_back(std::move(ir));
  }
  in.configs = std::move(parsed.configs);  // rows keep their indices (a dropped row's config stays unused)
  return "";
}

// The rows of an engine's table (SGLang/vLLM fused-MoE or block-fp8 GEMM),
// kept as written. "" or why the file is skipped.
std::string foreign_file(const FileKey& key, const std::string& device, ParsedFile& parsed, table::TableInput& in) {
  std::string op;
  if (find_field(key.fields, "E")) op = "fused_moe";
  else if (find_field(key.fields, "N") && find_field(key.fields, "K")) op = "triton_gemm";
  else return "file name fields match no known table kind (need E=.. for fused_moe or N=..,K=.. for triton_gemm)";
  in.key = table::make_key(table::kForeignBackend, op, device, join_fields(key.fields), key.down);
  in.configs = std::move(parsed.configs);  // rows keep their indices: no config copied
  for (auto& row : parsed.rows) {
    table::TableInput::InputRow ir;
    ir.m = row.m;
    ir.config = row.config;
    in.rows.push_back(std::move(ir));
  }
  return "";
}

void load_file(const SourceDir& src, const fs::path& path, bool symlink, const std::vector<DeviceAlias>& aliases,
               const InternFn& intern, ReadBuffer* buf, LoadOutput* out) {
  FileReport rep;
  rep.dir = src.dir;
  const std::string& native = path.native();
  const bool plain_path = !native.empty() && native.back() != '/' && native.find("//") == std::string::npos;
  rep.path = report_path(src, path, symlink, plain_path);
  auto skip = [&](std::string why) {
    rep.state = FileReport::State::skipped;
    rep.problems.insert(rep.problems.begin(), std::move(why));
    out->report.files.push_back(std::move(rep));
  };
  const PathNames names = path_names(path, plain_path);
  auto key_r = parse_file_name(names.base);
  if (!key_r.ok()) return skip("file name is not a config key: " + key_r.status().message());
  FileKey key = std::move(key_r.value());

  // Where the file sits: <backend>/<op>/ for own ops, triton_X_Y_Z/ for versions.
  std::optional<core::OpKind> own_op;
  std::optional<DeviceType> backend = own_backend(names.grand);
  if (backend) own_op = core::parse_op(names.parent);
  std::vector<int> version;
  const bool versioned = !own_op && parse_version_folder(names.parent, &version);

  size_t len = 0;
  std::string err;
  if (!read_file(path.string(), buf, &len, &err)) return skip(err);
  ParsedFile parsed = parse_config_json(buf->data(), len);
  if (parsed.kind == ParsedFile::Kind::error) {
    rep.problems = std::move(parsed.problems);
    rep.state = FileReport::State::skipped;
    out->report.files.push_back(std::move(rep));
    return;
  }
  if (parsed.kind == ParsedFile::Kind::foreign) {
    std::string why = parsed.problems.empty() ? "not a config table" : parsed.problems.front();
    return skip("foreign JSON layout, skipped: " + why);
  }
  if (!key.has_device_name) return skip("file name has no device_name field");

  bool known = false;
  const std::string device = canonical_file_device_name(key.device_name, aliases, &known);
  if (!known) {
    rep.unknown_device = true;
    rep.problems.push_back("device name '" + key.device_name +
                           "' matches no known device (served only to a device reporting exactly that name)");
  }
  table::TableInput in;
  in.source_rank = src.rank;
  in.versioned = versioned;
  in.version = version;
  if (versioned) in.version_folder = names.parent;
  in.path = rep.path;
  in.rows.reserve(parsed.rows.size());
  const std::string why = own_op ? own_file(src, key, names, *own_op, *backend, device, parsed, rep, in)
                                 : foreign_file(key, device, parsed, in);
  if (!why.empty()) return skip(why);

  for (auto& p : parsed.problems) rep.problems.push_back(std::move(p));
  rep.metadata = std::move(parsed.metadata);
  rep.rows = static_cast<int32_t>(in.rows.size());
  if (in.rows.empty()) return skip("no usable rows");
  rep.state = parsed.dropped_rows > 0 ? FileReport::State::partial : FileReport::State::loaded;
  in.source_id = intern(src.dir, rep.path);
  out->inputs.push_back(std::move(in));
  out->report.files.push_back(std::move(rep));
}

struct Found {
  std::string order;  // the path with '/' -> '\0': sorts as fs::path compares, component-wise
  fs::path path;
  bool symlink;       // from the entry's cached type: no syscall
};

/// Deepest folder level read below a config dir (SGLang's trees are 2-3
/// deep); deeper folders are reported, not read.
constexpr int kMaxDirDepth = 16;

// An entry under a config dir that cannot be used: reported as a skipped
// file (so `validate` fails and the load report names it), never silently
// passed over.
void unusable(const SourceDir& src, const fs::path& path, const std::string& why, LoadOutput* out) {
  FileReport rep;
  rep.dir = src.dir;
  const fs::path r = path.lexically_relative(src.dir);
  rep.path = r.empty() || *r.begin() == ".." ? path.generic_string() : r.generic_string();
  rep.state = FileReport::State::skipped;
  rep.problems.push_back(why);
  out->report.files.push_back(std::move(rep));
}

bool json_name(const std::string& name) {
  return name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0;
}

// Collects the *.json regular files under `dir` (names starting with '.'
// are editor and writer temp files: passed over). Reported: a folder that
// cannot be read (the config dir itself included), a folder deeper than
// kMaxDirDepth, a directory symbolic link (not followed: a tree is read
// without leaving it through links), and a *.json entry that is not a
// readable regular file (a dangling or looping link, a FIFO, a socket, a
// device, a directory).
void walk_dir(const SourceDir& src, const fs::path& dir, int depth, std::vector<Found>* files, LoadOutput* out) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    if (depth == 0) {
      // A config dir that went away (hot reload) or a cache dir not made
      // yet: a note. One that cannot be read: a note and an unusable entry.
      out->report.notes.push_back("config dir '" + src.dir + "' cannot be read: " + ec.message());
      if (ec == std::errc::no_such_file_or_directory || src.check_fingerprint) return;
    }
    unusable(src, dir, "folder cannot be read: " + ec.message() + " (nothing under it is loaded)", out);
    return;
  }
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) {
      unusable(src, dir, "folder listing failed: " + ec.message(), out);
      return;
    }
    const fs::directory_entry& e = *it;
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::error_code lec, sec;
    const bool link = e.is_symlink(lec);
    const fs::file_status st = e.status(sec);  // follows a link
    const bool json = json_name(name);
    if (sec || st.type() == fs::file_type::not_found) {
      if (json || link) {
        const std::string what = sec == std::errc::too_many_symbolic_link_levels ? "a symbolic link loop"
                                 : link ? "a dangling symbolic link"
                                        : "cannot be examined";
        unusable(src, e.path(), what + (sec ? ": " + sec.message() : std::string()), out);
      }
      continue;
    }
    if (fs::is_directory(st)) {
      if (link) {
        unusable(src, e.path(), "a symbolic link to a directory: not followed (copy the files, or name the "
                                "target as a config dir)", out);
      } else if (depth + 1 > kMaxDirDepth) {
        unusable(src, e.path(), "folder deeper than " + std::to_string(kMaxDirDepth) + " levels: not read", out);
      } else {
        walk_dir(src, e.path(), depth + 1, files, out);
      }
      continue;
    }
    if (!json) continue;
    if (!fs::is_regular_file(st)) {
      const char* kind = fs::is_fifo(st) ? "a FIFO" : fs::is_socket(st) ? "a socket"
                       : fs::is_block_file(st) || fs::is_character_file(st) ? "a device" : "not a file";
      unusable(src, e.path(), std::string(kind) + ", not a regular file", out);
      continue;
    }
    std::string order = e.path().native();
    std::replace(order.begin(), order.end(), '/', '\0');
    files->push_back(Found{std::move(order), e.path(), link});
  }
}

}  // namespace

LoadOutput load_config_dirs(const std::vector<SourceDir>& dirs, const std::vector<DeviceAlias>& aliases,
                            const InternFn& intern) {
  LoadOutput out;
  ReadBuffer buf;
  buf.ensure(64 * 1024);
  for (const auto& src : dirs) {
    std::vector<Found> files;
    const size_t unusable_from = out.report.files.size();
    walk_dir(src, fs::path(src.dir), 0, &files, &out);
    std::sort(out.report.files.begin() + static_cast<std::ptrdiff_t>(unusable_from), out.report.files.end(),
              [](const FileReport& a, const FileReport& b) { return a.path < b.path; });  // in a stable order
    // The order of fs::path's operator<, on plain strings: path::compare
    // splits both paths into components on every call (bench/bench_load.cpp).
    std::sort(files.begin(), files.end(), [](const Found& a, const Found& b) { return a.order < b.order; });
    out.report.files.reserve(out.report.files.size() + files.size());  // one entry per file
    out.inputs.reserve(out.inputs.size() + files.size());              // at most one per file
    for (const Found& found : files) {
      const fs::path& f = found.path;
      try {
        load_file(src, f, found.symlink, aliases, intern, &buf, &out);
      } catch (const std::exception& e) {
        FileReport rep;
        rep.dir = src.dir;
        rep.path = f.generic_string();
        rep.state = FileReport::State::skipped;
        rep.problems.push_back(std::string("internal error while loading: ") + e.what());
        out.report.files.push_back(std::move(rep));
      }
    }
  }
  return out;
}

}  // namespace dispatch::store
