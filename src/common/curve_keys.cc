#include "common/curve_keys.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace salus {
namespace {

// ZeroMQ's Z85 alphabet (RFC 32).
constexpr std::string_view kZ85 =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

std::string Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// The file's lines with comments and blank lines dropped, each trimmed.
StatusOr<std::vector<std::string>> KeyLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(fmt::format("cannot read key file '{}'", path));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    std::string t = Trim(line);
    if (t.empty() || t[0] == '#') continue;
    if (!IsZ85Key(t)) {
      return InvalidArgumentError(
          fmt::format("key file '{}': '{}' is not a {}-character Z85 CURVE key", path,
                      t.size() > 60 ? t.substr(0, 60) + "..." : t, kCurveKeyZ85Chars));
    }
    lines.push_back(std::move(t));
  }
  return lines;
}

}  // namespace

bool IsZ85Key(std::string_view text) {
  if (text.size() != kCurveKeyZ85Chars) return false;
  for (char c : text) {
    if (kZ85.find(c) == std::string_view::npos) return false;
  }
  return true;
}

StatusOr<std::string> ReadKeyFile(const std::string& path) {
  SALUS_ASSIGN_OR_RETURN(std::vector<std::string> keys, KeyLines(path));
  if (keys.size() != 1) {
    return InvalidArgumentError(
        fmt::format("key file '{}' holds {} keys; expected exactly one", path, keys.size()));
  }
  return keys[0];
}

StatusOr<std::string> ResolveKey(const std::string& key_or_path) {
  if (IsZ85Key(key_or_path)) return key_or_path;
  return ReadKeyFile(key_or_path);
}

StatusOr<std::vector<std::string>> ReadKeyList(const std::string& path) { return KeyLines(path); }

}  // namespace salus
