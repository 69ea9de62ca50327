// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the variant registry, built from the per-op lists of
// every compiled backend (no static-initialiser self-registration: a static
// library would drop unreferenced objects, and init order is unspecified).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/op.hpp"
#include "dispatch/config.hpp"
#include "dispatch/device.hpp"
#include "dispatch/status.hpp"

namespace dispatch::core {

/// True when `backend`'s kernels are compiled into this build (the CPU
/// always is).
bool backend_compiled(DeviceType backend) noexcept;

/// The description of the backend's first local device (ordinal 0), or
/// nullptr when the backend is not compiled in or has no device.
const DeviceInfo* local_device_info(DeviceType backend) noexcept;

/// The probed description of a tensor's device (probed once per ordinal;
/// then a few loads, no lock, no allocation), or nullptr when its backend
/// is not compiled in or has no usable device of that ordinal.
const DeviceInfo* device_info_for(Device d) noexcept;

/// Why a tensor's device has no usable backend, for an op's
/// unsupported_device error.
const char* no_backend_message(Device d) noexcept;

/// The backend of a device by its canonical name: CPU_* the CPU, AMD_* and
/// Radeon HIP, the rest CUDA.
DeviceType backend_of_device_name(std::string_view canonical) noexcept;

/// True when a canonical device name is an AMD GPU's (the HIP backend's,
/// compiled in or not): engine rules that differ on ROCm ask this.
bool is_hip_device_name(std::string_view canonical) noexcept;

/// True for the host backend (no device memory, no streams, no workspace).
bool is_host(DeviceType t) noexcept;

/// Runtime::device_info()'s answer: the probed description of `d`, or why
/// there is none (no backend in this build, the backend unavailable, no
/// such ordinal), as unsupported_device.
Result<DeviceInfo> device_info_or_why(Device d) noexcept;

/// Registration check of one variant of a built-in op (validate_variant
/// with the op's argument names): refuses, e.g., an argument declared both
/// restore_value and reset_to_zero, naming it.
Status register_check(const VariantDef& v) noexcept;

/// Messages of variants refused at registration (empty when all are fine).
const std::vector<std::string>& registry_errors() noexcept;

/// What became of the CPU backend plugins, one line each (loads the
/// registry): "openblas: loaded <path> (OpenBLAS 0.3.21 ...; 1 variant)", or
/// why not ("disabled by KDISPATCH_OPENBLAS=0", "... not found in <dirs>",
/// "not built", "dlopen failed: ..."). A plugin's variants (e.g.
/// gemm_fp32__openblas) are in all_variants() only when it loaded.
const std::string& plugin_status() noexcept;

}  // namespace dispatch::core
namespace dispatch::backends {
class DeviceMemory;
}
namespace dispatch::core {

/// The tuner's memory interface of a GPU backend (nullptr for the CPU,
/// which uses host memory, and for backends not compiled in).
backends::DeviceMemory* backend_memory(DeviceType backend) noexcept;

/// Every compiled variant of every backend, in list order.
std::span<const VariantDef* const> all_variants() noexcept;

/// The variant with this stable name, or nullptr.
const VariantDef* find_variant(std::string_view name) noexcept;

/// Variants of one op on one backend, in list order.
std::vector<const VariantDef*> variants_for(OpKind op, DeviceType backend);

/// The op's reference variant for (backend, input dtype), or nullptr.
const VariantDef* reference_variant(OpKind op, DeviceType backend, DType in_dtype) noexcept;

/// The most workspace any variant of p's op and in_dtype on p's backend asks
/// for (VariantDef::workspace_bytes at its parameters' defaults); 0 when
/// none takes one.
int64_t max_workspace_bytes(const Problem& p) noexcept;

/// The analytical default plan for a problem. Never fails for a problem
/// that passed validation on a compiled backend: the reference variant is
/// the last resort. Returns an invalid Plan only when the backend has no
/// variant for the problem's dtypes.
Plan get_default(const Problem& p, const DeviceInfo& dev) noexcept;

/// The floor of a problem: the plan the engine would run without us (CUDA
/// GEMMs: cuBLAS / cuBLASLt called as torch calls them), the incumbent every
/// search races; get_default's plan where the backend has none (the CPU).
Plan floor_plan(const Problem& p, const DeviceInfo& dev) noexcept;

/// An op's refusal of a problem no variant of its backend computes (its
/// dtype combination): unsupported_problem, "no <backend> variant computes
/// <op> with <in> inputs and <out> output". What an op call answers when
/// get_default has no plan; pretune, the tuner and the loader answer the same.
Status no_variant_computes(const Problem& p);

/// Whether some variant of p's backend computes p's dtype combination, told
/// without the device p is for (a config file of another machine): Status()
/// or no_variant_computes(p). Asked of the CPU backend only, whose default
/// rule reads no device state; Status() for a GPU backend (its default rule
/// probes the device: only supports() on the file's own device tells).
Status dtypes_computed(const Problem& p) noexcept;

/// Every point of `v`'s config space that `v` accepts for `p`: the
/// cartesian product of its params' values, filtered by supports().
std::vector<Plan> config_space(const VariantDef& v, const Problem& p, const DeviceInfo& dev);

/// Resolves a config row of an own-op file into a Plan: the row's
/// "variant" names a compiled variant of `op` on `backend`; every other key
/// must be one of its params with a value in the param's space; missing
/// params take their default. Errors: config_error naming the key.
Result<Plan> plan_from_config(const Config& row, OpKind op, DeviceType backend) noexcept;

/// The inverse: {"variant": name, <param>: value, ...} in param order.
Config plan_to_config(const Plan& plan);

/// A one-line description: "gemm_fp32__blocked{BLOCK_SIZE_M=64,...}".
std::string plan_to_string(const Plan& plan);

}  // namespace dispatch::core
