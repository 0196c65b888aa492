#include "common/json_writer.h"

#include <cstdio>

#include "common/error.h"

namespace torpor {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

void JsonWriter::before_value() {
  if (open_.empty()) {
    if (!out_.empty()) throw Error(code::kInternal, "json writer: a second top-level value");
    return;
  }
  Level& l = open_.back();
  if (l.object) {
    if (!l.after_key) throw Error(code::kInternal, "json writer: a value in an object without a key");
    l.after_key = false;
    return;
  }
  if (!l.empty) out_ += ',';
  l.empty = false;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  if (open_.empty() || !open_.back().object || open_.back().after_key)
    throw Error(code::kInternal, "json writer: a key outside an object, or two keys in a row");
  Level& l = open_.back();
  if (!l.empty) out_ += ',';
  l.empty = false;
  l.after_key = true;
  out_ += json_string(name);
  out_ += ':';
  return *this;
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  open_.push_back({true});
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  open_.push_back({false});
  return *this;
}

void JsonWriter::close(bool object, char c) {
  if (open_.empty() || open_.back().object != object || open_.back().after_key)
    throw Error(code::kInternal, "json writer: unbalanced end of an object or array");
  open_.pop_back();
  out_ += c;
}

JsonWriter& JsonWriter::end_object() {
  close(true, '}');
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  close(false, ']');
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view s) {
  before_value();
  out_ += json_string(s);
  return *this;
}

JsonWriter& JsonWriter::value(uint64_t n) {
  before_value();
  out_ += std::to_string(n);
  return *this;
}

JsonWriter& JsonWriter::value(bool b) {
  before_value();
  out_ += b ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::string_array(const std::vector<std::string>& items) {
  begin_array();
  for (const auto& s : items) value(s);
  return end_array();
}

}  // namespace torpor
