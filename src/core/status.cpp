// SPDX-License-Identifier: Apache-2.0
#include "dispatch/status.hpp"

#include <string>

namespace dispatch {

std::string_view status_code_name(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::unsupported_problem: return "unsupported_problem";
    case StatusCode::unsupported_device: return "unsupported_device";
    case StatusCode::no_variant: return "no_variant";
    case StatusCode::config_error: return "config_error";
    case StatusCode::backend_error: return "backend_error";
    case StatusCode::out_of_memory: return "out_of_memory";
    case StatusCode::not_found: return "not_found";
    case StatusCode::internal: return "internal";
    case StatusCode::io_error: return "io_error";
    case StatusCode::failed_precondition: return "failed_precondition";
  }
  return "unknown";
}

std::string Status::to_string() const {
  std::string s(status_code_name(code_));
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

Status make_status(StatusCode code, std::string_view message) noexcept {
  try {
    return Status(code, std::string(message));
  } catch (...) {
    return Status(code, std::string());
  }
}

}  // namespace dispatch
