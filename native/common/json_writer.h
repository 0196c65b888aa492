// A small JSON writer for files native code writes for people and tools (a
// snapshot generation's manifest.json): objects, arrays, strings, unsigned
// integers and booleans, with the commas and string escaping done in one
// place instead of by hand at each call site.
//
//   JsonWriter w;
//   w.begin_object().key("generation").value(uint64_t{3}).key("layers").begin_array();
//   for (auto& p : layers) w.value(p);
//   w.end_array().end_object();
//   std::string text = w.str();
//
// Misuse (a key outside an object, an unbalanced end) is a programming error:
// Error(INTERNAL), never an abort.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace torpor {

// `s` as a JSON string literal, quotes included: '"' and '\' escaped, control
// characters as \u00XX; other bytes (UTF-8 or not) pass through.
std::string json_string(std::string_view s);

class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  // The member name of the value that follows (objects only).
  JsonWriter& key(std::string_view name);
  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(uint64_t n);
  JsonWriter& value(bool b);
  // Each string of `items` as an array.
  JsonWriter& string_array(const std::vector<std::string>& items);

  // The text so far; complete once every object and array is closed.
  const std::string& str() const { return out_; }
  bool complete() const { return open_.empty() && !out_.empty(); }

 private:
  struct Level {
    bool object;
    bool empty = true;
    bool after_key = false;
  };
  void before_value();
  void close(bool object, char c);

  std::string out_;
  std::vector<Level> open_;
};

}  // namespace torpor
