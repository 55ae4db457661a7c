#include "salus/status.h"

#include <array>

namespace salus {
namespace {

constexpr std::array<std::string_view, 17> kCodeNames = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

}  // namespace

std::string_view StatusCodeName(StatusCode code) {
  const auto i = static_cast<size_t>(code);
  if (i >= kCodeNames.size()) return "UNKNOWN";
  return kCodeNames[i];
}

bool StatusCodeFromName(std::string_view name, StatusCode* code) {
  for (size_t i = 0; i < kCodeNames.size(); ++i) {
    if (kCodeNames[i] == name) {
      *code = static_cast<StatusCode>(i);
      return true;
    }
  }
  return false;
}

Status::Status(StatusCode code, std::string message)
    : code_(code), message_(code == StatusCode::kOk ? std::string() : std::move(message)) {}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg));
}

std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

#define SALUS_DEFINE_ERROR(Name, Code) \
  Status Name(std::string message) { return Status(StatusCode::Code, std::move(message)); }
SALUS_DEFINE_ERROR(CancelledError, kCancelled)
SALUS_DEFINE_ERROR(UnknownError, kUnknown)
SALUS_DEFINE_ERROR(InvalidArgumentError, kInvalidArgument)
SALUS_DEFINE_ERROR(DeadlineExceededError, kDeadlineExceeded)
SALUS_DEFINE_ERROR(NotFoundError, kNotFound)
SALUS_DEFINE_ERROR(AlreadyExistsError, kAlreadyExists)
SALUS_DEFINE_ERROR(PermissionDeniedError, kPermissionDenied)
SALUS_DEFINE_ERROR(ResourceExhaustedError, kResourceExhausted)
SALUS_DEFINE_ERROR(FailedPreconditionError, kFailedPrecondition)
SALUS_DEFINE_ERROR(AbortedError, kAborted)
SALUS_DEFINE_ERROR(OutOfRangeError, kOutOfRange)
SALUS_DEFINE_ERROR(UnimplementedError, kUnimplemented)
SALUS_DEFINE_ERROR(InternalError, kInternal)
SALUS_DEFINE_ERROR(UnavailableError, kUnavailable)
SALUS_DEFINE_ERROR(DataLossError, kDataLoss)
SALUS_DEFINE_ERROR(UnauthenticatedError, kUnauthenticated)
#undef SALUS_DEFINE_ERROR

}  // namespace salus
