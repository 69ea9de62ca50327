// SPDX-License-Identifier: Apache-2.0
// Tests of `kdispatch report` (issue 32, item 6), run through the built
// binary (KDISPATCH_CLI_PATH) as tests/test_cli.cpp does: a small report
// from a hand-written config dir, a `tune --json` file and a bench JSON,
// whose numbers are checked in the HTML; 1,000 rows stay under 2 MB; inputs
// that are none of the kinds are refused naming them.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_util.hpp"

#ifdef KDISPATCH_CLI_PATH

namespace {

namespace fs = std::filesystem;
using kdtest::read_text;
using kdtest::run_cli;
using kdtest::TempDir;
using kdtest::write_text;

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + what.size())) ++n;
  return n;
}

// The text of the section <h2 id="<id>"> up to the next <h2.
std::string section(const std::string& html, const std::string& id) {
  const size_t a = html.find("<h2 id=\"" + id + "\">");
  REQUIRE_MESSAGE(a != std::string::npos, "no section ", id);
  const size_t b = html.find("<h2", a + 4);
  return html.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

std::string fmt3(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", v);
  return b;
}

// A table as `kdispatch tune --emit` writes it, with the rows' records
// (store/row_meta.hpp: margin, margin_by_m, aa_spread, timing, why, cpu).
const char* kGemmTable = R"({
    "kdispatch": {"tool": "kdispatch test", "schema": {"gemm_bf16__blocked": 1}, "fingerprint": {"kernels": "x"},
                  "us": {"1": 11.0, "2": 12.5, "4": 20.0}, "default_us": {"1": 12.0, "2": 12.5, "4": 18.0},
                  "margin": 0.02, "margin_by_m": {"4": 0.05}, "aa_spread": {"1": 0.015, "4": 0.05},
                  "timing": {"1": "cold+graph", "2": "cold", "4": "cold"},
                  "why": {"1": "won every placement by <8.3%>", "2": "floor kept", "4": "merged with --prefer"},
                  "cpu": {"vendor": "GenuineIntel", "family": 6, "model": 85}},
    "1": {"variant": "gemm_bf16__blocked", "BLOCK_SIZE_M": 8},
    "2": {"variant": "gemm_bf16__floorplan", "BLOCK_SIZE_M": 16},
    "4": {"variant": "gemm_bf16__blocked", "BLOCK_SIZE_M": 32}
})";

}  // namespace

