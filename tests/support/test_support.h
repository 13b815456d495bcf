// support/test_support.h: small helpers shared by the unit and ref suites.
//
// - throws_with<Exc>(fn, {"part", ...}): fn must throw Exc (or a subclass) whose what()
//   contains every part; the failure message shows what was thrown instead.
// - contains(text, part): an AssertionResult that prints both strings on failure.
// - param_name(text): a gtest-safe parameter name (alphanumerics and '_').
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <exception>
#include <string>
#include <typeinfo>
#include <vector>

#include "comet/error.h"

namespace comet::test {

inline ::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected \"" << part << "\" in message: \"" << text
                                       << "\"";
}

// Runs fn; success when it throws Exc whose message contains every string of `parts`.
// `message` (optional) receives what() of the exception.
template <class Exc, class Fn>
::testing::AssertionResult throws_with(Fn&& fn, const std::vector<std::string>& parts = {},
                                       std::string* message = nullptr) {
  try {
    fn();
  } catch (const Exc& e) {
    const std::string what = e.what();
    if (message) *message = what;
    for (const std::string& part : parts) {
      if (what.find(part) == std::string::npos) {
        return ::testing::AssertionFailure()
               << "threw the expected type, but \"" << part << "\" is not in: \"" << what << "\"";
      }
    }
    return ::testing::AssertionSuccess() << "threw: " << what;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw another type (" << typeid(e).name()
                                         << "): " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw a non-std exception";
  }
  return ::testing::AssertionFailure() << "did not throw";
}

inline std::string param_name(const std::string& text) {
  std::string out;
  for (char c : text) {
    out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  }
  return out.empty() ? std::string("case") : out;
}

}  // namespace comet::test
