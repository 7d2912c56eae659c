#include "io/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "io/atomic_file.h"
#include "thdcp/core/error.h"

namespace thdcp::tools {

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one
// (overlong forms, surrogates and code points above U+10FFFF are invalid).
size_t utf8_sequence_length(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3f);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
    return 0;
  }
  return n;
}

bool is_scalar(const Json& v) { return v.kind() != Json::Kind::kArray && v.kind() != Json::Kind::kObject; }

}  // namespace

Json Json::array() {
  Json j;
  j.kind_ = Kind::kArray;
  return j;
}

Json Json::object() {
  Json j;
  j.kind_ = Kind::kObject;
  return j;
}

Json& Json::set(const std::string& key, Json value) {
  THDCP_CHECK(kind_ == Kind::kObject, "Json::set(\"" << key << "\") on a value that is not an object");
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key) {
      values_[i] = std::move(value);
      return *this;
    }
  }
  keys_.push_back(key);
  values_.push_back(std::move(value));
  return *this;
}

Json& Json::push(Json value) {
  THDCP_CHECK(kind_ == Kind::kArray, "Json::push on a value that is not an array");
  values_.push_back(std::move(value));
  return *this;
}

std::string json_quote(const std::string& value) {
  std::string out = "\"";
  for (size_t i = 0; i < value.size();) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    const size_t n = utf8_sequence_length(value, i);
    if (n == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD REPLACEMENT CHARACTER
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(value, i, n);
      i += n;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  return out + "\"";
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[40];
  // The shortest of %.1g .. %.17g that reads back exactly: short for round numbers, exact always.
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  std::string s = text;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";  // stays a float when read back
  return s;
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

void Json::dump_to(std::string& out, int indent, int depth) const {
  switch (kind_) {
    case Kind::kNull: out += "null"; return;
    case Kind::kBool: out += flag_ ? "true" : "false"; return;
    case Kind::kInteger: out += text_; return;
    case Kind::kDouble: out += json_number(number_); return;
    case Kind::kString: out += json_quote(text_); return;
    case Kind::kArray:
    case Kind::kObject: break;
  }
  const bool object = kind_ == Kind::kObject;
  out.push_back(object ? '{' : '[');
  if (values_.empty()) {
    out.push_back(object ? '}' : ']');
    return;
  }
  bool one_line = indent <= 0;
  if (!object && !one_line) {
    one_line = true;
    for (const Json& v : values_) one_line = one_line && is_scalar(v);
  }
  const std::string pad = one_line ? "" : "\n" + std::string(static_cast<size_t>(indent) * (depth + 1), ' ');
  for (size_t i = 0; i < values_.size(); ++i) {
    if (i > 0) out += one_line && indent > 0 ? ", " : ",";
    out += pad;
    if (object) {
      out += json_quote(keys_[i]);
      out += indent > 0 ? ": " : ":";
    }
    values_[i].dump_to(out, indent, depth + 1);
  }
  if (!one_line) out += "\n" + std::string(static_cast<size_t>(indent) * depth, ' ');
  out.push_back(object ? '}' : ']');
}

void write_json_file(const std::string& path, const Json& value, int indent) {
  write_text_file(path, value.dump(indent) + "\n");
}

}  // namespace thdcp::tools
