// Status and Result<T>: the one error type inside kvd.
//
// A Status is either OK or carries a code and a human-readable message. Errors are
// turned into wire replies only at the handler edge; no exceptions cross a module
// boundary. Cheap to copy when OK (no allocation).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kvd {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // the request is malformed or names something out of range
  kNotFound,          // the request names something kvd does not have
  kAlreadyExists,
  kResourceExhausted, // no memory left even after eviction
  kFailedPrecondition,
  kUnavailable,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) { return {StatusCode::kAlreadyExists, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) { return {StatusCode::kFailedPrecondition, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: block id 9 out of range" or "OK".
  std::string ToString() const;

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}            // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}    // NOLINT: implicit by design
  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace kvd

#define KVD_RETURN_IF_ERROR(expr)            \
  do {                                       \
    ::kvd::Status _kvd_st = (expr);          \
    if (!_kvd_st.ok()) return _kvd_st;       \
  } while (0)
