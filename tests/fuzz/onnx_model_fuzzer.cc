// libFuzzer target over ONNX model bytes: compile (inference, and training when the first
// output is a float scalar), then run one iteration on zero-filled inputs. Any input must
// end in a Status, never a crash, a sanitizer report or a hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "exec/alignment.h"
#include "exec/executable.h"

namespace {

using salus::exec::CompileOptions;
using salus::exec::Executable;

// Executables larger than this are compiled but not run.
constexpr uint64_t kMaxRunBytes = uint64_t{64} << 20;
constexpr int64_t kMaxTensorElements = int64_t{1} << 20;
constexpr uint64_t kMaxFoldedBytes = uint64_t{64} << 20;

void RunOnce(Executable& exe) {
  if (exe.persistent_bytes() + exe.ephemeral_bytes() > kMaxRunBytes) return;
  constexpr uint64_t kAlign = salus::exec::kAlignment;
  std::vector<std::byte> persistent(exe.persistent_bytes() + kAlign),
      lane(exe.ephemeral_bytes() + kAlign);
  auto align = [](std::vector<std::byte>& v) {
    auto a = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + (kAlign - a % kAlign) % kAlign;
  };
  if (!exe.InitializePersistent(align(persistent)).ok()) return;
  std::vector<std::vector<std::byte>> feeds, fetches;
  std::vector<const void*> feed_ptrs;
  std::vector<void*> fetch_ptrs;
  for (const auto& info : exe.inputs()) feeds.emplace_back(info.bytes + 1);
  for (const auto& info : exe.fetches()) fetches.emplace_back(info.bytes + 1);
  for (auto& f : feeds) feed_ptrs.push_back(f.data());
  for (auto& f : fetches) fetch_ptrs.push_back(f.data());
  exe.Run(align(persistent), align(lane), feed_ptrs, fetch_ptrs).IgnoreError();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  CompileOptions options;
  options.max_tensor_elements = kMaxTensorElements;
  options.max_folded_bytes = kMaxFoldedBytes;
  auto exe = Executable::Compile(bytes, options);
  if (!exe.ok()) return 0;
  RunOnce(**exe);
  if ((*exe)->fetches().empty()) return 0;
  const auto& first = (*exe)->fetches()[0];
  if (first.type != salus::exec::DataType::kFloat32 || first.bytes != 4) return 0;
  options.mode = salus::exec::Mode::kTraining;
  options.loss = first.name;
  auto train = Executable::Compile(bytes, options);
  if (train.ok()) RunOnce(**train);
  return 0;
}
