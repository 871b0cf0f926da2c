// Helpers shared by the tensorwire GoogleTest suites: error-code assertions and readable printing of our types.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "tensorwire/tensorwire.hpp"

namespace tw {
// gtest picks these up (argument-dependent lookup) when printing values in failure messages.
inline void PrintTo(ErrorCode c, std::ostream* os) { *os << error_code_name(c); }
inline void PrintTo(const DType& d, std::ostream* os) { *os << d.name(); }
inline void PrintTo(const Device& d, std::ostream* os) { *os << d.str(); }
inline void PrintTo(const Dims& d, std::ostream* os) { *os << d.str(); }
}  // namespace tw

/// Asserts that `stmt` throws tw::Error with `expected_code`, and (when `substr` is non-empty) that the message
/// contains `substr`. Any other outcome (no throw, another exception type, another code) is a failure.
#define TW_EXPECT_ERROR_MSG(stmt, expected_code, substr)                                                   \
  do {                                                                                                     \
    try {                                                                                                  \
      stmt;                                                                                                \
      ADD_FAILURE() << "expected tw::Error(" << ::tw::error_code_name(expected_code) << ") from: " #stmt;  \
    } catch (const ::tw::Error& tw_err_) {                                                                 \
      EXPECT_EQ(tw_err_.code(), (expected_code)) << "from: " #stmt << "\nmessage: " << tw_err_.what();     \
      const std::string tw_sub_(substr);                                                                   \
      if (!tw_sub_.empty()) {                                                                              \
        EXPECT_NE(std::string(tw_err_.what()).find(tw_sub_), std::string::npos)                            \
            << "message of " #stmt " lacks '" << tw_sub_ << "': " << tw_err_.what();                       \
      }                                                                                                    \
    } catch (const std::exception& tw_ex_) {                                                               \
      ADD_FAILURE() << "expected tw::Error from " #stmt ", got another exception: " << tw_ex_.what();       \
    }                                                                                                      \
  } while (0)

#define TW_EXPECT_ERROR(stmt, expected_code) TW_EXPECT_ERROR_MSG(stmt, expected_code, "")
