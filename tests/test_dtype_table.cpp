// SPDX-License-Identifier: Apache-2.0
// The dtype table (src/core/dtype_table.hpp), against values written out
// here: a row per DType in enum order, names and aliases that round-trip
// through parse_dtype, element sizes equal to the host types', DLPack types
// equal to dlpack.h's constants (and from_dlpack reading them), poison
// patterns that are NaNs of their dtype, the host and device decodes, the
// scratch fill, the error texts generated from the table, and the Python
// package's fp8 list (integrations/python/kdispatch/_fp8.py) equal to the
// table's fp8 rows.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "core/dtype_table.hpp"
#include "core/op.hpp"
#include "dispatch/dlpack.hpp"
#include "dispatch/types.hpp"
#include "test_util.hpp"
#include "tune/search.hpp"

using namespace dispatch;
using core::DTypeInfo;

namespace {

// What the table must say of each DType, written out independently of it.
struct Expected {
  DType type;
  const char* name;
  std::vector<std::string> aliases;
  size_t host_size;  // sizeof the host storage type
  int dl_code, dl_bits;
};

const std::vector<Expected>& expected() {
  static const std::vector<Expected> e = {
      {DType::fp32, "fp32", {"float32", "float", "f32"}, sizeof(float), kDLFloat, 32},
      {DType::fp16, "fp16", {"float16", "half", "f16"}, sizeof(uint16_t), kDLFloat, 16},
      {DType::bf16, "bf16", {"bfloat16"}, sizeof(uint16_t), kDLBfloat, 16},
      {DType::fp8_e4m3fn, "fp8_e4m3fn", {"float8_e4m3fn", "e4m3fn"}, sizeof(uint8_t), kDLPackFloat8_e4m3fn, 8},
      {DType::fp8_e4m3fnuz,
       "fp8_e4m3fnuz",
       {"float8_e4m3fnuz", "e4m3fnuz"},
       sizeof(uint8_t),
       kDLPackFloat8_e4m3fnuz,
       8},
      {DType::fp8_e5m2, "fp8_e5m2", {"float8_e5m2", "e5m2"}, sizeof(uint8_t), kDLPackFloat8_e5m2, 8},
      {DType::int32, "int32", {}, sizeof(int32_t), kDLInt, 32},
  };
  return e;
}

// from_dlpack of a 1-D host tensor of 4 elements of DLPack type (code, bits).
Result<TensorRef> view_as(int code, int bits) {
  static int64_t shape[1] = {4};
  static uint64_t data[4] = {};
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  t.shape = shape;
  return from_dlpack(&t);
}

std::vector<std::string> aliases_of(const DTypeInfo& d) {
  std::vector<std::string> a;
  for (std::string_view s : d.aliases)
    if (!s.empty()) a.emplace_back(s);
  return a;
}

}  // namespace

TEST_CASE("dtype table: one row per DType, in enum order, as written out here") {
  REQUIRE(expected().size() == static_cast<size_t>(kDTypeCount));
  REQUIRE(std::size(core::kDTypes) == static_cast<size_t>(kDTypeCount));
  for (const Expected& e : expected()) {
    CAPTURE(e.name);
    const DTypeInfo* d = core::find_dtype(e.type);
    REQUIRE(d != nullptr);
    CHECK(d == &core::kDTypes[static_cast<size_t>(e.type)]);
    CHECK(d->type == e.type);
    CHECK(d->name == e.name);
    CHECK(dtype_name(e.type) == e.name);
    CHECK(aliases_of(*d) == e.aliases);
  }
  CHECK(core::find_dtype(static_cast<DType>(kDTypeCount)) == nullptr);
  CHECK(dtype_name(static_cast<DType>(kDTypeCount)) == "?");
  CHECK(dtype_size(static_cast<DType>(kDTypeCount)) == 0);
  CHECK(core::poison_bits(static_cast<DType>(kDTypeCount)) == 0);
}

