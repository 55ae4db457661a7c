#include "common/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "common/units.h"

namespace salus {
namespace {

std::vector<std::string_view> SplitKey(std::string_view key) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

Status WrongType(std::string_view key, std::string_view want, const nlohmann::json& got) {
  return InvalidArgumentError(
      fmt::format("config key '{}': expected {}, got {} {}", key, want, got.type_name(),
                  got.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
}

}  // namespace

StatusOr<Config> Config::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(fmt::format("config file '{}' cannot be opened", path));
  std::stringstream buf;
  buf << in.rdbuf();
  return FromJsonText(buf.str(), path);
}

StatusOr<Config> Config::FromJsonText(std::string_view text, std::string_view origin) {
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false,
                                                /*ignore_comments=*/true);
  if (parsed.is_discarded()) {
    return InvalidArgumentError(fmt::format("config '{}' is not valid JSON", origin));
  }
  if (!parsed.is_object()) {
    return InvalidArgumentError(
        fmt::format("config '{}' must be a JSON object, got {}", origin, parsed.type_name()));
  }
  Config c;
  c.root_ = std::move(parsed);
  c.origin_ = std::string(origin);
  return c;
}

Status Config::ApplyOverride(std::string_view assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return InvalidArgumentError(
        fmt::format("config override '{}' must have the form key=value", assignment));
  }
  const std::string_view key = assignment.substr(0, eq);
  const std::string_view text = assignment.substr(eq + 1);
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (value.is_discarded()) value = std::string(text);

  nlohmann::json* node = &root_;
  const auto parts = SplitKey(key);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) {
      return InvalidArgumentError(fmt::format("config override '{}': empty key part", assignment));
    }
    if (node->is_null()) *node = nlohmann::json::object();
    if (!node->is_object()) {
      return InvalidArgumentError(
          fmt::format("config override '{}': '{}' is not an object", assignment, parts[i - 1]));
    }
    node = &(*node)[std::string(parts[i])];
  }
  *node = std::move(value);
  return OkStatus();
}

Status Config::ApplyOverrides(const std::vector<std::string>& assignments) {
  for (const auto& a : assignments) SALUS_RETURN_IF_ERROR(ApplyOverride(a));
  return OkStatus();
}

const nlohmann::json* Config::Find(std::string_view key) const {
  const nlohmann::json* node = &root_;
  for (auto part : SplitKey(key)) {
    if (!node->is_object()) return nullptr;
    auto it = node->find(std::string(part));
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

StatusOr<const nlohmann::json*> Config::Require(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) {
    return NotFoundError(fmt::format("config key '{}' is not set in '{}'", key, origin_));
  }
  return v;
}

bool Config::Has(std::string_view key) const { return Find(key) != nullptr; }

nlohmann::json Config::Section(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  return v != nullptr && v->is_object() ? *v : nlohmann::json::object();
}

StatusOr<std::string> Config::GetString(std::string_view key) const {
  SALUS_ASSIGN_OR_RETURN(const nlohmann::json* v, Require(key));
  if (!v->is_string()) return WrongType(key, "a string", *v);
  return v->get<std::string>();
}

StatusOr<int64_t> Config::GetInt(std::string_view key) const {
  SALUS_ASSIGN_OR_RETURN(const nlohmann::json* v, Require(key));
  if (!v->is_number_integer()) return WrongType(key, "an integer", *v);
  return v->get<int64_t>();
}

StatusOr<double> Config::GetDouble(std::string_view key) const {
  SALUS_ASSIGN_OR_RETURN(const nlohmann::json* v, Require(key));
  if (!v->is_number()) return WrongType(key, "a number", *v);
  return v->get<double>();
}

StatusOr<bool> Config::GetBool(std::string_view key) const {
  SALUS_ASSIGN_OR_RETURN(const nlohmann::json* v, Require(key));
  if (!v->is_boolean()) return WrongType(key, "true or false", *v);
  return v->get<bool>();
}

StatusOr<uint64_t> Config::GetBytes(std::string_view key) const {
  SALUS_ASSIGN_OR_RETURN(const nlohmann::json* v, Require(key));
  if (v->is_number_unsigned()) return v->get<uint64_t>();
  if (v->is_string()) {
    auto bytes = ParseBytes(v->get<std::string>());
    if (!bytes.ok()) return bytes.status().WithContext(fmt::format("config key '{}'", key));
    return bytes;
  }
  return WrongType(key, "a byte size such as \"16GiB\" or a non-negative integer", *v);
}

StatusOr<std::vector<std::string>> Config::GetStrings(std::string_view key) const {
  SALUS_ASSIGN_OR_RETURN(const nlohmann::json* v, Require(key));
  if (v->is_string()) return std::vector<std::string>{v->get<std::string>()};
  if (!v->is_array()) return WrongType(key, "a list of strings", *v);
  std::vector<std::string> out;
  for (const auto& item : *v) {
    if (!item.is_string()) return WrongType(key, "a list of strings", *v);
    out.push_back(item.get<std::string>());
  }
  return out;
}

#define SALUS_CONFIG_GET_OR(Type, Getter)                                    \
  StatusOr<Type> Config::Getter(std::string_view key, Type fallback) const { \
    if (!Has(key)) return fallback;                                          \
    return Getter(key);                                                      \
  }
SALUS_CONFIG_GET_OR(std::string, GetString)
SALUS_CONFIG_GET_OR(int64_t, GetInt)
SALUS_CONFIG_GET_OR(double, GetDouble)
SALUS_CONFIG_GET_OR(bool, GetBool)
SALUS_CONFIG_GET_OR(uint64_t, GetBytes)
#undef SALUS_CONFIG_GET_OR

namespace {

std::string Folded(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c == '-' || c == '_') continue;
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string NearestName(std::string_view name, const std::vector<std::string>& candidates) {
  const std::string folded = Folded(name);
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(folded, Folded(c));
    const size_t allowed = std::max<size_t>(2, std::max(name.size(), c.size()) / 3);
    if (d <= allowed && d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

std::string DidYouMean(std::string_view name, const std::vector<std::string>& candidates) {
  const std::string nearest = NearestName(name, candidates);
  return nearest.empty() ? "" : fmt::format(": did you mean '{}'?", nearest);
}

Status CheckKnownKeys(const nlohmann::json& object, std::string_view where,
                      const std::vector<std::string>& known) {
  if (!object.is_object()) return OkStatus();
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    return InvalidArgumentError(fmt::format("unknown key '{}' in {}{} (known: {})", key, where,
                                            DidYouMean(key, known), fmt::join(known, ", ")));
  }
  return OkStatus();
}

}  // namespace salus
