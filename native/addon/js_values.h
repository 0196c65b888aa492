// Reading plain JS values into C++ (config objects), with INVALID_ARGUMENT
// errors that name the offending field.
#pragma once

#include "addon/napi_config.h"

#include <cstdint>
#include <optional>
#include <string>

namespace torpor::js {

bool has(const Napi::Object& o, const char* key);  // present and not undefined/null
std::string get_string(const Napi::Object& o, const char* key, bool required, const std::string& fallback = "");
uint64_t get_uint(const Napi::Object& o, const char* key, uint64_t min, uint64_t max, std::optional<uint64_t> fallback);
bool get_bool(const Napi::Object& o, const char* key, bool fallback);
uint64_t to_uint(const Napi::Value& v, const char* what, uint64_t min, uint64_t max);

}  // namespace torpor::js