TEST_CASE("dtype table: names and aliases round-trip through parse_dtype, whose error lists every dtype") {
  std::set<std::string> seen;
  for (const DTypeInfo& d : core::kDTypes) {
    CAPTURE(d.name);
    auto r = parse_dtype(d.name);
    REQUIRE(r.ok());
    CHECK(*r == d.type);
    CHECK(seen.insert(std::string(d.name)).second);
    for (const std::string& a : aliases_of(d)) {
      CAPTURE(a);
      auto ra = parse_dtype(a);
      REQUIRE(ra.ok());
      CHECK(*ra == d.type);
      CHECK(dtype_name(*ra) == d.name);
      CHECK(seen.insert(a).second);  // no spelling names two dtypes
    }
  }
  for (const char* bad : {"fp64", "FP32", "", "bf16 ", "int8", "fp8"}) {
    CAPTURE(bad);
    auto r = parse_dtype(bad);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::invalid_argument);
    CHECK(r.status().message() == "unknown dtype '" + std::string(bad) +
                                      "' (expected fp32, fp16, bf16, fp8_e4m3fn, fp8_e4m3fnuz, fp8_e5m2 or int32)");
  }
  CHECK(core::dtype_names_text() == "fp32, fp16, bf16, fp8_e4m3fn, fp8_e4m3fnuz, fp8_e5m2 or int32");
}

TEST_CASE("dtype table: element bytes are the host types' sizes") {
  for (const Expected& e : expected()) {
    CAPTURE(e.name);
    CHECK(core::dtype_info(e.type).bytes == e.host_size);
    CHECK(dtype_size(e.type) == e.host_size);
    CHECK(core::dtype_bytes(e.type) == e.host_size);
    CHECK(core::dtype_info(e.type).dlpack.bits == 8 * e.host_size);
  }
  static_assert(core::dtype_bytes(DType::bf16) == 2);  // constexpr, for the hot path
}

TEST_CASE("dtype table: DLPack types are dlpack.h's, and from_dlpack reads them") {
  for (const Expected& e : expected()) {
    CAPTURE(e.name);
    const DTypeInfo& d = core::dtype_info(e.type);
    CHECK(d.dlpack.code == e.dl_code);
    CHECK(d.dlpack.bits == e.dl_bits);
    CHECK(d.dlpack.lanes == 1);
    CHECK(core::find_dtype_dlpack(static_cast<uint8_t>(e.dl_code), static_cast<uint8_t>(e.dl_bits)) == &d);
    auto r = view_as(e.dl_code, e.dl_bits);
    REQUIRE(r.ok());
    CHECK(r->dtype == e.type);
  }
  CHECK(core::find_dtype_dlpack(kDLFloat, 64) == nullptr);
  CHECK(core::find_dtype_dlpack(kDLFloat, 32, 2) == nullptr);
  auto r = view_as(kDLFloat, 64);
  REQUIRE(!r.ok());
  CHECK(r.status().message() ==
        "DLTensor dtype (code 2, bits 64) is not fp32, fp16, bf16, int32 or an fp8 format "
        "(DLPack 1.1 codes 10, 11, 12 with bits 8)");
  r = view_as(kDLUInt, 8);
  REQUIRE(!r.ok());
  CHECK(r.status().message() ==
        "DLTensor dtype (code 1, bits 8) is not fp32, fp16, bf16, int32 or an fp8 format "
        "(DLPack 1.1 codes 10, 11, 12 with bits 8); fp8 data in a uint8 array needs its "
        "format named (Python: kdispatch.fp8(array, \"e4m3fn\"))");
}

