// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the config-file-name grammar (the file name is the key).
//
//   <field>=<value>(,<field>=<value>)*[_down].json
//   E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json
//   N=4096,K=4096,device_name=NVIDIA_H200,dtype=bf16.json
//
// Fields are split on ',' outside brackets (block_shape=[128, 128] holds a
// comma). `block_shape` is canonicalised without spaces, so SGLang's
// "[128, 128]" and vLLM's "[128,128]" name the same key. The canonical
// field string sorts fields by name: the order in the file name never matters.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/op.hpp"
#include "dispatch/status.hpp"

namespace dispatch::store {

using Fields = std::vector<std::pair<std::string, std::string>>;

struct FileKey {
  Fields fields;            ///< every field but device_name, canonical values, sorted by name
  std::string device_name;  ///< the device_name field as written ("" when empty or absent)
  bool has_device_name = false;
  bool down = false;  ///< the `_down` table of a fused-MoE pair
};

/// Parses a file's base name ("...json"). Errors: invalid_argument with the
/// reason (no key fields, a field without '=', a duplicate field, an
/// unbalanced bracket).
Result<FileKey> parse_file_name(std::string_view basename) noexcept;

/// Parses a `--key`-style field list ("E=257,N=256,block_shape=[128,128]").
/// Same rules as file names, without device_name, `_down` or ".json".
Result<Fields> parse_key_fields(std::string_view text) noexcept;

/// Canonical value of one field (block_shape without whitespace).
std::string canonical_field_value(std::string_view name, std::string_view value);

/// "a=1,b=2": fields in the (already sorted) order given.
std::string join_fields(const Fields& fields);

/// Sorts fields by name (byte order) in place.
void sort_fields(Fields& fields);

/// The value of `name`, or nullptr.
const std::string* find_field(const Fields& fields, std::string_view name) noexcept;

/// A version folder name "triton_3_5_1" -> {3,5,1}; false if not one.
bool parse_version_folder(std::string_view dirname, std::vector<int>* version);
/// "3.5.1" -> {3,5,1}; false if malformed (strict: digits and dots only).
bool parse_version_string(std::string_view text, std::vector<int>* version);
/// A caller's running version, as triton.__version__ reports it: the dotted
/// numeric part of "3.4.0+git1234", "3.5.0rc1" or "3.6.0-dev" serves.
bool parse_runtime_version(std::string_view text, std::vector<int>* version);

/// The Problem an own-op key describes (m = 0), by the op's spec key
/// fields: every dim field and dtype are required; out_dtype, a flag
/// (bias=true|false), accum (fast|precise) and stride are optional (gemm:
/// N, K, dtype [, out_dtype] [, bias] [, stride]; the fp8 GEMMs: those and
/// [, accum]; the norms: hidden, dtype [, stride]).
/// Errors: invalid_argument naming the missing or unknown field.
Result<core::Problem> own_problem_from_fields(core::OpKind op, const Fields& fields) noexcept;

/// The own-op file name of a key's sorted field list and device: the op's
/// fields with a file position first (SGLang's order), then device_name,
/// then the rest: "N=..,K=..,device_name=..,dtype=..[,bias=true]...json".
std::string own_file_name(core::OpKind op, std::string_view fields_sorted, std::string_view device_name);
/// The same order without ".json"; without device_name when it is "".
std::string file_order_fields(core::OpKind op, std::string_view fields_sorted, std::string_view device_name);

}  // namespace dispatch::store
