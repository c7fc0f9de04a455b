// epifuse_conv_desc (the C ABI's problem struct) to ConvProblem, shared by every C entry point.
#pragma once
#include "conv_problem.h"
#include "epifuse_c_api.h"

namespace epifuse {

Status problem_from_desc(const epifuse_conv_desc* d, ConvProblem* p);

// Copies `message` into a C error buffer; returns 1 (the C ABI's failure code).
int32_t report_error(const std::string& message, char* err, size_t err_len);

}  // namespace epifuse