TEST_CASE("dtype table: poison patterns are signalling NaNs of their dtype (fp8 and int32 as documented)") {
  const auto& fp32 = core::dtype_info(DType::fp32);
  const auto& fp16 = core::dtype_info(DType::fp16);
  const auto& bf16 = core::dtype_info(DType::bf16);
  CHECK(fp32.poison == 0x7FBADBADu);
  CHECK(bf16.poison == 0x7FBDu);
  CHECK(fp16.poison == 0x7D5Bu);
  CHECK(tune::kPoisonFp32 == fp32.poison);
  CHECK(tune::kPoisonBf16 == bf16.poison);
  CHECK(tune::kPoisonFp16 == fp16.poison);
  for (const DTypeInfo& d : core::kDTypes) {
    CAPTURE(d.name);
    CHECK(core::poison_bits(d.type) == d.poison);
    if (d.bytes < 4) CHECK((d.poison >> (8 * d.bytes)) == 0);  // fits the element
  }
  // The IEEE-like ones: NaN, and signalling (quiet bit, the mantissa's top, clear).
  CHECK(std::isnan(core::decode_bits(fp32, fp32.poison)));
  CHECK((fp32.poison & 0x7F800000u) == 0x7F800000u);
  CHECK((fp32.poison & 0x00400000u) == 0);
  CHECK(std::isnan(core::decode_bits(bf16, bf16.poison)));
  CHECK((bf16.poison & 0x7F80u) == 0x7F80u);
  CHECK((bf16.poison & 0x0040u) == 0);
  CHECK(std::isnan(core::decode_bits(fp16, fp16.poison)));
  CHECK((fp16.poison & 0x7C00u) == 0x7C00u);
  CHECK((fp16.poison & 0x0200u) == 0);
  // fp8: 0x7f, a NaN of e4m3fn and e5m2; e4m3fnuz's one NaN is 0x80, and its
  // 0x7f is its largest finite value (outputs not poisoned exactly, as the
  // search always did).
  CHECK(std::isnan(core::decode_bits(core::dtype_info(DType::fp8_e4m3fn), 0x7Fu)));
  CHECK(std::isnan(core::decode_bits(core::dtype_info(DType::fp8_e5m2), 0x7Fu)));
  CHECK(core::dtype_info(DType::fp8_e4m3fn).poison == 0x7Fu);
  CHECK(core::dtype_info(DType::fp8_e5m2).poison == 0x7Fu);
  CHECK(core::dtype_info(DType::fp8_e4m3fnuz).poison == 0x7Fu);
  CHECK(core::decode_bits(core::dtype_info(DType::fp8_e4m3fnuz), 0x7Fu) == 240.0);
  // int32 has no NaN: fp32's bits, a value no op writes.
  CHECK(core::dtype_info(DType::int32).poison == fp32.poison);
}

TEST_CASE("dtype table: host decode and encode of known values") {
  struct Case {
    DType t;
    uint32_t bits;
    double value;
  };
  for (const Case& c :
       {Case{DType::fp32, 0x3FC00000u, 1.5}, Case{DType::fp16, 0x3E00u, 1.5}, Case{DType::bf16, 0x3FC0u, 1.5},
        Case{DType::fp8_e4m3fn, 0x3Cu, 1.5}, Case{DType::fp8_e4m3fnuz, 0x44u, 1.5}, Case{DType::fp8_e5m2, 0x3Eu, 1.5},
        Case{DType::fp32, 0xC0000000u, -2.0}, Case{DType::fp8_e4m3fn, 0x7Eu, 448.0},
        Case{DType::fp8_e5m2, 0x7Bu, 57344.0}, Case{DType::int32, 0xFFFFFFFFu, -1.0}, Case{DType::int32, 7u, 7.0}}) {
    const DTypeInfo& d = core::dtype_info(c.t);
    CAPTURE(d.name);
    CAPTURE(c.bits);
    CHECK(core::decode_bits(d, c.bits) == c.value);
    CHECK(core::encode_value(d, static_cast<float>(c.value)) == c.bits);
    uint32_t word = 0xA5A5A5A5u;
    core::store_bits(d, &word, 0, c.bits);
    CHECK(core::load_bits(d, &word, 0) == c.bits);
    if (d.bytes < 4) CHECK((word >> (8 * d.bytes)) == (0xA5A5A5A5u >> (8 * d.bytes)));  // the rest untouched
  }
  // fp8 scratch values saturate (float_to_fp8's saturate = true).
  CHECK(core::encode_value(core::dtype_info(DType::fp8_e4m3fn), 1e6f) == 0x7Eu);
  CHECK(core::encode_value(core::dtype_info(DType::fp8_e4m3fnuz), -1e6f) == 0xFFu);
}

