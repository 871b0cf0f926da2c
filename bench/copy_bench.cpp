// copy_bench.cpp — GB/s of the copy engine's kernels next to memcpy of the same bytes (Google Benchmark).
//
// Each benchmark copies one strided source layout into a preallocated, already-touched C-contiguous result with
// tw::copy (the kernel alone: no allocation, no page faults), or makes it contiguous with Tensor::contiguous()
// (allocation included). bytes_per_second counts the bytes of the result. Before timing, each benchmark also
// measures memcpy of the same number of bytes between two touched buffers in the same process (best of a few
// runs) and reports it as the counters `memcpy_GBps` and `vs_memcpy` (tw GB/s / memcpy GB/s).
//
//   copy_bench --benchmark_filter='copy/transpose/float32/64MiB'        # one case
//   copy_bench --benchmark_format=json > copy.json                        # everything
//
// Names: {copy|contiguous}/<layout>/<dtype>/<size>/threads:<1|all>, and memcpy/<size> for the plain baseline.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tensorwire/copy.hpp"
#include "tensorwire/tensor.hpp"

namespace {

constexpr int64_t KiB = 1024, MiB = 1024 * 1024;

std::string size_name(int64_t n) {
  return n >= MiB ? std::to_string(n / MiB) + "MiB" : std::to_string(n / KiB) + "KiB";
}

// A near-square rows x cols with rows * cols == elems (elems a power of two).
std::pair<int64_t, int64_t> split2(int64_t elems) {
  int lg = 0;
  while ((int64_t(1) << (lg + 1)) <= elems) ++lg;
  const int64_t rows = int64_t(1) << (lg / 2);
  return {rows, elems / rows};
}

tw::Tensor filled(const tw::Shape& shape, tw::DType dt) {
  tw::Tensor t = tw::Tensor::empty(shape, dt);
  std::mt19937_64 rng(42);
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  const size_t n = static_cast<size_t>(t.nbytes());
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
  }
  return t;
}

// The layouts of bench_contiguous.py: each a view whose C-contiguous copy has `bytes` bytes.
tw::Tensor make_source(const std::string& layout, tw::DType dt, int64_t bytes) {
  const int64_t elems = bytes / static_cast<int64_t>(dt.itemsize());
  auto [rows, cols] = split2(elems);
  if (layout == "transpose") return filled({cols, rows}, dt).transpose(0, 1);
  if (layout == "slice2") return filled({rows, 2 * cols}, dt).slice(1, 0, std::nullopt, 2);
  if (layout == "nchw_nhwc") {
    const int64_t c = 64, hw = elems / c, n = std::max<int64_t>(1, hw / (128 * 128));
    auto [h, w] = split2(hw / n);
    return filled({n, c, h, w}, dt).permute({0, 2, 3, 1});
  }
  if (layout == "expand_row") return filled({1, cols}, dt).expand({rows, cols});
  if (layout == "expand_col") return filled({rows, 1}, dt).expand({rows, cols});
  if (layout == "dense_offset") return filled({elems + 1}, dt).slice(0, 1, std::nullopt);
  throw std::runtime_error("unknown layout " + layout);
}

void touch(void* p, size_t n) { std::memset(p, 0x5A, n); }

// memcpy GB/s for n bytes between two touched buffers: best of a few runs, at least ~20 ms in all.
double memcpy_gbps(size_t n) {
  std::vector<unsigned char> a(n, 1), b(n, 2);
  double best = 1e30;
  const int reps = static_cast<int>(std::clamp<size_t>((size_t(256) * MiB) / std::max<size_t>(n, 1), 5, 20000));
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) {
      std::memcpy(b.data(), a.data(), n);
      benchmark::ClobberMemory();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    best = std::min(best, s);
  }
  return static_cast<double>(n) / best / 1e9;
}

// Counters: the rate in decimal GB/s (Google Benchmark's bytes_per_second prints binary GiB/s), the memcpy rate
// of the same bytes, and their ratio. `seconds` is the wall time of the whole timed loop.
void set_counters(benchmark::State& state, int64_t bytes, double seconds, double memcpy) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes);
  const double gbps = static_cast<double>(bytes) * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters["GBps"] = gbps;
  state.counters["memcpy_GBps"] = memcpy;
  state.counters["vs_memcpy"] = gbps / memcpy;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void bm_copy(benchmark::State& state, std::string layout, tw::DType dt, int64_t bytes, int threads) {
  tw::set_num_threads(threads);
  tw::Tensor src = make_source(layout, dt, bytes);
  tw::Tensor dst = tw::Tensor::empty(src.shape(), dt);
  touch(dst.data_ptr(), static_cast<size_t>(dst.nbytes()));
  const double mc = memcpy_gbps(static_cast<size_t>(dst.nbytes()));
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    tw::copy(src, dst);
    benchmark::ClobberMemory();
  }
  set_counters(state, dst.nbytes(), since(t0), mc);
  tw::set_num_threads(0);
}

void bm_contiguous(benchmark::State& state, std::string layout, tw::DType dt, int64_t bytes, int threads) {
  tw::set_num_threads(threads);
  tw::Tensor src = make_source(layout, dt, bytes);
  if (layout == "dense_offset") src = src.view({src.numel()});  // contiguous already: copy() is what is measured
  const double mc = memcpy_gbps(static_cast<size_t>(src.nbytes()));
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    tw::Tensor out = layout == "dense_offset" ? src.copy() : src.contiguous();
    benchmark::DoNotOptimize(out.data_ptr());
  }
  set_counters(state, src.nbytes(), since(t0), mc);
  tw::set_num_threads(0);
}

void bm_memcpy(benchmark::State& state, int64_t bytes) {
  std::vector<unsigned char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 2);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), a.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes);
  state.counters["GBps"] = static_cast<double>(bytes) * static_cast<double>(state.iterations()) / since(t0) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int64_t> sizes = {4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB};
  const std::vector<std::string> layouts = {"transpose", "slice2", "nchw_nhwc", "expand_row", "expand_col",
                                            "dense_offset"};
  const std::vector<std::pair<std::string, tw::DType>> dtypes = {
      {"float32", tw::DType::float32()}, {"float64", tw::DType::float64()}, {"uint8", tw::DType::uint8()}};
  for (int64_t n : sizes) {
    benchmark::RegisterBenchmark(("memcpy/" + size_name(n)).c_str(), bm_memcpy, n)->UseRealTime();
  }
  for (const auto& layout : layouts)
    for (const auto& [dname, dt] : dtypes)
      for (int64_t n : sizes)
        for (int threads : {1, 0}) {
          const std::string suffix = layout + "/" + dname + "/" + size_name(n) + "/threads:" + (threads ? "1" : "all");
          benchmark::RegisterBenchmark(("copy/" + suffix).c_str(), bm_copy, layout, dt, n, threads)->UseRealTime();
          benchmark::RegisterBenchmark(("contiguous/" + suffix).c_str(), bm_contiguous, layout, dt, n, threads)
              ->UseRealTime();
        }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
