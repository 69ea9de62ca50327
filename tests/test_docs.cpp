// SPDX-License-Identifier: Apache-2.0
// The documentation's lists that follow from the code (issue 33): each is
// written between markers in docs/architecture.md and compared here with
// what the code has, so the text cannot fall behind it again.
//   <!-- op-list:begin -->...<!-- op-list:end -->        dispatch::op_list(), in order
//   <!-- configs-ops:begin -->...<!-- configs-ops:end -->  the configs/<backend>/<op>/ folders
//   <!-- may-throw:begin -->...<!-- may-throw:end -->      the exported functions that are not noexcept
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/dispatch.hpp"
#include "test_util.hpp"

using namespace dispatch;
namespace fs = std::filesystem;

namespace {

const fs::path kSource = KDISPATCH_SOURCE_DIR;

// The text between "<!-- <name>:begin -->" and "<!-- <name>:end -->" in
// `doc`; exactly one such pair must be there.
std::string between_markers(const std::string& doc, const std::string& name) {
  const std::string begin = "<!-- " + name + ":begin -->", end = "<!-- " + name + ":end -->";
  const size_t b = doc.find(begin);
  REQUIRE_MESSAGE(b != std::string::npos, "no ", begin);
  REQUIRE_MESSAGE(doc.find(begin, b + 1) == std::string::npos, "two ", begin);
  const size_t e = doc.find(end, b);
  REQUIRE_MESSAGE(e != std::string::npos, "no ", end, " after ", begin);
  return doc.substr(b + begin.size(), e - b - begin.size());
}

// The `code` spans of a text, in order.
std::vector<std::string> code_spans(const std::string& text) {
  std::vector<std::string> out;
  for (size_t a = text.find('`'); a != std::string::npos; a = text.find('`', a + 1)) {
    const size_t b = text.find('`', a + 1);
    REQUIRE_MESSAGE(b != std::string::npos, "unbalanced ` in: ", text);
    out.push_back(text.substr(a + 1, b - a - 1));
    a = b;
  }
  return out;
}

// "`a`, `b`, `c`": what the markers should hold, for the failure message.
std::string as_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "`" : ", `") + n + "`";
  return out;
}

std::string architecture_md() { return kdtest::read_text(kSource / "docs" / "architecture.md"); }

// ---- a reading of the public headers: the exported functions' names and
// whether each is declared noexcept.

// The header without comments, string literals' contents and preprocessor
// lines (with their continuations).
std::string code_of(const std::string& text) {
  std::string plain;  // comments and string contents out
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
      if (i == std::string::npos) break;
    } else if (text.compare(i, 2, "/*") == 0) {
      const size_t e = text.find("*/", i + 2);
      i = e == std::string::npos ? text.size() : e + 2;
      plain += ' ';
    } else if (text[i] == '"') {
      plain += "\"\"";
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
      ++i;
    } else {
      plain += text[i++];
    }
  }
  std::string out;
  bool continued = false;  // the previous line was a preprocessor line ending in '\'
  for (size_t i = 0; i < plain.size();) {
    size_t e = plain.find('\n', i);
    if (e == std::string::npos) e = plain.size();
    const std::string line = plain.substr(i, e - i);
    const size_t first = line.find_first_not_of(" \t");
    const bool directive = continued || (first != std::string::npos && line[first] == '#');
    continued = directive && !line.empty() && line.back() == '\\';
    out += (directive ? std::string() : line) + "\n";
    i = e + 1;
  }
  return out;
}

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The name a declaration declares: the identifier before its first '(' at
// depth 0 ("operator=" and the like included), with a '~' for a destructor.
std::string declared_name(const std::string& decl) {
  const size_t p = decl.find('(');
  if (p == std::string::npos) return {};
  size_t e = p;
  while (e > 0 && decl[e - 1] == ' ') --e;
  size_t b = e;
  while (b > 0 && ident_char(decl[b - 1])) --b;
  if (b > 0 && decl[b - 1] == '~') --b;
  return decl.substr(b, e - b);
}

// The declaration's text after the parameter list's closing ')'.
std::string after_parameters(const std::string& decl) {
  const size_t p = decl.find('(');
  int depth = 0;
  for (size_t i = p; i < decl.size(); ++i) {
    if (decl[i] == '(') ++depth;
    if (decl[i] == ')' && --depth == 0) return decl.substr(i + 1);
  }
  return {};
}

