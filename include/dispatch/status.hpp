// SPDX-License-Identifier: Apache-2.0
// kdispatch — Status and Result<T>: the only error channel of the public API.
//
// Every exported function that can fail is noexcept and returns a Status (or
// a Result<T>, which is a Status plus a value); those that cannot fail are
// noexcept and return their value. The exceptions, twelve functions that only
// build a string or a copy and throw std::bad_alloc alone, are listed in
// docs/architecture.md ("Errors"; tests/test_docs.cpp keeps the list exact).
// The shape follows simdjson's error_code/simdjson_result: cheap on success
// (an ok Status holds no heap memory), a message naming the file, key or
// argument on failure.
#pragma once

#include <cstdint>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dispatch/export.hpp"

namespace dispatch {

/// Error codes. Stable numbers: the C ABI and the Python package expose them.
enum class StatusCode : int32_t {
  ok = 0,
  /// A caller argument is malformed: null pointer, bad shape, bad stride, an
  /// unknown dtype or op name, eps <= 0. The message names the argument.
  invalid_argument = 1,
  /// Arguments are well formed but no variant of this build computes this
  /// problem (for example a dtype combination the op does not implement).
  unsupported_problem = 2,
  /// The tensor lives on a device whose backend is not compiled in or has no
  /// usable device (a CUDA tensor in a CPU-only build). Never silently run on
  /// another device.
  unsupported_device = 3,
  /// A forced variant or config (for example through KDISPATCH_FORCE_*) names
  /// a variant that does not exist or declines the problem.
  no_variant = 4,
  /// A config file, config row or config value is invalid. Loading reports
  /// these per file and keeps going; this code is returned only by calls
  /// that were asked about one specific config.
  config_error = 5,
  /// The backend runtime (CUDA, HIP, a BLAS) returned an error; the message
  /// holds its native code and text.
  backend_error = 6,
  /// An allocation failed (host or device).
  out_of_memory = 7,
  /// A lookup found nothing (used by lookup-style calls where "no entry" is a
  /// result the caller may handle, never by the ops, which fall back to
  /// get_default).
  not_found = 8,
  /// A bug in kdispatch. Please report it.
  internal = 9,
  /// An I/O failure (a file could not be read or written).
  io_error = 10,
  /// The runtime is not in a state that allows the call (e.g. frozen:
  /// no tuning and no table changes).
  failed_precondition = 11,
};

/// The stable lower-case name of a code ("ok", "invalid_argument", ...).
KDISPATCH_API std::string_view status_code_name(StatusCode code) noexcept;

/// Outcome of an operation: a code and, on failure, a message.
/// An ok Status owns no memory. Thread-safety: a value type; distinct objects
/// may be used from any thread.
class [[nodiscard]] KDISPATCH_API Status {
 public:
  Status() noexcept = default;
  Status(StatusCode code, std::string message) noexcept : code_(code), message_(std::move(message)) {}

  static Status Ok() noexcept { return Status(); }

  bool ok() const noexcept { return code_ == StatusCode::ok; }
  explicit operator bool() const noexcept { return ok(); }
  StatusCode code() const noexcept { return code_; }
  /// Human-readable detail; empty for ok.
  const std::string& message() const noexcept { return message_; }
  /// "<code name>: <message>". Not noexcept: allocates the text, and throws
  /// std::bad_alloc (only) when memory runs out.
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

/// Builds a failed Status. Never throws: when the message cannot be
/// allocated the Status keeps its code and an empty message.
KDISPATCH_API Status make_status(StatusCode code, std::string_view message) noexcept;

/// A value of type T or a failed Status. Thread-safety: a value type.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) noexcept(std::is_nothrow_move_constructible_v<T>)  // NOLINT: implicit by design
      : has_value_(true) {
    new (&storage_) T(std::move(value));
  }
  Result(Status status) noexcept : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Status(StatusCode::internal, "Result built from an ok Status without a value");
  }
  Result(const Result& o) : status_(o.status_), has_value_(o.has_value_) {
    if (has_value_) new (&storage_) T(*o.ptr());
  }
  Result(Result&& o) noexcept(std::is_nothrow_move_constructible_v<T>)
      : status_(std::move(o.status_)), has_value_(o.has_value_) {
    if (has_value_) new (&storage_) T(std::move(*o.ptr()));
  }
  Result& operator=(Result o) noexcept(std::is_nothrow_move_constructible_v<T>) {
    reset();
    status_ = std::move(o.status_);
    has_value_ = o.has_value_;
    if (has_value_) new (&storage_) T(std::move(*o.ptr()));
    return *this;
  }
  ~Result() { reset(); }

  bool ok() const noexcept { return has_value_; }
  explicit operator bool() const noexcept { return has_value_; }
  /// The failure; an ok Status when a value is held.
  const Status& status() const noexcept { return status_; }
  /// The value. Precondition: ok().
  T& value() & noexcept { return *ptr(); }
  const T& value() const& noexcept { return *ptr(); }
  T&& value() && noexcept { return std::move(*ptr()); }
  T* operator->() noexcept { return ptr(); }
  const T* operator->() const noexcept { return ptr(); }
  T& operator*() & noexcept { return *ptr(); }
  const T& operator*() const& noexcept { return *ptr(); }

 private:
  T* ptr() noexcept { return std::launder(reinterpret_cast<T*>(&storage_)); }
  const T* ptr() const noexcept { return std::launder(reinterpret_cast<const T*>(&storage_)); }
  void reset() noexcept {
    if (has_value_) ptr()->~T();
    has_value_ = false;
  }

  Status status_;
  bool has_value_ = false;
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace dispatch
