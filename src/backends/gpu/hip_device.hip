// SPDX-License-Identifier: Apache-2.0
// kdispatch HIP backend — device probe, tuner memory and clock, entry table
// (the portable source is src/gpu/device.inc).
#include "gpu/device.inc"
