// The lab's own operators (namespace: the build's TORCH_EXTENSION_NAME, see build.py).
//   pad_rows(Tensor x, int multiple) -> Tensor
//     x with zero rows appended to dim 0 until its size is a multiple of `multiple`.
//     A CPU kernel only: no Meta kernel, no fake kernel (extensions.compile-ready adds one).
//   scale_unboxed(Tensor x, float s) -> Tensor   x * s, an unboxed kernel (a C++ function)
//   scale_boxed(Tensor x, float s) -> Tensor     x * s, a boxed kernel (reads the IValue stack)
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

at::Tensor pad_rows_cpu(const at::Tensor& x, int64_t multiple) {
  TORCH_CHECK(x.dim() >= 1, "pad_rows: x must have at least one dimension");
  TORCH_CHECK(multiple >= 1, "pad_rows: multiple must be at least 1, got ", multiple);
  int64_t rows = x.size(0);
  int64_t padded = (rows + multiple - 1) / multiple * multiple;
  auto shape = x.sizes().vec();
  shape[0] = padded - rows;
  return at::cat({x, at::zeros(shape, x.options())}, 0);
}

at::Tensor scale_unboxed(const at::Tensor& x, double s) { return at::mul(x, s); }

// A boxed kernel sees the operator and a stack of IValues: it pops the arguments (the last
// one first) and pushes the results.
void scale_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  double s = torch::jit::pop(*stack).toDouble();
  at::Tensor x = torch::jit::pop(*stack).toTensor();
  torch::jit::push(*stack, at::mul(x, s));
}

TORCH_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("pad_rows(Tensor x, int multiple) -> Tensor");
  m.def("scale_unboxed(Tensor x, float s) -> Tensor");
  m.def("scale_boxed(Tensor x, float s) -> Tensor");
}

TORCH_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CPU, m) {
  m.impl("pad_rows", &pad_rows_cpu);
  m.impl("scale_unboxed", &scale_unboxed);
  m.impl("scale_boxed", torch::CppFunction::makeFromBoxedFunction<&scale_boxed>());
}
