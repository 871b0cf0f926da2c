// Uses the public API exactly as the README shows; exits non-zero when anything is wrong.
#include <tensorwire/tensorwire.hpp>

#include <cstdio>
#include <numeric>
#include <span>
#include <vector>

#define CHECK(cond)                                                 \
  do {                                                              \
    if (!(cond)) {                                                  \
      std::fprintf(stderr, "consumer: check failed: %s\n", #cond); \
      return 1;                                                     \
    }                                                               \
  } while (0)

int main() {
  // adopt: zero-copy, the tensor owns the vector's storage
  std::vector<double> v(1'000'000);
  std::iota(v.begin(), v.end(), 0.0);
  const double* storage = v.data();
  size_t n = v.size();
  auto t = tw::Tensor::adopt(std::move(v), {n});
  CHECK(t.data_ptr() == storage);

  // from_blob with a keep-alive, and a strided view of it
  auto owner = std::make_shared<std::vector<float>>(6);
  std::iota(owner->begin(), owner->end(), 0.0f);
  auto u = tw::Tensor::from_blob(owner->data(), {2, 3}, tw::DType::float32(), tw::Device::cpu(), owner);
  auto ut = u.transpose(0, 1);
  CHECK(!ut.is_contiguous());
  auto c = ut.contiguous();
  CHECK(c.is_contiguous() && c.data<const float>()[1] == 3.0f);
  CHECK(u.contiguous().data_ptr() == u.data_ptr());

  // copy_of: the explicit copy
  std::vector<int32_t> src{1, 2, 3, 4};
  auto w = tw::Tensor::copy_of(std::span<const int32_t>(src), {src.size()});
  CHECK(w.data_ptr() != static_cast<void*>(src.data()) && w.data<const int32_t>()[3] == 4);

  // DLPack, versioned and legacy, both ways
  DLManagedTensorVersioned* m = tw::to_dlpack(ut);
  auto back = tw::from_dlpack(m);
  CHECK(back.data_ptr() == ut.data_ptr() && back.strides() == ut.strides());
  DLManagedTensor* legacy = tw::to_dlpack_unversioned(u);
  auto back2 = tw::from_dlpack(legacy);
  CHECK(back2.shape() == u.shape());

  // metadata travels with views
  u.metadata().set("format", "XYXY");
  CHECK(u.slice(0, 1, 2).metadata().at("format").as_string() == "XYXY");

  std::printf("consumer: tensorwire %s works from an installed package\n", tw::version());
  return 0;
}
