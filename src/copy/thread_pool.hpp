// thread_pool.hpp (private) — a small fork-safe pool for splitting large copies.
// parallel_for(n, fn) runs fn(i) for i in [0, n) on up to get_num_threads() threads, the caller included, and
// returns when all are done. One job at a time: a concurrent caller that finds the pool busy runs its job alone
// on its own thread (correct, just not parallel). After fork() the child starts with no workers and builds a
// fresh pool on first use; the parent's threads do not exist in the child.
#pragma once

#include <cstdint>
#include <functional>

namespace tw::detail {

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);
int num_threads() noexcept;

}  // namespace tw::detail
