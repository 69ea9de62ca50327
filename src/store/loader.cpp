// SPDX-License-Identifier: Apache-2.0
#include "store/loader.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <simdjson.h>
#include <string_view>

#include "backends/registry.hpp"
#include "store/bounded_read.hpp"
#include "store/filename.hpp"
#include "store/fingerprint.hpp"
#include "store/json_file.hpp"
#include "store/limits.hpp"
#include "store/row_meta.hpp"
#include "table/key.hpp"

namespace dispatch::store {
namespace fs = std::filesystem;
namespace {

std::optional<DeviceType> own_backend(std::string_view name) {
  auto t = parse_device_type(name);
  return t.ok() ? std::optional<DeviceType>(*t) : std::nullopt;
}

// A file's bytes with simdjson's padding readable after them, in a buffer
// reused across one load. A large file gets its own buffer, mapped with
// MAP_POPULATE (the pages made in one call, not faulted in one by one:
// read() of 125 MB into fresh heap memory took a page fault per 4 KiB page on
// every load — glibc serves buffers over 32 MB by mmap and returns them on
// free — which made a 1M-row file load 3x slower per row than a 100k-row
// one) and released as soon as the file is parsed. (Not a mapping of the
// file itself: a file truncated while mapped faults its reader.)
struct ReadBuffer {
  std::unique_ptr<char[]> bytes;
  size_t capacity = 0;
  void* map = nullptr;  ///< the current large file's buffer, or null
  size_t map_len = 0;
  char* data = nullptr;
  ReadBuffer() = default;
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;
  ~ReadBuffer() { unmap(); }
  void ensure(size_t need) {
    if (need <= capacity) return;
    capacity = std::max(need, capacity * 2);
    bytes.reset(new char[capacity]);  // default-initialised: no zeroing
  }
  void unmap() {
    if (map) ::munmap(map, map_len);
    map = nullptr;
    map_len = 0;
  }
};

constexpr size_t kOwnBufferAt = size_t{16} << 20;  // files from 16 MiB up get their own buffer

// Opened and read through the one bounded reader (store/bounded_read.hpp):
// O_NONBLOCK (a FIFO put in place of the file after the walk's stat is
// refused, never waited on), a regular file only, the size checked against
// limits().max_file_bytes before anything is allocated, and no more read
// than that size.
bool read_file(const std::string& path, ReadBuffer* buf, size_t* len, std::string* err) {
  buf->unmap();
  BoundedRead opt;
  opt.limit = limits().max_file_bytes;
  int fd = -1;
  size_t size = 0;
  switch (open_bounded_at(AT_FDCWD, path, opt, &fd, &size, err)) {
    case ReadError::ok: break;
    case ReadError::too_large:
      *err = "file is " + std::to_string(size) + " bytes, over the limit of " +
             std::to_string(limits().max_file_bytes) +
             " bytes for one config file (docs/config-files.md#limits): not read";
      return false;
    default: return false;  // *err names the file and why (missing, not a regular file, cannot open)
  }
  const size_t need = size + json_padding();
  buf->data = nullptr;
  if (size >= kOwnBufferAt) {
    void* m = ::mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m != MAP_FAILED) {
      buf->map = m;
      buf->map_len = need;
      buf->data = static_cast<char*>(m);
    }
  }
  if (buf->data == nullptr) {
    buf->ensure(need);
    buf->data = buf->bytes.get();
  }
  size_t got = 0;  // less than size when the file shrank while read: parse what is there
  const bool ok = read_fd_into(fd, buf->data, size, &got, err);
  ::close(fd);
  if (!ok) return false;
  std::memset(buf->data + got, 0, json_padding());
  *len = got;
  return true;
}

// Per-variant config-space schema versions from our metadata object
// {"kdispatch": {"schema": {"<variant>": <int>, ...}, ...}}.
std::vector<std::pair<std::string, int64_t>> schema_versions(const std::string& raw) {
  std::vector<std::pair<std::string, int64_t>> out;
  for_each_meta_member(raw, "schema", [&](std::string_view k, auto value) {
    int64_t v = 0;
    if (value.get_int64().get(v)) return false;
    out.emplace_back(std::string(k), v);
    return true;
  });
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
  std::string base, parent, grand, great;
};
// A fragment <dir>/<key>.json.d/<host>-<pid>.json (store/private_fs.hpp):
// named as its table file <dir>/<key>.json, one folder up.
void as_table_file(PathNames* n) {
  constexpr std::string_view kFrag = ".json.d";
  if (n->parent.size() <= kFrag.size() || n->parent.compare(n->parent.size() - kFrag.size(), kFrag.size(), kFrag) != 0)
    return;
  n->base = n->parent.substr(0, n->parent.size() - 2);
  n->parent = std::move(n->grand);
  n->grand = std::move(n->great);
}
PathNames path_names(const fs::path& path, bool plain_path) {
  PathNames n;
  if (!plain_path) {
    const fs::path parent = path.parent_path();
    n.base = path.filename().string();
    n.parent = parent.filename().string();
    n.grand = parent.parent_path().filename().string();
    n.great = parent.parent_path().parent_path().filename().string();
    as_table_file(&n);
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
      if (c != std::string::npos && c > 0) {
        const size_t d = native.rfind('/', c - 1);
        const size_t d0 = d == std::string::npos ? 0 : d + 1;
        n.great = native.substr(d0, c - d0);
      }
    }
  }
  as_table_file(&n);
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
// *defaulted (set when the row is kept): the params the row leaves out, which
// take their variant's defaults (defaulted_params), or "".
std::string own_row(const OwnFile& f, const Config& config, ParsedRow& row, table::TableInput::InputRow* ir,
                    std::vector<core::Plan>* plans, std::string* defaulted) {
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
  // Another device's file is not asked supports(): its key's dtype
  // combination still must be one a variant computes (the op's refusal).
  if (!f.local)
    if (Status s = core::dtypes_computed(f.problem); !s.ok()) return s.message();
  if (f.local) {
    core::Problem pm = f.problem;
    pm.m = row.m;
    if (Status s = v->supports(pm, plan->params, *f.local); !s.ok())
      return std::string(v->name) + " declines this key: " + s.message();
  }
  ir->plan = static_cast<uint32_t>(plans->size());
  plans->push_back(*plan);
  *defaulted = defaulted_params(*plan, config);
  return "";
}

// The rows of a file under <backend>/<op>/: the key from the file name,
// the fingerprint check of a tuning cache, every row resolved (own_row).
// "" or why the whole file is skipped.
std::string own_file(const SourceDir& src, const FileKey& key, const PathNames& names, core::OpKind op,
                     DeviceType backend, const std::string& device, ParsedFile& parsed, FileReport& rep,
                     table::TableInput& in) {
  if (key.down) return "_down tables exist only for triton_fused_moe, not for own op " + names.parent;
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
  if (core::is_host(backend) &&
      meta.find("\"cpu") != std::string::npos) {  // the CPU the rows were tuned on (store/row_meta.hpp)
    static thread_local simdjson::dom::parser parser;
    simdjson::dom::element kd;
    if (parser.parse(meta).get(kd) == simdjson::SUCCESS && kd.is_object()) {
      simdjson::dom::element e;
      if (kd["cpu"].get(e) == simdjson::SUCCESS && e.is_object()) in.tuned_on = row_meta_detail::restyled(e);
      simdjson::dom::object by;
      if (kd["cpu_by_m"].get(by) == simdjson::SUCCESS)
        for (auto [k, v] : by) {
          int64_t m = 0;
          if (row_meta_detail::parse_m(k, &m))
            in.tuned_on_by_m.emplace_back(m, v.is_object() ? row_meta_detail::restyled(v) : std::string());
        }
    }
  }
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
  int64_t defaulted_left_out = 0;  // rows with params left out, past the problems limit
  for (auto& row : parsed.rows) {
    table::TableInput::InputRow ir;
    ir.m = row.m;
    std::string defaulted;
    if (const std::string why = own_row(f, parsed.config(row), row, &ir, &in.plans, &defaulted); !why.empty()) {
      if (rep.problems.size() < limits().max_problems_per_file)  // a million bad rows: the first thousand listed
        rep.problems.push_back("M=" + std::to_string(row.m) + ": " + why + "; row dropped");
      ++parsed.dropped_rows;
      continue;
    }
    if (!defaulted.empty()) {  // served, and said: the row's config is not all written out
      if (rep.problems.size() < limits().max_problems_per_file)
        rep.problems.push_back("M=" + std::to_string(row.m) + ": " + defaulted);
      else
        ++defaulted_left_out;
    }
    ir.config = row.config;
    in.rows.push_back(std::move(ir));
  }
  if (defaulted_left_out > 0)
    rep.problems.push_back("... and " + std::to_string(defaulted_left_out) +
                           " more rows that leave params out (served with their variant's defaults)");
  in.configs = std::move(parsed.configs);  // rows keep their indices (a dropped row's config stays unused)
  return "";
}

// The rows of an engine's table (SGLang/vLLM fused-MoE or block-fp8 GEMM),
// kept as written. "" or why the file is skipped.
std::string foreign_file(const FileKey& key, const std::string& device, ParsedFile& parsed, table::TableInput& in) {
  std::string op;
  if (find_field(key.fields, "E"))
    op = kTritonFusedMoe;
  else if (find_field(key.fields, "N") && find_field(key.fields, "K"))
    op = kTritonGemm;
  else
    return "file name fields match no known table kind (need E=.. for triton_fused_moe or N=..,K=.. for triton_gemm)";
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

// Returns false when the file could not be read (an I/O error: EMFILE, EIO,
// a permission): such a result is not cached, so the next reload retries.
bool load_file(const SourceDir& src, const fs::path& path, bool symlink, const std::vector<DeviceAlias>& aliases,
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
    return true;
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
  if (!read_file(path.string(), buf, &len, &err)) {
    skip(err);
    return false;  // not cached: the next reload reads it again
  }
  ParsedFile parsed = parse_config_json(buf->data, len);
  buf->unmap();  // a large file's mapping goes as soon as it is parsed
  if (parsed.kind == ParsedFile::Kind::error) {
    rep.problems = std::move(parsed.problems);
    rep.state = FileReport::State::skipped;
    out->report.files.push_back(std::move(rep));
    return true;
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
  if (rep.problems.size() > limits().max_problems_per_file + 1) {
    const size_t more = rep.problems.size() - limits().max_problems_per_file;
    rep.problems.resize(limits().max_problems_per_file);
    rep.problems.push_back("... and " + std::to_string(more) + " more problems listed past the limit of " +
                           std::to_string(limits().max_problems_per_file));
  }
  rep.metadata = std::move(parsed.metadata);
  rep.rows = static_cast<int32_t>(in.rows.size());
  if (in.rows.empty()) return skip("no usable rows");
  rep.state = parsed.dropped_rows > 0 ? FileReport::State::partial : FileReport::State::loaded;
  in.source_id = intern(src.dir, rep.path);
  in.serial = table::next_serial();
  out->inputs.push_back(std::make_shared<const table::TableInput>(std::move(in)));
  out->report.files.push_back(std::move(rep));
  return true;
}

struct Found {
  std::string path;  // the config dir, '/', the path under it
  bool symlink;      // from the entry's type (readdir): no syscall
  FileCache::Sig sig;
};

// An entry under a config dir that cannot be used: reported as a skipped
// file (so `validate` fails and the load report names it), never silently
// passed over.
void unusable(const SourceDir& src, const fs::path& path, const std::string& why, LoadOutput* out) {
  // (a cold path: fs::path's lexical helpers are fine here)
  FileReport rep;
  rep.dir = src.dir;
  const fs::path r = path.lexically_relative(src.dir);
  rep.path = r.empty() || *r.begin() == ".." ? path.generic_string() : r.generic_string();
  rep.state = FileReport::State::skipped;
  rep.problems.push_back(why);
  out->report.files.push_back(std::move(rep));
}

FileCache::Sig file_sig(const struct stat& st) {
  return FileCache::Sig{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                        static_cast<int64_t>(st.st_size),
                        static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                        static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
}

// One walk of a config dir: the entries examined so far (limits().max_entries_per_dir).
struct Walk {
  const SourceDir& src;
  std::vector<Found>* files;
  LoadOutput* out;
  int64_t entries = 0;
  bool stopped = false;
};

// Collects the *.json regular files under `dir` (names starting with '.'
// are editor and writer temp files: passed over). Reported: a folder that
// cannot be read (the config dir itself included), a folder deeper than
// limits().max_dir_depth, a directory symbolic link (not followed: a tree is
// read without leaving it through links), a *.json entry that is not a
// readable regular file (a dangling or looping link, a FIFO, a socket, a
// device, a directory), and a tree past limits().max_entries_per_dir
// entries (the walk stops). POSIX directory streams: the entry's type from
// readdir and one fstatat() relative to the folder per entry (it follows a
// link) give the type and the FileCache signature without a full path
// lookup per file (a reload of an unchanged 10,000-file tree is mostly
// this walk).
void walk_dir(Walk& w, const std::string& dir, int depth) {
  const SourceDir& src = w.src;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    const std::error_code ec(errno, std::generic_category());
    if (depth == 0) {
      // A config dir that went away (hot reload) or a cache dir not made
      // yet: a note. One that cannot be read: a note and an unusable entry.
      w.out->report.notes.push_back("config dir '" + src.dir + "' cannot be read: " + ec.message());
      if (ec == std::errc::no_such_file_or_directory || src.check_fingerprint) return;
    }
    unusable(src, dir, "folder cannot be read: " + ec.message() + " (nothing under it is loaded)", w.out);
    return;
  }
  const int dfd = ::dirfd(d);
  const std::string prefix = dir.empty() || dir.back() == '/' ? dir : dir + '/';
  // The folder's entries, sorted by name before any is looked at: the walk
  // then yields paths in fs::path order (component-wise) without a sort of
  // whole paths afterwards. Names live in one buffer.
  struct Ent {
    size_t at, len;
    unsigned char type;
  };
  std::vector<Ent> ents;
  std::string names;
  for (;;) {
    errno = 0;
    const struct dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0)
        unusable(src, dir, "folder listing failed: " + std::error_code(errno, std::generic_category()).message(),
                 w.out);
      break;
    }
    if (e->d_name[0] == '.') continue;  // ".", "..", hidden and temp files
    if (++w.entries > limits().max_entries_per_dir) {
      w.stopped = true;
      unusable(src, src.dir,
               "more than " + std::to_string(limits().max_entries_per_dir) +
                   " entries under this config dir (docs/config-files.md#limits): the walk stopped there; "
                   "files not reached are not loaded",
               w.out);
      break;
    }
    const size_t len = std::strlen(e->d_name);
    ents.push_back(Ent{names.size(), len, e->d_type});
    names.append(e->d_name, len + 1);  // with its '\0'
  }
  std::sort(ents.begin(), ents.end(), [&](const Ent& a, const Ent& b) {
    const int c = std::memcmp(names.data() + a.at, names.data() + b.at, std::min(a.len, b.len));
    return c != 0 ? c < 0 : a.len < b.len;
  });
  for (const Ent& ent : ents) {
    if (w.stopped) break;  // a folder below hit the entry limit
    const char* name = names.data() + ent.at;
    const size_t name_len = ent.len;
    const bool json = name_len > 5 && std::memcmp(name + name_len - 5, ".json", 5) == 0;
    bool link = ent.type == DT_LNK;
    if (ent.type == DT_UNKNOWN) {  // filesystems that do not fill d_type
      struct stat lst {};
      link = ::fstatat(dfd, name, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode);
    }
    // Only *.json entries, links and folders matter: a plain file of
    // another name needs no stat.
    if (!json && !link && ent.type != DT_DIR && ent.type != DT_UNKNOWN) continue;
    std::string path;  // one allocation per entry that matters
    path.reserve(prefix.size() + name_len);
    path.append(prefix).append(name, name_len);
    struct stat st {};
    if (::fstatat(dfd, name, &st, 0) != 0) {
      const int err = errno;
      if (json || link) {
        const std::string what = err == ELOOP ? "a symbolic link loop"
                                 : link       ? "a dangling symbolic link"
                                              : "cannot be examined";
        unusable(src, path, what + ": " + std::error_code(err, std::generic_category()).message(), w.out);
      }
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      if (link) {
        unusable(src, path,
                 "a symbolic link to a directory: not followed (copy the files, or name the "
                 "target as a config dir)",
                 w.out);
      } else if (depth + 1 > limits().max_dir_depth) {
        unusable(src, path, "folder deeper than " + std::to_string(limits().max_dir_depth) + " levels: not read",
                 w.out);
      } else {
        walk_dir(w, path, depth + 1);
      }
      continue;
    }
    if (!json) continue;
    if (!S_ISREG(st.st_mode)) {
      const char* kind = S_ISFIFO(st.st_mode)                         ? "a FIFO"
                         : S_ISSOCK(st.st_mode)                       ? "a socket"
                         : S_ISBLK(st.st_mode) || S_ISCHR(st.st_mode) ? "a device"
                                                                      : "not a file";
      unusable(src, path, std::string(kind) + ", not a regular file", w.out);
      continue;
    }
    FileCache::Sig sig = file_sig(st);
    if (link) {
      // A link retargeted to another name of the same file changes the
      // report's path: the link's own inode and ctime are in the signature.
      struct stat lst {};
      if (::fstatat(dfd, name, &lst, AT_SYMLINK_NOFOLLOW) == 0) {
        sig.link_ino = static_cast<uint64_t>(lst.st_ino);
        sig.link_ctime_ns = static_cast<int64_t>(lst.st_ctim.tv_sec) * 1'000'000'000 + lst.st_ctim.tv_nsec;
      }
    }
    w.files->push_back(Found{std::move(path), link, sig});
  }
  ::closedir(d);
}

int64_t now_ns() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

std::string defaulted_params(const core::Plan& plan, const Config& row) {
  if (!plan.valid()) return "";
  std::string names, values;
  for (size_t i = 0; i < plan.variant->params.size(); ++i) {
    const core::ParamDef& pd = plan.variant->params[i];
    if (config_find(row, std::string(pd.name)) != nullptr) continue;
    const int64_t v = plan.params[i];
    std::string text;
    switch (pd.kind) {
      case core::ParamKind::integer: text = std::to_string(v); break;
      case core::ParamKind::boolean: text = v != 0 ? "true" : "false"; break;
      case core::ParamKind::enumeration:
        text = v >= 0 && static_cast<size_t>(v) < pd.labels.size() ? std::string(pd.labels[static_cast<size_t>(v)])
                                                                   : std::to_string(v);
        break;
    }
    names += (names.empty() ? "" : ", ") + std::string(pd.name);
    values += (values.empty() ? "" : ", ") + std::string(pd.name) + "=" + text;
  }
  if (names.empty()) return "";
  return names + " not in the row: " + std::string(plan.variant->name) + "'s defaults serve (" + values + ")";
}

LoadOutput load_config_dirs(const std::vector<SourceDir>& dirs, const std::vector<DeviceAlias>& aliases,
                            const InternFn& intern, FileCache* cache) {
  LoadOutput out;
  ReadBuffer buf;
  FileCache next;
  if (cache) next.files.reserve(cache->files.size() + 16);  // no rehash while it fills
  const int64_t started = now_ns();
  for (const auto& src : dirs) {
    std::vector<Found> files;
    const size_t unusable_from = out.report.files.size();
    Walk walk{src, &files, &out};
    walk_dir(walk, src.dir, 0);  // in fs::path order: each folder's entries sorted by name
    if (static_cast<int64_t>(files.size()) > limits().max_files_per_dir) {
      // Each file past the limit gets its entry (not read): the report
      // keeps one entry per *.json file, and a reload keeps the rows such
      // a file served before.
      const std::string why = "not loaded: the config dir holds " + std::to_string(files.size()) +
                              " *.json files, over the limit of " + std::to_string(limits().max_files_per_dir) +
                              " (docs/config-files.md#limits); the first " +
                              std::to_string(limits().max_files_per_dir) + " in path order are loaded";
      for (size_t k = static_cast<size_t>(limits().max_files_per_dir); k < files.size(); ++k)
        unusable(src, files[k].path, why, &out);
      files.resize(limits().max_files_per_dir);
    }
    if (walk.stopped) out.incomplete_dirs.push_back(src.dir);
    std::sort(out.report.files.begin() + static_cast<std::ptrdiff_t>(unusable_from), out.report.files.end(),
              [](const FileReport& a, const FileReport& b) { return a.path < b.path; });  // in a stable order
    out.report.files.reserve(out.report.files.size() + files.size());                     // one entry per file
    out.inputs.reserve(out.inputs.size() + files.size());                                 // at most one per file
    const std::string cache_suffix = '\n' + std::to_string(src.rank);                     // one dir may be listed twice
    for (const Found& found : files) {
      std::string cache_key;
      if (cache) {
        cache_key = found.path + cache_suffix;
        if (auto it = cache->files.find(cache_key); it != cache->files.end() && it->second.sig == found.sig) {
          if (it->second.input) out.inputs.push_back(it->second.input);
          out.report.files.push_back(it->second.report);
          ++out.files_reused;
          next.files.insert(cache->files.extract(it));
          continue;
        }
      }
      const size_t inputs_before = out.inputs.size();
      const fs::path f(found.path);
      bool cacheable = true;
      try {
        buf.ensure(64 * 1024);
        cacheable = load_file(src, f, found.symlink, aliases, intern, &buf, &out);
        ++out.files_read;
      } catch (const std::exception& e) {
        FileReport rep;
        rep.dir = src.dir;
        rep.path = f.generic_string();
        rep.state = FileReport::State::skipped;
        rep.problems.push_back(std::string("internal error while loading: ") + e.what());
        out.report.files.push_back(std::move(rep));
        continue;
      }
      // Cached unless changed within limits().racy_ns of this load (see FileCache).
      const int64_t changed = std::max(found.sig.mtime_ns, found.sig.ctime_ns);
      if (cache && cacheable && started - changed > limits().racy_ns) {
        FileCache::Entry entry{found.sig, out.report.files.back(), nullptr};
        if (out.inputs.size() > inputs_before) entry.input = out.inputs.back();
        next.files.emplace(std::move(cache_key), std::move(entry));
      }
    }
  }
  if (cache) *cache = std::move(next);
  return out;
}

}  // namespace dispatch::store
