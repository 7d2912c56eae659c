// JSON builder: exact text for small documents, escaping, numbers that read back exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "json.h"
#include "thdcp/core/error.h"

namespace thdcp::tools {
namespace {

TEST(Json, CompactAndPrettyText) {
  Json doc = Json::object();
  doc.set("name", "plan").set("cp", 4).set("ok", true).set("none", nullptr);
  doc.set("ranks", Json::array_of(std::vector<int64_t>{1, 2, 3}));
  doc.set("nested", Json::array().push(Json::object().set("a", 0.5)).push(Json::array()));
  doc.set("empty", Json::object());
  EXPECT_EQ(doc.dump(0),
            R"({"name":"plan","cp":4,"ok":true,"none":null,"ranks":[1,2,3],"nested":[{"a":0.5},[]],"empty":{}})");
  EXPECT_EQ(doc.dump(2),
            "{\n"
            "  \"name\": \"plan\",\n"
            "  \"cp\": 4,\n"
            "  \"ok\": true,\n"
            "  \"none\": null,\n"
            "  \"ranks\": [1, 2, 3],\n"
            "  \"nested\": [\n"
            "    {\n"
            "      \"a\": 0.5\n"
            "    },\n"
            "    []\n"
            "  ],\n"
            "  \"empty\": {}\n"
            "}");
}

TEST(Json, SetReplacesAndKeepsOrder) {
  Json doc = Json::object();
  doc.set("a", 1).set("b", 2).set("a", 3);
  EXPECT_EQ(doc.dump(0), R"({"a":3,"b":2})");
}

TEST(Json, MisuseThrows) {
  Json array = Json::array();
  EXPECT_THROW(array.set("k", 1), Error);
  Json object = Json::object();
  EXPECT_THROW(object.push(1), Error);
  Json number = 5;
  EXPECT_THROW(number.push(1), Error);
}

TEST(Json, EscapesStrings) {
  EXPECT_EQ(json_quote("plain"), "\"plain\"");
  EXPECT_EQ(json_quote("a\"b\\c/d"), "\"a\\\"b\\\\c/d\"");
  EXPECT_EQ(json_quote("\n\r\t\b\f"), "\"\\n\\r\\t\\b\\f\"");
  EXPECT_EQ(json_quote(std::string("\x01\x1f", 2)), "\"\\u0001\\u001f\"");
  EXPECT_EQ(json_quote(std::string("nul\0x", 5)), "\"nul\\u0000x\"");
  // Valid UTF-8 passes through; invalid bytes become U+FFFD.
  EXPECT_EQ(json_quote("caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x99\x82"), "\"caf\xc3\xa9 \xe2\x86\x92 \xf0\x9f\x99\x82\"");
  EXPECT_EQ(json_quote("a\xff" "b"), "\"a\xef\xbf\xbd" "b\"");
  EXPECT_EQ(json_quote("\xc3"), "\"\xef\xbf\xbd\"");              // truncated sequence
  EXPECT_EQ(json_quote("\xc0\xaf"), "\"\xef\xbf\xbd\xef\xbf\xbd\"");  // overlong '/'
  EXPECT_EQ(json_quote("\xed\xa0\x80"), "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");  // surrogate
}

TEST(Json, IntegersAreExact) {
  EXPECT_EQ(Json(std::numeric_limits<int64_t>::min()).dump(), "-9223372036854775808");
  EXPECT_EQ(Json(std::numeric_limits<uint64_t>::max()).dump(), "18446744073709551615");
  EXPECT_EQ(Json(static_cast<size_t>(42)).dump(), "42");
  EXPECT_EQ(Json(-7).dump(), "-7");
}

TEST(Json, DoublesAreShortAndReadBackExactly) {
  EXPECT_EQ(json_number(0.1), "0.1");
  EXPECT_EQ(json_number(1.0), "1.0");
  EXPECT_EQ(json_number(-2.5), "-2.5");
  EXPECT_EQ(json_number(1e300), "1e+300");
  EXPECT_EQ(json_number(1.0 / 3.0), "0.3333333333333333");  // 16 digits, as Python repr
  EXPECT_EQ(json_number(INFINITY), "null");
  EXPECT_EQ(json_number(-INFINITY), "null");
  EXPECT_EQ(json_number(NAN), "null");
  EXPECT_EQ(Json(0.25f).dump(), "0.25");
  std::mt19937_64 rng(11);
  for (int i = 0; i < 2000; ++i) {
    uint64_t bits = rng();
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    if (!std::isfinite(v)) continue;
    const std::string text = json_number(v);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
    EXPECT_NE(text.find_first_of(".e"), std::string::npos) << text;
  }
}

TEST(Json, WritesFiles) {
  const std::string path = ::testing::TempDir() + "/thdcp_json_test.json";
  Json doc = Json::object();
  doc.set("x", 1.5);
  write_json_file(path, doc);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "{\n  \"x\": 1.5\n}\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace thdcp::tools
