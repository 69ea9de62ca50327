// SPDX-License-Identifier: Apache-2.0
// dispatch::check_table_rows (dispatch/config.hpp): a row of an own-op table
// checked as the loader checks it (store/loader.cpp, own_file and own_row:
// the same calls in the same order, the same reasons), for tools that
// handle tables without loading them (`kdispatch merge`).
#include <optional>
#include <string>
#include <unordered_map>

#include "backends/registry.hpp"
#include "dispatch/config.hpp"
#include "dispatch/device.hpp"
#include "store/filename.hpp"
#include "store/loader.hpp"

namespace dispatch {
namespace {

// The last three components of a path: <backend>/<op>/<file>.
bool split_table_path(std::string_view p, std::string_view* backend, std::string_view* op, std::string_view* file) {
  std::string_view parts[3];
  int n = 0;
  while (n < 3) {
    const size_t slash = p.rfind('/');
    parts[n++] = slash == std::string_view::npos ? p : p.substr(slash + 1);
    if (slash == std::string_view::npos) break;
    p = p.substr(0, slash);
  }
  if (n < 3) return false;
  *file = parts[0];
  *op = parts[1];
  *backend = parts[2];
  return true;
}

Status bad_path(std::string_view path, const std::string& why) {
  return make_status(StatusCode::invalid_argument, "'" + std::string(path) + "' is not an own-op table: " + why);
}

}  // namespace

Result<TableRowsCheck> check_table_rows(std::string_view table_path,
                                        std::span<const std::pair<std::string, int64_t>> schema,
                                        std::span<const TableRow> rows) noexcept {
  try {
    std::string_view backend_name, op_name_s, file;
    if (!split_table_path(table_path, &backend_name, &op_name_s, &file))
      return bad_path(table_path, "the path does not end <backend>/<op>/<key fields>.json");
    auto backend = parse_device_type(backend_name);
    if (!backend.ok()) return bad_path(table_path, backend.status().message());
    const std::optional<core::OpKind> op = core::parse_op(op_name_s);
    if (!op) return bad_path(table_path, "'" + std::string(op_name_s) + "' is not an op of this build");
    auto key = store::parse_file_name(file);
    if (!key.ok()) return bad_path(table_path, "file name is not a config key: " + key.status().message());
    if (!key->has_device_name) return bad_path(table_path, "file name has no device_name field");
    if (key->down) return bad_path(table_path, "_down tables exist only for triton_fused_moe");
    auto prob = store::own_problem_from_fields(*op, key->fields);
    if (!prob.ok()) return bad_path(table_path, "file name: " + prob.status().message());
    core::Problem problem = *prob;
    problem.device = Device{*backend, 0};
    bool known = false;
    const std::string device = canonical_file_device_name(key->device_name, {}, &known);

    TableRowsCheck out;
    out.checked = core::backend_compiled(*backend);
    const DeviceInfo* local = nullptr;
    if (out.checked)
      if (const DeviceInfo* d = core::local_device_info(*backend); d && d->device_name == device) local = d;
    // Per distinct config (rows share them): the plan, or why the row goes.
    struct Verdict {
      core::Plan plan;
      std::string why;
      std::string defaulted;  // params the row leaves out (store::defaulted_params), or ""
    };
    std::unordered_map<const Config*, Verdict> seen;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Config* config = rows[i].config;
      if (config == nullptr) {
        out.dropped.emplace_back(i, "row has no config");
        continue;
      }
      if (!out.checked) {
        const ConfigValue* vn = config_find(*config, "variant");
        if (!vn || vn->kind != ConfigValue::Kind::string) out.dropped.emplace_back(i, "row has no \"variant\"");
        continue;
      }
      auto it = seen.find(config);
      if (it == seen.end()) {
        Verdict v;
        auto plan = core::plan_from_config(*config, *op, *backend);
        if (!plan.ok()) {
          v.why = plan.status().message();
        } else {
          v.plan = *plan;
          v.defaulted = store::defaulted_params(v.plan, *config);
          const core::VariantDef* var = plan->variant;
          for (const auto& [vn, ver] : schema)
            if (vn == var->name && ver != var->schema_version)
              v.why = "variant " + std::string(var->name) + " has config schema " +
                      std::to_string(var->schema_version) + " but the file was written for another";
          if (v.why.empty() && var->in_dtype != problem.in_dtype)
            v.why = "variant " + std::string(var->name) + " computes " + std::string(dtype_name(var->in_dtype)) +
                    ", the key is " + std::string(dtype_name(problem.in_dtype));
          if (v.why.empty() && !local)  // as the loader: the key's dtype combination, off its device
            if (Status s = core::dtypes_computed(problem); !s.ok()) v.why = s.message();
        }
        it = seen.emplace(config, std::move(v)).first;
      }
      const Verdict& v = it->second;
      if (!v.why.empty()) {
        out.dropped.emplace_back(i, v.why);
        continue;
      }
      if (local && v.plan.variant->supports) {
        core::Problem pm = problem;
        pm.m = rows[i].m;
        if (Status s = v.plan.variant->supports(pm, v.plan.params, *local); !s.ok()) {
          out.dropped.emplace_back(i, std::string(v.plan.variant->name) + " declines this key: " + s.message());
          continue;
        }
      }
      if (!v.defaulted.empty()) out.defaulted.emplace_back(i, v.defaulted);
    }
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "checking the rows of '" + std::string(table_path) + "'");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("checking table rows: ") + e.what());
  }
}

}  // namespace dispatch
