// A small JSON document builder for the `--json FILE` summaries of `thdcp run` and `thdcp plan`.
//
//   Json summary = Json::object();
//   summary.set("cp", 4).set("padding", 0.0123).set("ranks", Json::array().push(1).push(2));
//   write_json_file("out.json", summary);
//
// Choices:
// - Objects keep insertion order (summaries read top-down); set() on an existing key replaces
//   its value in place.
// - Doubles are written with the fewest significant digits (up to 17) that read back to the
//   same double, always with a '.' or an exponent so that they stay floats in Python.
// - Non-finite doubles (inf, -inf, nan) are written as null: JSON has no literal for them, and
//   null is what JavaScript's JSON.stringify writes and every parser accepts.
// - Strings are UTF-8; '"', '\\' and control characters are escaped; bytes that are not valid
//   UTF-8 (e.g. from a file name) are replaced by U+FFFD so the output is always valid JSON.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace thdcp::tools {

class Json {
 public:
  enum class Kind { kNull, kBool, kInteger, kDouble, kString, kArray, kObject };

  Json() = default;  // null
  Json(std::nullptr_t) {}
  Json(bool value) : kind_(Kind::kBool), flag_(value) {}
  Json(double value) : kind_(Kind::kDouble), number_(value) {}
  Json(float value) : Json(static_cast<double>(value)) {}
  Json(const char* value) : kind_(Kind::kString), text_(value) {}
  Json(std::string value) : kind_(Kind::kString), text_(std::move(value)) {}
  // Every integer type (int, int64_t, size_t, ...), written exactly.
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Json(T value) : kind_(Kind::kInteger), text_(std::to_string(value)) {}
  // An array of numbers or strings.
  template <typename T>
  static Json array_of(const std::vector<T>& values) {
    Json a = array();
    for (const T& v : values) a.push(Json(v));
    return a;
  }

  static Json array();
  static Json object();

  Kind kind() const { return kind_; }

  // Object: sets `key` to `value` (replacing an existing value). Throws thdcp::Error when this
  // is not an object. Returns *this for chaining.
  Json& set(const std::string& key, Json value);
  // Array: appends `value`. Throws thdcp::Error when this is not an array.
  Json& push(Json value);

  // The document as text. indent > 0: pretty-printed with that many spaces per level (arrays
  // of scalars stay on one line); indent 0: compact, on one line.
  std::string dump(int indent = 2) const;

 private:
  void dump_to(std::string& out, int indent, int depth) const;

  Kind kind_ = Kind::kNull;
  bool flag_ = false;
  double number_ = 0;
  std::string text_;               // kString: the text; kInteger: the digits
  std::vector<std::string> keys_;  // kObject
  std::vector<Json> values_;       // kObject (parallel to keys_) and kArray
};

// `value` as a JSON string literal, quotes included.
std::string json_quote(const std::string& value);

// `value` as a JSON number (or null when it is not finite).
std::string json_number(double value);

// Writes value.dump(indent) and a newline to `path` atomically (PATH.tmp, then rename).
void write_json_file(const std::string& path, const Json& value, int indent = 2);

}  // namespace thdcp::tools
