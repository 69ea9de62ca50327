// SPDX-License-Identifier: Apache-2.0
// kdispatch HIP backend — device probe, tuner memory and clock, entry table
// (the portable source is src/backends/gpu/device.inc).
#include "backends/gpu/device.inc"
