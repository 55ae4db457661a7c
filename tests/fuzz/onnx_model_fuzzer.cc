// libFuzzer target over ONNX model bytes: compile (inference, and training when the first
// output is a float scalar), then run one iteration on zero-filled inputs. Any input must
// end in a Status, never a crash, a sanitizer report or a hang. onnx_graph_fuzzer mutates the
// same models through their structure.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_exec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  salus::fuzz::CompileOnnxAndRun(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
