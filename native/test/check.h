// A minimal test harness for the KVM-free native unit tests.
// TEST(name) { CHECK(cond); CHECK_EQ(a, b); } ; tests register themselves and
// main.cc runs them all, printing "N passed, N failed".
#pragma once

#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace torpor_test {

struct Case {
  const char* name;
  std::function<void()> fn;
};
std::vector<Case>& registry();
struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};
struct Failure {
  std::string what;
};
[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  os << file << ":" << line << ": " << what;
  throw Failure{os.str()};
}

// Said beside the figures the tests print: timings of a sanitizer build are not release timings.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr const char* kBuildKind = "sanitizer build: slower than release";
#else
inline constexpr const char* kBuildKind = "no sanitizers";
#endif

}  // namespace torpor_test

#define TORPOR_CAT2(a, b) a##b
#define TORPOR_CAT(a, b) TORPOR_CAT2(a, b)
#define TEST(name)                                                                  \
  static void TORPOR_CAT(test_fn_, __LINE__)();                                     \
  static ::torpor_test::Registrar TORPOR_CAT(test_reg_, __LINE__)(name, TORPOR_CAT(test_fn_, __LINE__)); \
  static void TORPOR_CAT(test_fn_, __LINE__)()

#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) ::torpor_test::fail(__FILE__, __LINE__, "CHECK(" #cond ")"); \
  } while (0)

#define CHECK_EQ(a, b)                                                                   \
  do {                                                                                   \
    auto _va = (a);                                                                      \
    auto _vb = (b);                                                                      \
    if (!(_va == _vb)) {                                                                 \
      std::ostringstream _os;                                                            \
      _os << "CHECK_EQ(" #a ", " #b "): " << +_va << " != " << +_vb;                     \
      ::torpor_test::fail(__FILE__, __LINE__, _os.str());                                \
    }                                                                                    \
  } while (0)

// For strings (CHECK_EQ prints with unary +, which strings lack).
#define CHECK_STR_EQ(a, b)                                                                      \
  do {                                                                                          \
    std::string _sa = (a);                                                                      \
    std::string _sb = (b);                                                                      \
    if (_sa != _sb)                                                                             \
      ::torpor_test::fail(__FILE__, __LINE__, "CHECK_STR_EQ(" #a ", " #b "): '" + _sa + "' != '" + _sb + "'"); \
  } while (0)

// Expects `expr` to throw torpor::Error with the given code.
#define CHECK_THROWS_CODE(expr, code_str)                                                  \
  do {                                                                                     \
    bool _threw = false;                                                                   \
    try {                                                                                  \
      expr;                                                                                \
    } catch (const ::torpor::Error& _e) {                                                  \
      _threw = true;                                                                       \
      if (std::string(_e.code()) != (code_str))                                            \
        ::torpor_test::fail(__FILE__, __LINE__, std::string("threw ") + _e.code() + ", want " + (code_str)); \
    }                                                                                      \
    if (!_threw) ::torpor_test::fail(__FILE__, __LINE__, "expected " #expr " to throw " code_str); \
  } while (0)