struct Exported {
  std::string name;  // "config_to_json", "Runtime::load_report"
  bool is_noexcept = false;
};

// Index of the '}' closing the '{' at `open`.
size_t closing_brace(const std::string& code, size_t open) {
  int depth = 0;
  for (size_t i = open; i < code.size(); ++i) {
    if (code[i] == '{') ++depth;
    if (code[i] == '}' && --depth == 0) return i;
  }
  FAIL("unbalanced braces");
  return code.size();
}

// The member functions declared in an exported class's body (constructors,
// destructors, deleted and defaulted members left out).
void members(const std::string& cls, const std::string& body, std::vector<Exported>* out) {
  std::string stmt;
  int parens = 0;
  const auto finish = [&]() {
    std::string s = stmt;
    stmt.clear();
    for (const char* access : {"public:", "private:", "protected:"})
      for (size_t at; (at = s.find(access)) != std::string::npos;) s.erase(at, std::string(access).size());
    const size_t first = s.find_first_not_of(" \t\n");
    if (first == std::string::npos) return;
    s = s.substr(first);
    for (const char* skip : {"struct ", "class ", "enum ", "using ", "friend ", "static_assert", "template"})
      if (s.rfind(skip, 0) == 0) return;
    if (s.find('(') == std::string::npos || s.find("= delete") != std::string::npos ||
        s.find("= default") != std::string::npos)
      return;
    const std::string name = declared_name(s);
    if (name.empty() || name == cls || name == "~" + cls) return;
    out->push_back({cls + "::" + name, after_parameters(s).find("noexcept") != std::string::npos});
  };
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '(') ++parens;
    if (c == ')') --parens;
    if (c == '{' && parens == 0) {  // an inline body (or a nested type / brace initialiser)
      i = closing_brace(body, i);
      finish();
      continue;
    }
    if (c == ';' && parens == 0) {
      finish();
      continue;
    }
    stmt += c == '\n' ? ' ' : c;
  }
}

// Every function of include/dispatch/*.hpp marked KDISPATCH_API, and every
// member function of a class marked KDISPATCH_API.
std::vector<Exported> exported_functions() {
  std::vector<Exported> out;
  for (const auto& e : fs::directory_iterator(kSource / "include" / "dispatch")) {
    if (e.path().extension() != ".hpp" || e.path().filename() == "export.hpp") continue;
    const std::string code = code_of(kdtest::read_text(e.path()));
    for (size_t at = code.find("KDISPATCH_API"); at != std::string::npos; at = code.find("KDISPATCH_API", at + 1)) {
      // "class [[nodiscard]] KDISPATCH_API Status {": an exported class.
      const size_t stmt_start =
          code.find_last_of(";{}", at) == std::string::npos ? 0 : code.find_last_of(";{}", at) + 1;
      const std::string before = code.substr(stmt_start, at - stmt_start);
      if (before.find("class ") != std::string::npos || before.find("struct ") != std::string::npos) {
        size_t n = at + 13;
        while (n < code.size() && !ident_char(code[n])) ++n;
        size_t ne = n;
        while (ne < code.size() && ident_char(code[ne])) ++ne;
        const std::string cls = code.substr(n, ne - n);
        const size_t open = code.find('{', ne);
        REQUIRE(open != std::string::npos);
        const size_t close = closing_brace(code, open);
        members(cls, code.substr(open + 1, close - open - 1), &out);
        at = close;
        continue;
      }
      // A free function: its declaration up to ';' or '{' outside parentheses.
      int parens = 0;
      size_t end = at;
      for (; end < code.size(); ++end) {
        if (code[end] == '(') ++parens;
        if (code[end] == ')') --parens;
        if (parens == 0 && (code[end] == ';' || code[end] == '{')) break;
      }
      std::string decl = code.substr(at + 13, end - at - 13);
      std::replace(decl.begin(), decl.end(), '\n', ' ');
      const std::string name = declared_name(decl);
      REQUIRE_MESSAGE(!name.empty(), "not a function declaration: ", decl);
      out.push_back({name, after_parameters(decl).find("noexcept") != std::string::npos});
    }
  }
  return out;
}

}  // namespace

