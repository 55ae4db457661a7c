// libFuzzer target over the structure of ONNX models: inputs are serialized onnx.ModelProto,
// mutated through ProtoMutator (nodes added, dropped, duplicated and rewired to other values'
// names, attributes and dims set to interesting values, initializers' bytes mutated), then
// compiled and run as onnx_model_fuzzer does (CompileOnnxAndRun). Any input must end in a
// Status.
#include <onnx/onnx_pb.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_exec.h"
#include "proto_mutator.h"

namespace {

// Words a mutated string may become: op types and attribute names the importer looks up.
salus::fuzz::ProtoMutator Mutator(unsigned seed) {
  salus::fuzz::ProtoMutator m(seed);
  // clang-format off
  m.set_dictionary({"Add", "Mul", "Sub", "Div", "MatMul", "Gemm", "Relu", "Conv", "MaxPool",
                    "AveragePool", "BatchNormalization", "Reshape", "Transpose", "Concat",
                    "Softmax", "Sigmoid", "Flatten", "Pad", "Slice", "Gather", "Expand",
                    "ReduceMean", "ReduceSum", "Cast", "Shape", "Constant", "Split", "Squeeze",
                    "Unsqueeze", "LSTM", "Dropout", "SoftmaxCrossEntropyLoss", "ConvTranspose",
                    "axis", "axes", "perm", "shape", "kernel_shape", "strides", "pads", "dilations",
                    "group", "transA", "transB", "alpha", "beta", "epsilon", "keepdims", "value",
                    "to", "mode", ""});
  // clang-format on
  return m;
}

}  // namespace

SALUS_FUZZ_PROTO_HOOKS(onnx::ModelProto, Mutator)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  salus::fuzz::CompileOnnxAndRun(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