TEST_CASE(
    "report: a config dir, a tune --json file and a bench JSON give one self-contained HTML file with their "
    "numbers") {
  TempDir tmp;
  write_text(tmp / "configs/cpu/gemm/N=64,K=64,device_name=CPU_TEST,dtype=bf16.json", kGemmTable);
  // A key with '<' and '>' in it: escaped wherever it is shown.
  write_text(tmp / "configs/cpu/rmsnorm/hidden=64,device_name=CPU<x>,dtype=bf16.json",
             R"({"kdispatch": {"us": {"8": 3.0}, "default_us": {"8": 4.0}}, "8": {"variant": "rmsnorm_bf16__vec"}})");
  // A table without timings (hand-written): counted, not charted.
  write_text(tmp / "configs/cpu/rmsnorm/hidden=32,device_name=CPU_TEST,dtype=bf16.json",
             R"({"1": {"variant": "rmsnorm_bf16__vec"}})");
  // Another tune of the gemm shape (M = 1 again: a regret of 12.1 / 11 - 1 =
  // 10.0 %; M = 16 new), with the ceilings the tuner measured.
  write_text(tmp / "tune.json", R"({"op": "gemm", "emit": "other", "device_name": "CPU_TEST", "shapes": 2,
      "ceilings": {"read_gbps": 100, "compute_tflops": 1},
      "results": [{"shape": "N=64,K=64,bf16", "M": 1, "status": "tuned", "op": "gemm", "variant": "gemm_bf16__other",
                   "key": "cpu/gemm|CPU_TEST|K=64,N=64,dtype=bf16", "us": 12.1, "default_us": 12.2},
                  {"shape": "N=64,K=64,bf16", "M": 16, "status": "tuned", "op": "gemm", "variant": "gemm_bf16__blocked",
                   "key": "cpu/gemm|CPU_TEST|K=64,N=64,dtype=bf16", "us": 5.0, "default_us": 5.0},
                  {"shape": "N=64,K=64,bf16", "M": 32, "status": "too_large", "message": "skipped"}]})");
  // bench_any_model.py's format: no device (joins the one device with the
  // shape); torch's call is the peer.
  write_text(tmp / "any_model.json", R"({"rows": [
      {"kind": "bf16", "model": "M", "proj": "qkv", "N": 64, "K": 64, "M": 1, "cold_torch_us": 13.0,
       "cold_kd_us": 11.5, "cold_floor_us": 12.9, "cold_aa": 0.01, "kd_variant": "gemm_bf16__blocked"},
      {"kind": "bf16", "N": 64, "K": 64, "M": 2, "error": "RuntimeError: out of memory"}], "complete": true})");

  const std::string out = (tmp / "report.html").string();
  const auto r = run_cli({"report", (tmp / "configs").string(), (tmp / "tune.json").string(),
                          (tmp / "any_model.json").string(), "--out", out, "--title", "a <test> report"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("report.html: 7 rows of 2 shapes from 3 inputs") != std::string::npos);
  const std::string html = read_text(out);

  SUBCASE("self-contained: inline CSS and SVG, nothing run, nothing fetched") {
    CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
    CHECK(html.find("<style>") != std::string::npos);
    CHECK(html.find("<svg") != std::string::npos);
    for (const char* banned :
         {"<script", "javascript:", "http://", "https://", "<link", "<img", "<iframe", "@import", "url("})
      CHECK_MESSAGE(html.find(banned) == std::string::npos, banned);
  }
  SUBCASE("every string escaped") {
    CHECK(html.find("<title>a &lt;test&gt; report</title>") != std::string::npos);
    CHECK(html.find("CPU&lt;x&gt;") != std::string::npos);
    CHECK(html.find("CPU<x>") == std::string::npos);
    CHECK(html.find("won every placement by &lt;8.3%&gt;") != std::string::npos);
  }
  SUBCASE("the summary: counts and the geomean of served / floor over the heat map's cells") {
    const std::string s = section(html, "summary");
    CHECK(s.find("<td class=\"t\">3</td>") != std::string::npos);  // inputs
    CHECK(s.find("3 (1 without timings)") != std::string::npos);   // config tables
    // cells: gemm M=1 (the config dir's, the first input), 2, 4, 16 (tune); rmsnorm M=8
    const double geo = std::exp(
        (std::log(11.0 / 12.0) + std::log(1.0) + std::log(20.0 / 18.0) + std::log(1.0) + std::log(3.0 / 4.0)) / 5.0);
    CHECK(s.find("<td class=\"t\">" + fmt3(geo) + "</td>") != std::string::npos);
    CHECK(fmt3(geo) == "0.948");
  }
  SUBCASE("the heat map: one cell per (shape, M) with both times, its ratio") {
    const std::string s = section(html, "heat");
    CHECK(count_of(s, "<td class=\"h\"") == 5);
    CHECK(s.find(">0.917</td>") != std::string::npos);  // 11 / 12
    CHECK(s.find(">1.111</td>") != std::string::npos);  // 20 / 18
    CHECK(s.find(">0.750</td>") != std::string::npos);  // rmsnorm 3 / 4
    CHECK(s.find(">1.000</td>") != std::string::npos);
  }
  SUBCASE("the charts: one per shape, with floor, served, peer and the ceiling") {
    const std::string s = section(html, "charts");
    CHECK(count_of(s, "<figure>") == 2);
    CHECK(count_of(s, "<svg") == 2);
    CHECK(s.find("class=\"d pe\"") != std::string::npos);  // the bench's torch (one point: a dot)
    CHECK(s.find("class=\"fl\"") != std::string::npos);
    CHECK(s.find("class=\"ce\"") != std::string::npos);  // the tuner's ceilings
    CHECK(s.find("GenuineIntel family 6 model 85") != std::string::npos);
  }
  SUBCASE("the ceilings: the tuner's, shown because measured") {
    const std::string s = section(html, "inputs");
    CHECK(s.find("Ceilings measured by the tuner") != std::string::npos);
    CHECK(s.find("<td class=\"t\">CPU_TEST</td><td>100</td><td class=\"t\">1</td>") != std::string::npos);
  }
  SUBCASE("lost to the floor: the gemm's M = 4, beyond its A/A spread") {
    const std::string s = section(html, "lost");
    CHECK(count_of(s, "<tr class=\"lost\">") == 1);
    CHECK(s.find("<td>4</td><td>1</td><td class=\"t\">gemm_bf16__blocked</td><td>20.000</td><td>18.000</td>"
                 "<td>1.111</td><td>5.0%</td><td class=\"t\">yes</td>") != std::string::npos);
  }
  SUBCASE("the regret: M = 1 tuned by the dir and by tune --json") {
    const std::string s = section(html, "regret");
    CHECK(s.find("<title>regret histogram</title>") != std::string::npos);
    CHECK(s.find("<td>10.0%</td>") != std::string::npos);
    CHECK(s.find("1, gemm_bf16__blocked, 11.000") != std::string::npos);
    CHECK(s.find("2, gemm_bf16__other, 12.100") != std::string::npos);
  }
  SUBCASE("every row: margin, A/A spread, timing, why, the peer") {
    const std::string s = section(html, "rows");
    CHECK(s.find("<td>1</td><td>1</td><td class=\"t\">gemm_bf16__blocked</td><td>11.000</td><td>12.000</td>"
                 "<td>0.917</td><td class=\"t\">—</td><td>2.0%</td><td>1.5%</td><td class=\"t\">cold+graph</td>"
                 "<td class=\"t\">won every placement by &lt;8.3%&gt;</td>") != std::string::npos);
    CHECK(s.find("<td>4</td><td>1</td><td class=\"t\">gemm_bf16__blocked</td><td>20.000</td><td>18.000</td>"
                 "<td>1.111</td><td class=\"t\">—</td><td>5.0%</td><td>5.0%</td><td class=\"t\">cold</td>"
                 "<td class=\"t\">merged with --prefer</td>") != std::string::npos);  // margin_by_m
    CHECK(s.find("<td class=\"t\">torch 13.000</td>") != std::string::npos);          // the bench's row, M = 1
    CHECK(s.find("<td>1.0%</td><td class=\"t\">cold</td>") != std::string::npos);     // its A/A spread
    CHECK(s.find("RuntimeError") == std::string::npos);  // a point that failed is not a row
  }
  SUBCASE("no ceilings where none was measured") {
    const std::string out2 = (tmp / "plain.html").string();
    const auto r2 = run_cli({"report", (tmp / "configs").string(), "-o", out2});
    REQUIRE(r2.exit_code == 0);
    const std::string h2 = read_text(out2);
    CHECK(h2.find("Ceilings measured") == std::string::npos);
    CHECK(section(h2, "charts").find(" ce\"") == std::string::npos);
    CHECK(section(h2, "charts").find("\"ce\"") == std::string::npos);
    CHECK(section(h2, "regret").find("no regret to show") != std::string::npos);
  }
}

