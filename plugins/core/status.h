// Result of a core operation: empty message means success. Adapters turn a failure into their
// own error type (OrtStatus, TensorRT error recorder, C ABI error buffer) after naming the node.
#pragma once
#include <string>
#include <utility>

namespace epifuse {

class [[nodiscard]] Status {
 public:
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }

 private:
  Status() = default;
  explicit Status(std::string message) : message_(std::move(message)) {
    if (message_.empty()) message_ = "unknown error";
  }
  std::string message_;
};

#define EPIFUSE_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::epifuse::Status status_ = (expr);      \
    if (!status_.ok()) return status_;       \
  } while (0)

}  // namespace epifuse
