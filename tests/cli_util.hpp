// SPDX-License-Identifier: Apache-2.0
// Running the kdispatch CLI from a test: stdout through a pipe, stderr
// through a file, exit code, in an environment cleared of the KDISPATCH_*
// variables that change what the CLI loads or tunes.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "test_util.hpp"

#ifdef KDISPATCH_CLI_PATH

namespace kdtest {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Runs the CLI with `args`. Its tuning cache is `cache_dir`, or when empty
/// a fresh temp dir (never the user's cache, whose winners would turn misses
/// into hits). `env`: "NAME=value" assignments set for the run, after the
/// KDISPATCH_* variables are cleared.
inline CliResult run_cli(const std::vector<std::string>& args, const std::string& cache_dir = {},
                         const std::vector<std::string>& env = {}) {
  TempDir tmp;
  const fs::path err_file = tmp / "stderr.txt";
  std::string cmd =
      "env -u KDISPATCH_TUNE -u KDISPATCH_CONFIG_DIRS -u KDISPATCH_SHIPPED_CONFIGS -u KDISPATCH_FORCE "
      "-u KDISPATCH_MISSES_EXPORT -u KDISPATCH_TUNE_BUDGET_MS -u KDISPATCH_TUNE_MEM "
      "-u KDISPATCH_LOG_LEVEL -u KDISPATCH_VERIFY_SHIPPED -u KDISPATCH_TUNE_GRAPH -u KDISPATCH_TUNE_MARGIN "
      "KDISPATCH_CACHE_DIR=" +
      shell_quote(cache_dir.empty() ? (tmp / "cache").string() : cache_dir) + " ";
  for (const auto& e : env) cmd += shell_quote(e) + " ";
  cmd += shell_quote(KDISPATCH_CLI_PATH);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  cmd += " 2>" + shell_quote(err_file.string());
  CliResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_text(err_file);
  return r;
}

}  // namespace kdtest

#endif  // KDISPATCH_CLI_PATH