TEST_CASE("dtype table: the device compare decodes fp32, fp16 and bf16, and the tuner's scratch fill") {
  using core::DeviceDecode;
  CHECK(core::dtype_info(DType::fp32).device == DeviceDecode::f32);
  CHECK(core::dtype_info(DType::fp16).device == DeviceDecode::f16);
  CHECK(core::dtype_info(DType::bf16).device == DeviceDecode::bf16);
  for (DType t : {DType::fp8_e4m3fn, DType::fp8_e4m3fnuz, DType::fp8_e5m2, DType::int32}) {
    CHECK(core::dtype_info(t).device == DeviceDecode::none);
    CHECK(!core::device_decodes(t));
  }
  CHECK(core::device_decodes(DType::bf16));
  CHECK(!core::device_decodes(static_cast<DType>(kDTypeCount)));
  CHECK(core::device_decoded_dtypes_text() == "fp32, fp16 and bf16");
  for (const DTypeInfo& d : core::kDTypes) {
    CAPTURE(d.name);
    CHECK(d.scratch == (d.type == DType::int32 ? core::ScratchFill::index_mod8 : core::ScratchFill::value));
    CHECK((d.codec == core::HostCodec::fp8) == (d.dlpack.code >= core::kDLPackCodeFloat8_e4m3fn));
  }
}

// The Python package keeps its own fp8 list (numpy has no fp8 dtype):
// FORMATS = {"e4m3fn": (exp bits, bias, finite, unsigned zero, DLPack code), ...}
// and _ALIASES = {"fp8_e4m3fn": "e4m3fn", ...}. They must be the table's fp8
// rows: the short name is the name after "fp8_", the aliases the table's.
TEST_CASE("dtype table: the Python package's fp8 formats and aliases are the table's fp8 rows") {
  const std::string src =
      kdtest::read_text(std::filesystem::path(KDISPATCH_SOURCE_DIR) / "integrations/python/kdispatch/_fp8.py");
  REQUIRE(!src.empty());
  const std::regex fmt_re(R"re("(\w+)": \((\d+), (\d+), (True|False), (True|False), (\d+)\))re");
  std::set<std::string> py_formats;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), fmt_re); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    CAPTURE(m.str(1));
    py_formats.insert(m.str(1));
    const DTypeInfo* d = core::find_dtype("fp8_" + m.str(1));
    REQUIRE(d != nullptr);
    CHECK(d->codec == core::HostCodec::fp8);
    CHECK(d->fp8.exp_bits == std::stoi(m.str(2)));
    CHECK(d->fp8.bias == std::stoi(m.str(3)));
    CHECK(d->fp8.fn == (m.str(4) == "True"));
    CHECK(d->fp8.uz == (m.str(5) == "True"));
    CHECK(d->dlpack.code == std::stoi(m.str(6)));
  }
  std::set<std::string> table_formats;
  for (const DTypeInfo& d : core::kDTypes)
    if (d.codec == core::HostCodec::fp8) table_formats.insert(std::string(d.name.substr(4)));
  CHECK(py_formats == table_formats);
  // _ALIASES: every Python alias names its format's row, and the Python
  // spellings are the row's name and its aliases (less the short name, a key).
  const size_t a0 = src.find("_ALIASES = {");
  REQUIRE(a0 != std::string::npos);
  const std::string aliases = src.substr(a0, src.find('}', a0) - a0);
  const std::regex alias_re(R"re("(\w+)": "(\w+)")re");
  std::set<std::string> py_alias, table_alias;
  for (auto it = std::sregex_iterator(aliases.begin(), aliases.end(), alias_re); it != std::sregex_iterator(); ++it) {
    CAPTURE((*it).str(1));
    const DTypeInfo* d = core::find_dtype((*it).str(1));
    REQUIRE(d != nullptr);
    CHECK(d->name == "fp8_" + (*it).str(2));
    py_alias.insert((*it).str(1));
  }
  for (const DTypeInfo& d : core::kDTypes) {
    if (d.codec != core::HostCodec::fp8) continue;
    table_alias.insert(std::string(d.name));
    for (const std::string& a : aliases_of(d))
      if (a != d.name.substr(4)) table_alias.insert(a);
  }
  CHECK(py_alias == table_alias);
}
