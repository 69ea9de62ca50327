// SPDX-License-Identifier: Apache-2.0
// kdispatch — symbol visibility. The library is built with hidden visibility;
// only entities marked KDISPATCH_API are exported from libkdispatch.
#pragma once

#if defined(KDISPATCH_STATIC_DEFINE)
#define KDISPATCH_API
#elif defined(_WIN32)
#if defined(KDISPATCH_BUILDING)
#define KDISPATCH_API __declspec(dllexport)
#else
#define KDISPATCH_API __declspec(dllimport)
#endif
#else
#define KDISPATCH_API [[gnu::visibility("default")]]
#endif
