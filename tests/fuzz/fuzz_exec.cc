// fuzz_exec.h: one iteration on host memory, and the ONNX compile-and-run path.
#include "fuzz_exec.h"

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "exec/alignment.h"

namespace salus::fuzz {

using exec::CompileOptions;
using exec::Executable;

CompileOptions SmallCompileOptions() {
  CompileOptions options;
  options.limits.max_tensor_elements = kMaxTensorElements;
  options.limits.max_constant_bytes = kMaxConstantBytes;
  options.limits.max_nodes = kMaxNodes;
  options.limits.deadline = std::chrono::steady_clock::now() + kCompileDeadline;
  return options;
}

void Explain(std::string_view what, const Status& status) {
  static const bool verbose = [] {
    const char* env = std::getenv("SALUS_FUZZ_VERBOSE");
    return env != nullptr && std::string_view(env) == "1";
  }();
  if (verbose && !status.ok()) {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(what.size()), what.data(),
                 status.ToString().c_str());
  }
}

void RunOnce(const Executable& exe, uint64_t max_run_bytes) {
  if (exe.persistent_bytes() + exe.ephemeral_bytes() > max_run_bytes) return;
  constexpr uint64_t kAlign = exec::kAlignment;
  std::vector<std::byte> persistent(exe.persistent_bytes() + kAlign),
      lane(exe.ephemeral_bytes() + kAlign);
  auto align = [](std::vector<std::byte>& v) {
    auto a = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + (kAlign - a % kAlign) % kAlign;
  };
  if (Status s = exe.InitializePersistent(align(persistent)); !s.ok()) {
    return Explain("initialize", s);
  }
  std::vector<std::vector<std::byte>> feeds, fetches;
  std::vector<const void*> feed_ptrs;
  std::vector<void*> fetch_ptrs;
  for (const auto& info : exe.inputs()) feeds.emplace_back(info.bytes + 1);
  for (const auto& info : exe.fetches()) fetches.emplace_back(info.bytes + 1);
  for (auto& f : feeds) feed_ptrs.push_back(f.data());
  for (auto& f : fetches) fetch_ptrs.push_back(f.data());
  Explain("run", exe.Run(align(persistent), align(lane), feed_ptrs, fetch_ptrs));
}

void CompileOnnxAndRun(std::string_view model) {
  CompileOptions options = SmallCompileOptions();
  auto exe = Executable::Compile(model, options);
  if (!exe.ok()) return Explain("compile", exe.status());
  RunOnce(**exe);
  if ((*exe)->fetches().empty()) return;
  const auto& first = (*exe)->fetches()[0];
  if (first.type != exec::DataType::kFloat32 || first.bytes != 4) return;
  options.mode = exec::Mode::kTraining;
  options.loss = first.name;
  auto train = Executable::Compile(model, options);
  if (!train.ok()) return Explain("compile for training", train.status());
  RunOnce(**train);
}

}  // namespace salus::fuzz
