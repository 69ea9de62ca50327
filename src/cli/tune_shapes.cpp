// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch tune`'s shapes: what a run tunes. A shape list
// (kdispatch's misses CSV, aiter's untuned CSVs: read_shape_csv) has rows;
// the rows of --op become jobs (a key of the op, in file-name order, at one
// M; describe_key checks it), the rest are left out (another op's rows) or
// reported (not tunable here, or a row of --op without its dims). --model
// takes the units of a model's unit table (tune_model.cpp) instead, each
// the job a row of its key would be. Then --shard keeps its units, and
// --list prints them. (tune_impl.hpp: the other pieces.)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "cli/cli.hpp"
#include "cli/op_util.hpp"
#include "cli/shard.hpp"
#include "cli/tune_impl.hpp"
#include "core/op_spec.hpp"
#include "store/bounded_read.hpp"

namespace kdispatch_cli {

using namespace tune_detail;

// ---------------------------------------------------------------- shape CSVs

namespace {

// The fields of one CSV line (RFC 4180: a field in double quotes may hold
// commas, as the misses CSV's key column does).
std::vector<std::string_view> split_csv_line(std::string_view l) {
  std::vector<std::string_view> f;
  size_t start = 0;
  while (true) {
    size_t from = start;
    while (from < l.size() && l[from] == ' ') ++from;
    if (from < l.size() && l[from] == '"') {
      const size_t close = l.find('"', from + 1);
      if (close != std::string_view::npos) {
        f.push_back(l.substr(from + 1, close - from - 1));
        const size_t comma = l.find(',', close);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
        continue;
      }
    }
    const size_t comma = l.find(',', start);
    f.push_back(trim(l.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return f;
}

// How the reader checks a column's values: M (an integer >= 1), a count or
// a dim of some op (an integer >= 0 when given), a flag field (true/false),
// an accumulation (fast/precise).
struct ColumnRule {
  enum Kind { any, m, count, flag, accum } kind = any;
  std::string name;  // as messages spell it: "M", "N", "hidden", "count", "B", "bias"
};

ColumnRule column_rule(const std::string& lname) {
  if (lname == "m") return {ColumnRule::m, "M"};
  if (lname == "count") return {ColumnRule::count, "count"};
  if (lname == "b") return {ColumnRule::count, "B"};  // aiter's batched GEMM lists
  for (const dsp::OpInfo& op : dsp::op_list())
    for (const dsp::OpKeyFieldInfo& f : op.key_fields)
      if (lower(f.name) == lname && (f.kind == "dim" || f.kind == "flag" || f.kind == "accum"))
        return {f.kind == "dim"    ? ColumnRule::count
                : f.kind == "flag" ? ColumnRule::flag
                                   : ColumnRule::accum,
                std::string(f.name)};
  return {};
}

// Checks one value against its column's rule: "" when fine, else the message.
std::string check_value(const ColumnRule& rule, std::string_view v, int64_t* m) {
  if (rule.kind == ColumnRule::flag) {
    const std::string b = lower(v);
    if (b == "true" || b == "1" || b == "false" || b == "0" || b.empty()) return {};
    return rule.name + " '" + std::string(v) + "' is not true or false";
  }
  if (rule.kind == ColumnRule::accum) {
    const std::string a = lower(v);
    if (a == "fast" || a == "precise" || a.empty()) return {};
    return rule.name + " '" + std::string(v) + "' is not fast or precise";
  }
  if (rule.kind == ColumnRule::any || (v.empty() && rule.kind != ColumnRule::m)) return {};
  int64_t n = 0;
  const bool is_m = rule.kind == ColumnRule::m;
  if (!parse_int(v, &n) || n < 0 || (is_m && n < 1))
    return rule.name + " '" + std::string(v) + "' is not an integer >= " + (is_m ? "1" : "0");
  if (is_m) *m = n;
  return {};
}

}  // namespace

std::optional<ShapeCsv> read_shape_csv(const std::string& path, std::string* error) {
  // Through the one bounded reader (store/bounded_read.hpp): a regular file
  // of at most 256 MiB; /dev/zero, a FIFO (never waited on), a directory
  // are refused with what they are, at once.
  std::string text;
  if (dsp::store::read_bounded(path, &text, {}, error) != dsp::store::ReadError::ok) return std::nullopt;
  size_t pos = 0;
  ShapeCsv csv;
  std::vector<std::string> names;  // lower-cased
  std::vector<ColumnRule> rules;
  std::string_view line;
  int line_no = 0;
  const auto fail = [&](const std::string& what) {
    *error = path + ":" + std::to_string(line_no) + ": " + what;
    return std::nullopt;
  };
  while (next_line(text, &pos, &line)) {
    ++line_no;
    const std::string_view l = trim(line);
    if (l.empty() || l.front() == '#') continue;
    std::vector<std::string_view> f = split_csv_line(l);
    if (names.empty()) {  // the header
      for (std::string_view name : f) {
        csv.columns.emplace_back(name);
        names.push_back(lower(name));
        rules.push_back(column_rule(names.back()));
      }
      if (std::find(names.begin(), names.end(), "m") == names.end())
        return fail("the header names no M column (expected e.g. 'M,N,K' or 'M,hidden')");
      continue;
    }
    // Fields past the header's last column belong to it (an unquoted
    // last column holding commas, as older misses CSVs wrote the key).
    std::string last_joined;
    if (f.size() > names.size()) {
      const size_t lastc = names.size() - 1;
      last_joined.assign(f[lastc].data(), static_cast<size_t>(f.back().data() + f.back().size() - f[lastc].data()));
      f.resize(names.size());
      f[lastc] = last_joined;
    }
    ShapeRow r;
    r.line = line_no;
    for (size_t i = 0; i < names.size() && i < f.size(); ++i) {
      if (std::string bad = check_value(rules[i], f[i], &r.m); !bad.empty()) return fail(bad);
      r.fields.emplace_back(names[i], std::string(f[i]));
    }
    if (r.m < 1) return fail("no M value");
    csv.rows.push_back(std::move(r));
  }
  if (names.empty()) {
    *error = path + ": empty file (no header)";
    return std::nullopt;
  }
  return csv;
}

namespace tune_detail {

// "bf16", "torch.bfloat16", "float32", ... -> a DType.
std::optional<dsp::DType> dtype_from_csv(std::string_view v) {
  std::string s = lower(trim(v));
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "bfloat16")
    s = "bf16";
  else if (s == "float32" || s == "float")
    s = "fp32";
  else if (s == "float16" || s == "half")
    s = "fp16";
  auto r = dsp::parse_dtype(s);
  if (!r.ok()) return std::nullopt;
  return *r;
}

// ---------------------------------------------------------------- rows -> jobs

// The ops of the run as the summary names them: "gemm", or "gemm/rmsnorm/...".
std::string ops_text(const Shapes& sh) {
  std::string out;
  for (const std::string& op : sh.ops) out += (out.empty() ? "" : "/") + op;
  return out;
}

namespace {

// How many of `op`'s dim key fields the row gives a value >= 1 for, of how many.
std::pair<size_t, size_t> dims_given(const ShapeRow& r, const dsp::OpInfo& op) {
  const auto dims = fields_of_kind(op, "dim");
  size_t n = 0;
  for (const dsp::OpKeyFieldInfo* f : dims) {
    int64_t v = 0;
    n += parse_int(r.get(lower(f->name)), &v) && v >= 1;
  }
  return {n, dims.size()};
}

// The op a row belongs to: its op column; else --op when the row has a
// value for each of --op's dims; else the ops whose dims it has all of
// ("gemm", or "rmsnorm/fused_add_rmsnorm (M,hidden)" when the dims fit
// several); else --op when it has some of --op's dims (the row then lacks
// the others); else "?".
std::string row_op(const ShapeRow& r, const dsp::OpInfo& op) {
  if (std::string_view col = r.get("op"); !col.empty()) return std::string(col);
  const auto [given, dims] = dims_given(r, op);
  if (given == dims) return std::string(op.name);
  std::vector<std::string_view> fits;
  const dsp::OpInfo* first = nullptr;
  for (const dsp::OpInfo& o : dsp::op_list())
    if (const auto [g, n] = dims_given(r, o); n > 0 && g == n) {
      fits.push_back(o.name);
      if (!first) first = &o;
    }
  if (fits.empty()) return given > 0 ? std::string(op.name) : "?";
  std::string name;
  for (std::string_view f : fits) name += (name.empty() ? "" : "/") + std::string(f);
  if (fits.size() == 1) return name;
  name += " (M";
  for (std::string_view d : dims_in_file_order(*first)) name += "," + std::string(d);
  return name + ")";
}

// The row's value of key field `f` (its name, else its CSV name).
std::string_view field_value(const ShapeRow& r, const dsp::OpKeyFieldInfo& f) {
  std::string_view v = r.get(lower(f.name));
  return v.empty() ? r.get(lower(f.csv_name)) : v;
}

// A row of --op -> its key fields and label. The dims come first, in
// file-name order; a message naming what is missing when a dim is.
struct RowKey {
  std::string fields, label, missing;
};

// A choice field's value (fused_moe's activation, moe_gemm's
// mul_routed_weight): one of the choice scalar's labels, written to the key
// unless it is the first (the default, left out of keys); "0" and "1" are
// the labels of a two-label switch (mul_routed_weight). Anything else makes
// the row fail, naming the labels.
void add_choice(const dsp::OpInfo& op, const std::string& name, std::string_view v, RowKey* k, std::string* flags) {
  for (const dsp::OpScalarInfo& sc : op.scalars) {
    if (sc.kind != "choice") continue;
    for (size_t i = 0; i < sc.labels.size(); ++i)
      if (lower(v) == sc.labels[i] || (sc.labels.size() == 2 && v == std::string_view(i == 0 ? "0" : "1"))) {
        if (i > 0) {
          k->fields += "," + name + "=" + std::string(sc.labels[i]);
          *flags += "," + name + "=" + std::string(sc.labels[i]);
        }
        return;
      }
    std::string labels;
    for (std::string_view l : sc.labels) labels += (labels.empty() ? "" : ", ") + std::string(l);
    if (k->missing.empty()) k->missing = "a " + std::string(op.name) + " row's " + name + " must be one of " + labels;
    return;
  }
}

RowKey row_key(const ShapeRow& r, const dsp::OpInfo& op, const std::vector<std::string_view>& dims, dsp::DType dt,
               dsp::DType out) {
  RowKey k;
  std::string label_dims;
  bool missing = false;
  for (std::string_view name : dims) {
    int64_t v = 0;
    if (!parse_int(r.get(lower(name)), &v) || v < 1) missing = true;
    label_dims += (label_dims.empty() ? "" : ",") + std::string(name) + "=" + std::to_string(v < 0 ? 0 : v);
  }
  if (missing) k.missing = "a " + std::string(op.name) + " row needs " + join_names(dims, "and") + " >= 1";
  k.fields = label_dims;
  k.label = label_dims + "," + std::string(dsp::dtype_name(dt));
  std::string flags, stride;
  for (const dsp::OpKeyFieldInfo& f : op.key_fields) {
    const std::string name(f.name);
    const std::string_view v = field_value(r, f);
    if (f.kind == "dtype") {
      k.fields += "," + name + "=" + std::string(dsp::dtype_name(dt));
    } else if (f.kind == "out_dtype" && out != dt) {
      k.fields += "," + name + "=" + std::string(dsp::dtype_name(out));
      k.label += "->" + std::string(dsp::dtype_name(out));
    } else if (f.kind == "flag" && (lower(v) == "true" || v == "1" || (v == f.flag_text && !v.empty()))) {
      k.fields += "," + name + "=" + std::string(f.flag_text.empty() ? "true" : f.flag_text);
      flags += "," + name;
    } else if (f.kind == "accum" && lower(v) == "fast") {
      k.fields += "," + name + "=fast";
      flags += "," + name + "=fast";
    } else if (f.kind == "stride" && !v.empty()) {
      k.fields += "," + name + "=" + std::string(v);
      stride += "," + name + "=" + std::string(v);
    } else if (f.kind == "choice" && !v.empty()) {  // a label of the op's choice scalar (its first: the default)
      add_choice(op, name, v, &k, &flags);
    }
  }
  k.label += flags + stride;
  return k;
}

// One row of --op: a job, or an outcome saying why it cannot be tuned here
// (returned; .message empty when the row became a job).
Outcome add_row(const ShapeRow& r, const std::string& file, const TuneCmdOptions& o, const dsp::OpInfo& op,
                const std::vector<std::string_view>& dims, Job* job) {
  Outcome bad;
  bad.kind = Outcome::Kind::unsupported;
  bad.m = r.m;
  bad.op = op.name;
  const std::string where = r.line > 0 ? file + ":" + std::to_string(r.line) : file;
  const std::string_view dtype_text = r.get("dtype");
  std::string_view out_text;
  for (const dsp::OpKeyFieldInfo* f : fields_of_kind(op, "out_dtype")) out_text = field_value(r, *f);
  const auto dt = dtype_text.empty() ? dtype_from_csv(o.dtype) : dtype_from_csv(dtype_text);
  // No out dtype in the row: the op's default (bf16 for the fp8 GEMMs, fp8
  // for the quantisation ops), else bf16 for fp8 inputs of an op that runs
  // them into its activations' dtype (the fp8 MoE ops: what engines run;
  // their torch ops allocate out like hidden, so no default_out_dtype),
  // else the input dtype.
  if (out_text.empty()) out_text = op.default_out_dtype;
  if (out_text.empty() && dt && dispatch::core::is_quantized(*dt) && !fields_of_kind(op, "out_dtype").empty())
    out_text = "bf16";
  const auto out = out_text.empty() ? dt : dtype_from_csv(out_text);
  if (!dt || !out) {
    bad.label = where;
    bad.message = "dtype '" + std::string(dt ? out_text : dtype_text) + "' has no kernel here";
    return bad;
  }
  const RowKey key = row_key(r, op, dims, *dt, *out);
  bad.label = key.label;
  const std::string_view backend = r.get("backend");
  int64_t batch = 0;
  if (!backend.empty() && backend != o.backend) {
    bad.message = "backend '" + std::string(backend) + "': this run tunes on " + o.backend + " (--backend)";
  } else if (parse_int(r.get("b"), &batch) && batch > 1) {
    bad.message = "batched GEMM (B=" + std::to_string(batch) + ") is not a kdispatch op";
  } else if (!key.missing.empty()) {
    bad.message = where + ": " + key.missing;
  } else if (auto d = dsp::describe_key(op.name, key.fields, r.m); !d.ok()) {
    bad.message = where + ": " + d.status().to_string();
  } else {
    *job = Job{file, r.line, d->key_fields, key.label, r.m, d->flops, std::string(op.name), d->bytes};
  }
  return bad;
}

// A row that names no op (no op column) and has a value for none of any
// op's dims: not another op's row to leave out, but a row of --op that
// lacks its dims — failed, naming the row and each missing column.
Outcome no_op_row(const ShapeRow& r, const std::string& file, const std::vector<std::string>& columns,
                  const dsp::OpInfo& op, const std::vector<std::string_view>& dims) {
  Outcome bad;
  bad.kind = Outcome::Kind::failed;
  bad.m = r.m;
  bad.label = file + ":" + std::to_string(r.line);
  std::string missing;
  for (std::string_view d : dims) {
    bool has_column = false;
    for (const std::string& c : columns) has_column = has_column || lower(c) == lower(d);
    missing +=
        std::string(missing.empty() ? "" : "; ") + (has_column ? "no value in its '" + std::string(d) + "' column"
                                                               : "the file has no '" + std::string(d) + "' column");
  }
  std::string cols;
  for (const std::string& c : columns) cols += (cols.empty() ? "" : ",") + c;
  bad.message = "a " + std::string(op.name) + " row needs " + join_names(dims, "and") +
                " >= 1 and the row names no other op: " + missing + " (columns: " + cols + ")";
  return bad;
}

}  // namespace

// Reads the shape lists and keeps --op's rows, without duplicates. A usage
// error's exit code, or -1.
int read_shapes(const TuneCmdOptions& o, const char* cmd, const dsp::OpInfo& op, Shapes* out) {
  const std::vector<std::string_view> dims = dims_in_file_order(op);
  out->ops = {std::string(op.name)};
  std::set<std::pair<std::string, int64_t>> seen;  // (key fields, M)
  for (const std::string& file : o.shapes) {
    std::string err;
    auto csv = read_shape_csv(file, &err);
    if (!csv) {
      std::fprintf(stderr, "%s: --shapes: %s\n", cmd, err.c_str());
      return kExitUsage;
    }
    for (const ShapeRow& r : csv->rows) {
      if (std::string name = row_op(r, op); name == "?") {
        out->unsupported.push_back(no_op_row(r, file, csv->columns, op, dims));
        continue;
      } else if (name != op.name) {
        out->other_rows[name]++;
        continue;
      }
      Job j;
      Outcome bad = add_row(r, file, o, op, dims, &j);
      if (!bad.message.empty())
        out->unsupported.push_back(std::move(bad));
      else if (seen.insert({j.key_fields, j.m}).second)
        out->jobs.push_back(std::move(j));
    }
  }
  return -1;
}

// --model: the units of the model's unit table (tune_model.cpp) at each M
// of --ms, each the job a --shapes row of its key would be (add_row), its
// label "<sites>: <op> <key>"; with --op, that op's units only. A usage
// error's exit code, or -1.
int model_shapes(const TuneCmdOptions& o, const char* cmd, Shapes* out) {
  std::string err;
  std::vector<int64_t> ms;
  if (!parse_ms(o.ms, &ms, &err)) {
    std::fprintf(stderr, "%s: %s\n", cmd, err.c_str());
    return kExitUsage;
  }
  out->model = plan_model(o, &err);
  if (!out->model) {
    std::fprintf(stderr, "%s: --model %s: %s\n", cmd, o.model.c_str(), err.c_str());
    return kExitUsage;
  }
  std::set<std::tuple<std::string, std::string, int64_t>> seen;  // (op, key fields, M)
  for (const ModelUnit& u : out->model->units) {
    if (!o.op.empty() && u.op != o.op) continue;
    const dsp::OpInfo* op = find_op(u.op);
    if (!op) continue;  // the unit table names ops of the op list only
    if (std::find(out->ops.begin(), out->ops.end(), u.op) == out->ops.end()) out->ops.push_back(u.op);
    const std::vector<std::string_view> dims = dims_in_file_order(*op);
    const std::string head = u.sites + ": " + u.op + " ";
    for (int64_t m : ms)
      for (int64_t rows : u.rows_per_token) {
        ShapeRow r;
        r.m = m * rows;
        r.fields.emplace_back("m", std::to_string(r.m));
        for (const auto& [name, v] : u.dims) r.fields.emplace_back(lower(name), std::to_string(v));
        if (u.bias) r.fields.emplace_back("bias", "true");
        for (const auto& [name, v] : u.fields) r.fields.emplace_back(name, v);
        r.fields.emplace_back("dtype", u.dtype.empty() ? o.dtype : u.dtype);
        if (!u.out_dtype.empty()) r.fields.emplace_back("out_dtype", u.out_dtype);
        Job j;
        Outcome bad = add_row(r, "--model " + u.sites, o, *op, dims, &j);
        if (!bad.message.empty()) {
          bad.label = head + bad.label;
          out->unsupported.push_back(std::move(bad));
        } else if (seen.insert({u.op, j.key_fields, j.m}).second) {
          j.label = head + j.label;
          out->jobs.push_back(std::move(j));
        }
      }
  }
  return -1;
}

// ---------------------------------------------------------------- --shard, --list

// Keeps the units of --shard (cli/shard.hpp) in shapes->jobs; the device
// ordinal torchrun names goes to *o. A usage error's exit code, or -1.
int select_shard(TuneCmdOptions* o, const char* cmd, Shapes* shapes) {
  if (o->shard.empty()) return -1;
  std::string err;
  const auto s = parse_shard(
      o->shard, [](const char* n) { return std::getenv(n); }, &err);
  if (!s) {
    std::fprintf(stderr, "%s: %s\n", cmd, err.c_str());
    return kExitUsage;
  }
  if (s->from_torchrun && !o->devices.empty()) {
    std::fprintf(stderr,
                 "%s: --devices under torchrun (%s): torchrun already runs one process per GPU, each tuning its "
                 "shard on its LOCAL_RANK; drop --devices (or run --devices without torchrun)\n",
                 cmd, s->source.c_str());
    return kExitUsage;
  }
  // The GPU of a torchrun process is its LOCAL_RANK (the CPU backend has one device, 0).
  if (s->from_torchrun && o->backend != "cpu") {
    if (o->device >= 0 && o->device != s->local_rank) {
      std::fprintf(stderr, "%s: --device %d under torchrun: each process tunes on its LOCAL_RANK (%d)\n", cmd,
                   o->device, s->local_rank);
      return kExitUsage;
    }
    o->device = s->local_rank;
  }
  const size_t all = shapes->jobs.size();
  std::vector<Job> kept;
  for (Job& j : shapes->jobs)
    if (in_shard(*s, unit_hash(j.op, j.key_fields, j.m))) kept.push_back(std::move(j));
  shapes->jobs = std::move(kept);
  std::fprintf(stderr, "%s: shard %lld/%lld from %s: %zu of %zu units\n", cmd, (long long)s->index, (long long)s->count,
               s->source.c_str(), shapes->jobs.size(), all);
  return -1;
}

namespace {

// The tuning memory budget the run's runtime will have (emit_runtime):
// --mem-gib, else $KDISPATCH_TUNE_MEM, else the library's default.
int64_t mem_budget(const TuneCmdOptions& o) {
  if (o.mem_gib > 0) return static_cast<int64_t>(o.mem_gib * 1073741824.0);
  if (std::getenv("KDISPATCH_TUNE_MEM"))
    if (auto env = dsp::options_from_env(); env.ok()) return env->tune.memory_budget_bytes;
  return dsp::TuneOptions{}.memory_budget_bytes;
}

}  // namespace

// --list: the units, one per line (label, M, unit hash; units over
// --max-flops or whose operands are over the memory budget marked), and an
// estimate for the others: per unit the search budget plus ~0.5 s of
// confirmation and reference. The emit dir is not read: units it already
// holds are listed and counted too. --model: the model first, its units,
// then what it does not tune.
int list_units(const TuneCmdOptions& o, const Shapes& shapes) {
  const double budget_s = (o.budget_ms > 0 ? o.budget_ms : dsp::TuneOptions{}.time_budget_ms) / 1000.0;
  const int64_t mem = mem_budget(o);
  if (shapes.model) {
    std::printf("model %s\n", shapes.model->description.c_str());
    for (const std::string& n : shapes.model->notes) std::printf("note: %s\n", n.c_str());
  }
  size_t tunable = 0;
  for (const Job& j : shapes.jobs) {
    const bool large = j.flops > o.max_flops, big = !large && j.bytes > mem;
    tunable += !large && !big;
    std::printf("%s M=%lld unit=%016llx%s\n", j.label.c_str(), (long long)j.m,
                (unsigned long long)unit_hash(j.op, j.key_fields, j.m),
                large ? " (over --max-flops: skipped)"
                : big ? (" (too large here: " + over_budget_text(j.bytes, mem) + ")").c_str()
                      : "");
  }
  for (const Outcome& r : shapes.unsupported)
    std::printf("%s M=%lld (not tunable here: %s)\n", r.label.c_str(), (long long)r.m, r.message.c_str());
  if (shapes.model)
    for (const std::string& n : shapes.model->not_tuned) std::printf("%s\n", n.c_str());
  std::printf("%zu unit%s, estimated %.0f s (%.1f s search + ~0.5 s confirmation each", shapes.jobs.size(),
              shapes.jobs.size() == 1 ? "" : "s", static_cast<double>(tunable) * (budget_s + 0.5), budget_s);
  if (tunable != shapes.jobs.size()) std::printf("; %zu over --max-flops or --mem-gib", shapes.jobs.size() - tunable);
  std::printf(o.emit.empty() ? ")\n" : "; units the emit dir holds are counted too)\n");
  return kExitOk;
}

}  // namespace tune_detail
}  // namespace kdispatch_cli
