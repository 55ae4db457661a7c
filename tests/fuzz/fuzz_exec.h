// Helpers the exec fuzz targets share: run one iteration of a compiled executable on host
// memory with zero-filled feeds, and the ONNX path (compile for inference, and for training when
// the first output is a float scalar, running each once). Every failure is a Status, dropped.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "exec/executable.h"
#include "salus/status.h"

namespace salus::fuzz {

// Limits every exec target compiles with (exec::CompileLimits, Note [Compile budgets]): a
// small model cannot make compilation or an iteration take unbounded memory or time.
constexpr int64_t kMaxTensorElements = int64_t{1} << 20;
constexpr uint64_t kMaxConstantBytes = uint64_t{64} << 20;
constexpr int64_t kMaxNodes = 4096;
constexpr std::chrono::seconds kCompileDeadline{10};  // below libFuzzer's -timeout=20
// Executables whose P + E exceed this are compiled but not run.
constexpr uint64_t kMaxRunBytes = uint64_t{64} << 20;

// CompileOptions with the limits above, the deadline from now (the CPU, inference).
exec::CompileOptions SmallCompileOptions();

// With SALUS_FUZZ_VERBOSE=1 in the environment, prints `what` and `status` to stderr when it
// is not OK (why a seed does not compile or run); nothing otherwise.
void Explain(std::string_view what, const Status& status);

// Initializes the persistent block and runs one iteration with zero-filled feeds when P + E
// is at most `max_run_bytes`.
void RunOnce(const exec::Executable& exe, uint64_t max_run_bytes = kMaxRunBytes);

// Compiles `model` (ONNX bytes) for inference and runs it once; when its first output is a
// float scalar, compiles it for training with that output as the loss and runs that once.
void CompileOnnxAndRun(std::string_view model);

}  // namespace salus::fuzz
