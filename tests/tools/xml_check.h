// Test helper: a small XML well-formedness check for the SVG the tool writes.
#pragma once

#include <cstring>
#include <regex>
#include <string>
#include <vector>

namespace thdcp::tools {

// A small XML well-formedness check: tags nest and close, attributes are quoted, text holds
// no raw '<' and only known entities after '&'. Returns "" when fine, else what is wrong.
inline std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  size_t i = 0;
  auto check_text = [](const std::string& text) -> std::string {
    for (size_t k = 0; k < text.size(); ++k) {
      if (text[k] != '&') continue;
      static const char* entities[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
      bool ok = false;
      for (const char* e : entities) ok = ok || text.compare(k, std::strlen(e), e) == 0;
      if (!ok) return "bad entity near '" + text.substr(k, 10) + "'";
    }
    return "";
  };
  while (i < xml.size()) {
    const size_t lt = xml.find('<', i);
    const std::string text = xml.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    if (const std::string p = check_text(text); !p.empty()) return p;
    if (lt == std::string::npos) break;
    const size_t gt = xml.find('>', lt);
    if (gt == std::string::npos) return "unterminated tag";
    std::string tag = xml.substr(lt + 1, gt - lt - 1);
    i = gt + 1;
    if (tag.rfind("?xml", 0) == 0) {
      if (lt != 0) return "XML declaration not at the start";
      continue;
    }
    if (tag.find('<') != std::string::npos) return "'<' inside a tag";
    if (tag.size() > 0 && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return "</" + name + "> closes " + (open.empty() ? "nothing" : open.back());
      open.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing) tag.pop_back();
    const std::string name = tag.substr(0, tag.find_first_of(" \n"));
    // Attributes: name="value" pairs with balanced quotes.
    static const std::regex attribute(R"re(\s+[a-zA-Z_:][-a-zA-Z0-9_:.]*="[^"<]*")re");
    const std::string rest = std::regex_replace(tag.substr(name.size()), attribute, "");
    if (rest.find_first_not_of(" \n") != std::string::npos) return "bad attributes in <" + tag + ">";
    if (const std::string p = check_text(tag); !p.empty()) return p;
    if (open.empty() && name != "svg") return "element <" + name + "> outside <svg>";
    if (!self_closing) open.push_back(name);
  }
  return open.empty() ? "" : "<" + open.back() + "> is never closed";
}

}  // namespace thdcp::tools
