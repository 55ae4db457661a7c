// libFuzzer target over the PyTorch adaptor's ATen graphs (salus.v1.AtenGraph), mutated through
// their structure by ProtoMutator, compiled by Executable::CompileAten with small limits (the
// graph fixes its own shapes) and run once when small. Any input must end in a Status.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_exec.h"
#include "proto_mutator.h"
#include "salus/v1/aten_graph.pb.h"

namespace {

salus::fuzz::ProtoMutator Mutator(unsigned seed) {
  salus::fuzz::ProtoMutator m(seed);
  // clang-format off
  m.set_dictionary({"aten.addmm.default", "aten.mm.default", "aten.relu.default", "aten.mean.dim",
                    "aten.sum.dim_IntList", "aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor",
                    "aten.div.Tensor", "aten.copy_.default", "aten.permute_copy.default",
                    "aten.view_copy.default", "aten.t_copy.default", "aten.convolution.default",
                    "aten.threshold_backward.default", "aten._log_softmax.default",
                    "aten.nll_loss_forward.default", "aten.expand_copy.default",
                    "aten.clone.default", "aten.detach.default", "self", "other", "input", "mat1",
                    "mat2", "alpha", "beta", "dim", "keepdim", "dims", "size", "stride", "padding",
                    "dilation", "groups", "src", "non_blocking", "dtype", "float32", "int64",
                    "weight", "bias", "target", "reduction", "ignore_index", "half_to_float",
                    "threshold"});
  // clang-format on
  return m;
}

}  // namespace

SALUS_FUZZ_PROTO_HOOKS(salus::v1::AtenGraph, Mutator)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto exe = salus::exec::Executable::CompileAten(
      std::string_view(reinterpret_cast<const char*>(data), size),
      salus::fuzz::SmallCompileOptions());
  if (!exe.ok()) {
    salus::fuzz::Explain("compile", exe.status());
    return 0;
  }
  salus::fuzz::RunOnce(**exe);
  return 0;
}