TEST_CASE("report: 1,000 rows stay under 2 MB (250 shapes of 4 M, and 1,000 shapes of one M)") {
  TempDir tmp;
  for (int shapes : {250, 1000}) {
    const int per = 1000 / shapes;
    const fs::path dir = tmp / ("c" + std::to_string(shapes)) / "cuda" / "gemm";
    for (int i = 0; i < shapes; ++i) {
      std::string us, dus, rows;
      for (int j = 0; j < per; ++j) {
        const std::string m = std::to_string(1 << (2 * j));
        const double t = 10.0 + i * 0.37 + j * 3.1;
        us += (j ? ", \"" : "\"") + m + "\": " + fmt3(t);
        dus += (j ? ", \"" : "\"") + m + "\": " + fmt3(t * (1.0 + 0.001 * ((i + j) % 120) - 0.02));
        rows +=
            ",\n \"" + m + "\": {\"variant\": \"gemm_bf16__cublaslt\", \"algo_id\": " + std::to_string(i % 70) + "}";
      }
      write_text(dir / ("N=" + std::to_string(1024 + 64 * i) + ",K=4096,device_name=NVIDIA_H200,dtype=bf16.json"),
                 "{\"kdispatch\": {\"us\": {" + us + "}, \"default_us\": {" + dus +
                     "}, \"margin\": 0.02, "
                     "\"aa_spread\": {\"1\": 0.012}, \"timing\": \"cold\", \"why\": {\"1\": \"won every placement\"}}" +
                     rows + "}");
    }
    const std::string out = (tmp / ("r" + std::to_string(shapes) + ".html")).string();
    const auto r = run_cli({"report", (tmp / ("c" + std::to_string(shapes))).string(), "--out", out});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const std::string html = read_text(out);
    INFO(shapes, " shapes: ", html.size(), " bytes");
    CHECK(count_of(section(html, "heat"), "<td class=\"h\"") == 1000);
    CHECK(count_of(section(html, "charts"), "<svg") == static_cast<size_t>(shapes));
    CHECK(html.size() < 2u * 1000u * 1000u);
  }
}

