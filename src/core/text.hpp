// Small helpers for the text of error messages.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace tw::detail {

/// "1 buffer", "2 buffers": a count and its noun, the noun made plural by an "s" when the count is not one.
inline std::string counted(int64_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

/// Why a subscriber's stream ended when its own close() ended it, saying what close() discarded unread.
inline std::string closed_subscriber_text(uint64_t discarded) {
  if (discarded == 0) return "this subscriber was closed";
  return "this subscriber was closed with " + counted(int64_t(discarded), "unread message") +
         " queued; close() discarded " + (discarded == 1 ? "it" : "them");
}

/// A size as a person reads it: "16 bytes", "12.5 KiB", "8.0 MiB", "2.5 GiB" (one decimal from KiB up).
inline std::string bytes_text(uint64_t n) {
  if (n < 1024) return counted(int64_t(n), "byte");
  const char* unit = "KiB";
  double v = double(n) / 1024.0;
  if (n >= (uint64_t(1) << 30)) {
    unit = "GiB";
    v = double(n) / double(uint64_t(1) << 30);
  } else if (n >= (uint64_t(1) << 20)) {
    unit = "MiB";
    v = double(n) / double(uint64_t(1) << 20);
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, unit);
  return buf;
}

/// A duration in nanoseconds as a person writes it: "0 s", "250 ms", "1.5 s", "20 us", "3 min 20 s".
inline std::string duration_text(int64_t ns) {
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return std::string(buf);
  };
  if (ns < 0) return "-" + duration_text(ns == INT64_MIN ? INT64_MAX : -ns);
  if (ns == 0) return "0 s";
  if (ns < 1000) return std::to_string(ns) + " ns";
  if (ns < 1000000) return num(double(ns) / 1e3) + " us";
  if (ns < 1000000000) return num(double(ns) / 1e6) + " ms";
  if (ns < 120 * int64_t(1000000000)) return num(double(ns) / 1e9) + " s";
  const int64_t s = ns / 1000000000;
  if (s < 7200) return std::to_string(s / 60) + " min" + (s % 60 ? " " + std::to_string(s % 60) + " s" : "");
  return num(double(s) / 3600.0) + " h";
}

}  // namespace tw::detail
