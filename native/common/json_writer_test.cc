// The JSON writer: commas, nesting, escaping, and misuse as Error(INTERNAL).
#include "common/json_writer.h"

#include <string>

#include "common/error.h"
#include "test/check.h"

using namespace torpor;

TEST("json writer: objects, arrays, numbers, booleans and strings nest with commas in place") {
  JsonWriter w;
  w.begin_object().key("generation").value(uint64_t{3}).key("full").value(true);
  w.key("memory").begin_object().key("kind").value("diff").key("pages").value(uint64_t{18446744073709551615ull}).end_object();
  w.key("layers").string_array({"gen-1/mem.layer", "gen-3/mem.layer"});
  w.key("disks").begin_array().string_array({}).string_array({"a"}).end_array();
  w.key("empty").begin_object().end_object();
  w.end_object();
  CHECK(w.complete());
  CHECK_STR_EQ(w.str(),
               "{\"generation\":3,\"full\":true,\"memory\":{\"kind\":\"diff\",\"pages\":18446744073709551615},"
               "\"layers\":[\"gen-1/mem.layer\",\"gen-3/mem.layer\"],\"disks\":[[],[\"a\"]],\"empty\":{}}");
}

TEST("json writer: quotes, backslashes and control characters are escaped; other bytes pass") {
  CHECK_STR_EQ(json_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
  CHECK_STR_EQ(json_string(std::string("\n\t\x01\x1f", 4)), "\"\\u000a\\u0009\\u0001\\u001f\"");
  CHECK_STR_EQ(json_string(std::string("\0", 1)), "\"\\u0000\"");
  CHECK_STR_EQ(json_string("/t/caf\xc3\xa9 \x7f"), "\"/t/caf\xc3\xa9 \x7f\"");
  JsonWriter w;
  w.begin_object().key("k\"").value("v\n").end_object();
  CHECK_STR_EQ(w.str(), "{\"k\\\"\":\"v\\u000a\"}");
}

TEST("json writer: misuse is Error(INTERNAL), not an abort") {
  {
    JsonWriter w;
    CHECK_THROWS_CODE(w.key("x"), "INTERNAL");
  }
  {
    JsonWriter w;
    w.begin_object();
    CHECK_THROWS_CODE(w.value("no key"), "INTERNAL");
    CHECK_THROWS_CODE(w.end_array(), "INTERNAL");
  }
  {
    JsonWriter w;
    w.begin_object().key("a");
    CHECK_THROWS_CODE(w.key("b"), "INTERNAL");
    CHECK_THROWS_CODE(w.end_object(), "INTERNAL");
  }
  {
    JsonWriter w;
    w.value(uint64_t{1});
    CHECK(w.complete());
    CHECK_THROWS_CODE(w.value(uint64_t{2}), "INTERNAL");
    CHECK_THROWS_CODE(w.end_object(), "INTERNAL");
  }
}
