// SPDX-License-Identifier: Apache-2.0
// kdispatch — umbrella header. Namespace `dispatch`, library `kdispatch`.
//
//   #include <dispatch/dispatch.hpp>
//   auto rt = dispatch::Runtime::create({.config_dirs = {"/etc/my-engine/configs"}});
//   dispatch::rmsnorm(**rt, {y, x, w, 1e-6f}, stream);
//
// Headers: status.hpp (Status, Result), types.hpp (DType, TensorRef),
// device.hpp (DeviceInfo, device-name resolution), config.hpp (configs and
// the load report), runtime.hpp (Runtime), ops.hpp (the ops of op_list(),
// lookup), dlpack.hpp (DLTensor interop, separate so the rest needs no DLPack
// headers).
#pragma once

#include "dispatch/config.hpp"
#include "dispatch/device.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "dispatch/status.hpp"
#include "dispatch/types.hpp"
