#include "addon/js_values.h"

#include <cmath>

#include "addon/addon_state.h"
#include "common/error.h"

namespace torpor::js {

bool has(const Napi::Object& o, const char* key) {
  Napi::Value v = unwrap(o.Get(key));
  return !v.IsUndefined() && !v.IsNull();
}

std::string get_string(const Napi::Object& o, const char* key, bool required, const std::string& fallback) {
  if (!has(o, key)) {
    if (required) throw Error(code::kInvalidArgument, std::string(key) + " is required");
    return fallback;
  }
  Napi::Value v = unwrap(o.Get(key));
  if (!v.IsString()) throw Error(code::kInvalidArgument, std::string(key) + " must be a string");
  std::string s = v.As<Napi::String>().Utf8Value();
  if (s.find('\0') != std::string::npos) throw Error(code::kInvalidArgument, std::string(key) + " contains a NUL byte");
  return s;
}

uint64_t to_uint(const Napi::Value& v, const char* what, uint64_t min, uint64_t max) {
  if (!v.IsNumber()) throw Error(code::kInvalidArgument, std::string(what) + " must be a number");
  double d = v.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(min) || d > static_cast<double>(max))
    throw Error(code::kInvalidArgument, std::string(what) + " must be an integer in " + std::to_string(min) + ".." +
                                            std::to_string(max));
  return static_cast<uint64_t>(d);
}

uint64_t get_uint(const Napi::Object& o, const char* key, uint64_t min, uint64_t max, std::optional<uint64_t> fallback) {
  if (!has(o, key)) {
    if (!fallback) throw Error(code::kInvalidArgument, std::string(key) + " is required");
    return *fallback;
  }
  return to_uint(unwrap(o.Get(key)), key, min, max);
}

bool get_bool(const Napi::Object& o, const char* key, bool fallback) {
  if (!has(o, key)) return fallback;
  Napi::Value v = unwrap(o.Get(key));
  if (!v.IsBoolean()) throw Error(code::kInvalidArgument, std::string(key) + " must be a boolean");
  return v.As<Napi::Boolean>().Value();
}

}  // namespace torpor::js