TEST_CASE("docs: architecture.md's op list is dispatch::op_list(), in order") {
  std::vector<std::string> ops;
  for (const OpInfo& op : op_list()) ops.emplace_back(op.name);
  REQUIRE(ops.size() >= 10);  // the reading of the library's list found it (10 ops at issue 33)
  const std::vector<std::string> doc = code_spans(between_markers(architecture_md(), "op-list"));
  CHECK_MESSAGE(doc == ops, "docs/architecture.md's op-list markers should hold: ", as_list(ops));
}

TEST_CASE("docs: architecture.md's folder map names the ops configs/ holds files for") {
  std::set<std::string> dirs;
  for (const auto& backend : fs::directory_iterator(kSource / "configs"))
    if (backend.is_directory())
      for (const auto& op : fs::directory_iterator(backend.path()))
        if (op.is_directory()) dirs.insert(op.path().filename().string());
  std::vector<std::string> expected;  // in op-list order
  for (const OpInfo& op : op_list())
    if (dirs.erase(std::string(op.name))) expected.emplace_back(op.name);
  CHECK_MESSAGE(dirs.empty(), "configs/ has folders of no op: ", as_list({dirs.begin(), dirs.end()}));
  const std::vector<std::string> doc = code_spans(between_markers(architecture_md(), "configs-ops"));
  CHECK_MESSAGE(doc == expected, "docs/architecture.md's configs-ops markers should hold: ", as_list(expected));
}

// The twelve the documentation names are not noexcept (the compiler's word),
// and they are all of the exported functions that are not (the headers' word).
static_assert(!noexcept(config_to_json(std::declval<const Config&>())));
static_assert(!noexcept(std::declval<const LoadReport&>().to_json()));
static_assert(!noexcept(std::declval<const Status&>().to_string()));
static_assert(!noexcept(sglang_device_name({})));
static_assert(!noexcept(resolve_device_name({})));
static_assert(!noexcept(canonical_file_device_name({}, {}, nullptr)));
static_assert(!noexcept(gpu_partition_of({}, 0, {}, {}, 0)));
static_assert(!noexcept(lookup_result_to_json(std::declval<const LookupResult&>())));
static_assert(!noexcept(std::declval<const Runtime&>().load_report()));
static_assert(!noexcept(std::declval<const Runtime&>().source_path(0)));
static_assert(!noexcept(std::declval<const Runtime&>().source_dir(0)));
static_assert(!noexcept(std::declval<const Runtime&>().cache_dir()));
// ... and a sample of the rest are.
static_assert(noexcept(Runtime::create({})));
static_assert(noexcept(options_from_env({})));
static_assert(noexcept(lookup(std::declval<const Runtime&>(), std::declval<const LookupQuery&>())));
static_assert(noexcept(dtype_name(DType::fp32)));
static_assert(noexcept(make_tensor_1d(nullptr, DType::fp32, 1)));

TEST_CASE("docs: the exported functions that are not noexcept are exactly architecture.md's list") {
  const std::vector<Exported> all = exported_functions();
  std::set<std::string> names, throwing;
  for (const Exported& f : all) {
    names.insert(f.name);
    if (!f.is_noexcept) throwing.insert(f.name);
  }
  // The reading found the API (a broken reading would find nothing to list).
  for (const char* n : {"Runtime::create", "Runtime::reload", "options_from_env", "lookup", "gemm", "op_list",
                        "Status::to_string", "LoadReport::all_usable", "from_dlpack"})
    CHECK_MESSAGE(names.count(n) == 1, n, " not found in include/dispatch/");
  const std::vector<std::string> doc = code_spans(between_markers(architecture_md(), "may-throw"));
  const std::set<std::string> doc_set(doc.begin(), doc.end());
  CHECK_MESSAGE(doc.size() == doc_set.size(), "a name twice in the may-throw list");
  CHECK_MESSAGE(doc_set == throwing,
                "docs/architecture.md's may-throw markers should hold: ", as_list({throwing.begin(), throwing.end()}));
  CHECK(throwing == std::set<std::string>{"Runtime::cache_dir", "Runtime::load_report", "Runtime::source_dir",
                                          "Runtime::source_path", "LoadReport::to_json", "Status::to_string",
                                          "canonical_file_device_name", "config_to_json", "gpu_partition_of",
                                          "lookup_result_to_json", "resolve_device_name", "sglang_device_name"});
}
