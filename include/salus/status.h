// Status and StatusOr<T>: the one way errors travel in Salus.
//
// Codes are the canonical ones (the same vocabulary and numbering as gRPC and abseil), so a
// status maps one-to-one onto the wire's Status {code, message}. A Status is [[nodiscard]]:
// ignoring one is a compile error under -Werror.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace salus {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// "INVALID_ARGUMENT" for kInvalidArgument; "UNKNOWN" for a value outside the enum.
std::string_view StatusCodeName(StatusCode code);
// The inverse of StatusCodeName; false if the name is not a canonical code.
bool StatusCodeFromName(std::string_view name, StatusCode* code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: bad size '12XB'", or "OK".
  std::string ToString() const;

  // Returns a status with "context: " prepended to the message; OK stays OK.
  Status WithContext(std::string_view context) const;

  // Explicitly drops a status where failure is acceptable; the call site documents why.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

inline Status OkStatus() { return Status(); }
Status CancelledError(std::string message);
Status UnknownError(std::string message);
Status InvalidArgumentError(std::string message);
Status DeadlineExceededError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status PermissionDeniedError(std::string message);
Status ResourceExhaustedError(std::string message);
Status FailedPreconditionError(std::string message);
Status AbortedError(std::string message);
Status OutOfRangeError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status UnavailableError(std::string message);
Status DataLossError(std::string message);
Status UnauthenticatedError(std::string message);

// Either a value or a non-OK status. Constructing one from an OK status is a programming
// error and yields an INTERNAL status instead.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const T& value) : v_(value) {}                  // NOLINT(google-explicit-constructor)
  StatusOr(T&& value) : v_(std::move(value)) {}            // NOLINT(google-explicit-constructor)
  StatusOr(const Status& status) : v_(Checked(status)) {}  // NOLINT
  StatusOr(Status&& status) : v_(Checked(std::move(status))) {}  // NOLINT
  template <typename U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, Status> &&
           !std::is_same_v<std::decay_t<U>, StatusOr<T>> && !std::is_same_v<std::decay_t<U>, T>)
      StatusOr(U&& value)
      : v_(T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  // Precondition: ok(). Accessing the value of an error is a broken invariant (throws
  // std::bad_variant_access), never a path a request can reach when callers check ok().
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

  template <typename U>
  T value_or(U&& fallback) const& {
    return ok() ? value() : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  static Status Checked(Status s) {
    if (s.ok()) return InternalError("StatusOr constructed from an OK status");
    return s;
  }
  std::variant<Status, T> v_;
};

namespace internal {
inline const Status& AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const StatusOr<T>& s) {
  return s.status();
}
}  // namespace internal

}  // namespace salus

#define SALUS_STATUS_CONCAT_INNER(a, b) a##b
#define SALUS_STATUS_CONCAT(a, b) SALUS_STATUS_CONCAT_INNER(a, b)

// Returns the status of `expr` (a Status or StatusOr) from the enclosing function if not OK.
#define SALUS_RETURN_IF_ERROR(expr)                                          \
  do {                                                                       \
    const ::salus::Status _salus_status = ::salus::internal::AsStatus(expr); \
    if (!_salus_status.ok()) return _salus_status;                           \
  } while (false)

// SALUS_ASSIGN_OR_RETURN(auto x, MakeX()); declares or assigns lhs from a StatusOr, or
// returns its status.
#define SALUS_ASSIGN_OR_RETURN(lhs, expr) \
  SALUS_ASSIGN_OR_RETURN_IMPL(SALUS_STATUS_CONCAT(_salus_statusor_, __LINE__), lhs, expr)
#define SALUS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
