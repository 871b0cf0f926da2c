// Helpers of the GPU suites (test_cuda_gpu.cpp, test_cuda_ipc_gpu.cpp) and their peer program: the skip rule, and
// a tensor's elements as text, so that two processes can compare what they hold.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tensorwire/cuda.hpp"
#include "tensorwire/tensorwire.hpp"

namespace tw_test {

inline bool env_is_one(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

/// "1,2,3" ("-" when empty).
inline std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s.empty() ? "-" : s;
}

/// A tensor's elements in C order, brought to the host: hex when at most 4 KiB, else "fnv:" and the FNV-1a 64 hash
/// of them (offset basis and prime from the FNV specification), in hex.
inline std::string bytes_of(const tw::Tensor& t) {
  const tw::Tensor h = t.to(tw::Device::cpu()).contiguous();
  const auto* p = static_cast<const unsigned char*>(h.data_ptr());
  const auto n = static_cast<size_t>(h.nbytes());
  char hex[17];
  if (n > 4096) {
    uint64_t fnv = 14695981039346656037ull;
    for (size_t i = 0; i < n; ++i) fnv = (fnv ^ p[i]) * 1099511628211ull;
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv));
    return std::string("fnv:") + hex;
  }
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(hex, sizeof hex, "%02x", p[i]);
    s += hex;
  }
  return s.empty() ? "-" : s;
}

}  // namespace tw_test

// The first statement of every GPU test: skip without a device (fail instead under TW_REQUIRE_CUDA=1, which
// scripts/test-gpu.sh sets, so that a driver failing to load there cannot pass as a run of skips).
#define TW_NEED_CUDA()                                                                                         \
  do {                                                                                                         \
    if (!tw::cuda::is_available()) {                                                                           \
      if (::tw_test::env_is_one("TW_REQUIRE_CUDA"))                                                            \
        FAIL() << "TW_REQUIRE_CUDA=1 but no CUDA device: " << tw::cuda::status();                              \
      GTEST_SKIP() << "no CUDA device: " << tw::cuda::status();                                                \
    }                                                                                                          \
  } while (0)