TEST_CASE("report: an input that is none of the kinds is refused naming it (exit 2), and passed over inside a dir") {
  TempDir tmp;
  write_text(tmp / "good/cpu/gemm/N=8,K=8,device_name=CPU_TEST,dtype=fp32.json",
             R"({"kdispatch": {"us": {"1": 1.5}, "default_us": {"1": 1.5}}, "1": {"variant": "gemm_fp32__ref"}})");
  write_text(tmp / "foreign.json", R"({"hello": [1, 2]})");
  write_text(tmp / "broken.json", "{\"kdispatch\": ");
  const std::string out = (tmp / "r.html").string();

  const auto foreign = run_cli({"report", (tmp / "good").string(), (tmp / "foreign.json").string(), "--out", out});
  CHECK(foreign.exit_code == 2);
  CHECK(foreign.err.find((tmp / "foreign.json").string() + "': not a kdispatch config table") != std::string::npos);
  CHECK_FALSE(fs::exists(out));

  const auto broken = run_cli({"report", (tmp / "broken.json").string(), "--out", out});
  CHECK(broken.exit_code == 2);
  CHECK(broken.err.find((tmp / "broken.json").string() + "': not JSON") != std::string::npos);

  const auto missing = run_cli({"report", (tmp / "nowhere").string(), "--out", out});
  CHECK(missing.exit_code == 2);
  CHECK(missing.err.find("nowhere' does not exist") != std::string::npos);

  CHECK(run_cli({"report", (tmp / "good").string()}).exit_code == 2);                      // no --out
  CHECK(run_cli({"report", (tmp / "good").string(), "--out", tmp.str()}).exit_code == 2);  // --out a dir
  CHECK_FALSE(fs::exists(out));

  // In a dir: foreign JSON is listed and passed over (exit 0); a file that
  // does not parse is listed too and the exit code is 1, the report written.
  write_text(tmp / "good/notes.json", R"(["not", "a", "table"])");
  const auto passed = run_cli({"report", (tmp / "good").string(), "--out", out});
  INFO(passed.err);
  CHECK(passed.exit_code == 0);
  CHECK(passed.err.find("passed over notes.json: not a kdispatch config table") != std::string::npos);
  CHECK(read_text(out).find("notes.json: not a kdispatch config table") != std::string::npos);
  write_text(tmp / "good/cpu/gemm/N=9,K=9,device_name=CPU_TEST,dtype=fp32.json", "{\"1\": ");
  const auto failed = run_cli({"report", (tmp / "good").string(), "--out", out});
  CHECK(failed.exit_code == 1);
  CHECK(failed.err.find("passed over cpu/gemm/N=9,K=9,device_name=CPU_TEST,dtype=fp32.json: not JSON") !=
        std::string::npos);
  CHECK(read_text(out).find(">1.000</td>") != std::string::npos);

  // Tables without timings only: nothing to report.
  write_text(tmp / "untimed/cpu/gemm/N=8,K=8,device_name=CPU_TEST,dtype=fp32.json", R"({"1": {"variant": "x"}})");
  const std::string out2 = (tmp / "r2.html").string();
  const auto untimed = run_cli({"report", (tmp / "untimed").string(), "--out", out2});
  CHECK(untimed.exit_code == 1);
  CHECK(untimed.err.find("no timings in the inputs") != std::string::npos);
  CHECK_FALSE(fs::exists(out2));
}

#endif  // KDISPATCH_CLI_PATH
