#include "common/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

namespace salus {
namespace {

struct Unit {
  std::string_view name;  // lower case
  uint64_t factor;
};

constexpr std::array<Unit, 14> kUnits = {{
    {"b", 1},
    {"k", kKiB},
    {"kib", kKiB},
    {"kb", 1000ULL},
    {"m", kMiB},
    {"mib", kMiB},
    {"mb", 1000ULL * 1000},
    {"g", kGiB},
    {"gib", kGiB},
    {"gb", 1000ULL * 1000 * 1000},
    {"t", kTiB},
    {"tib", kTiB},
    {"tb", 1000ULL * 1000 * 1000 * 1000},
    {"", 1},
}};

Status BadSize(std::string_view text, std::string_view why) {
  return InvalidArgumentError(fmt::format("invalid byte size '{}': {}", text, why));
}

}  // namespace

StatusOr<uint64_t> ParseBytes(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) return BadSize(text, "empty");
  if (s.front() == '-') return BadSize(text, "negative");
  if (s.front() == '+') s.remove_prefix(1);

  size_t n = 0;
  while (n < s.size() && (std::isdigit(static_cast<unsigned char>(s[n])) || s[n] == '.')) ++n;
  const std::string_view number = s.substr(0, n);
  std::string_view unit = s.substr(n);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) {
    unit.remove_prefix(1);
  }
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1 || number == ".") {
    return BadSize(text, "expected a number followed by an optional unit");
  }

  std::string lower(unit);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const auto it =
      std::find_if(kUnits.begin(), kUnits.end(), [&](const Unit& u) { return u.name == lower; });
  if (it == kUnits.end()) {
    return BadSize(text, fmt::format("unknown unit '{}' (expected B, KB, MB, GB, TB, KiB, MiB, "
                                     "GiB, TiB, K, M, G or T)",
                                     unit));
  }

  if (number.find('.') == std::string_view::npos) {
    uint64_t value = 0;
    const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (ec != std::errc() || ptr != number.data() + number.size()) {
      return BadSize(text, "number out of range");
    }
    if (value > std::numeric_limits<uint64_t>::max() / it->factor) {
      return BadSize(text, "larger than 2^64 bytes");
    }
    return value * it->factor;
  }

  double value = 0;
  const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || ptr != number.data() + number.size()) {
    return BadSize(text, "malformed number");
  }
  const long double bytes = static_cast<long double>(value) * it->factor;
  if (bytes >= 18446744073709551615.0L) return BadSize(text, "larger than 2^64 bytes");
  return static_cast<uint64_t>(std::floor(bytes));
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr std::array<std::pair<std::string_view, uint64_t>, 4> kBinary = {
      {{"TiB", kTiB}, {"GiB", kGiB}, {"MiB", kMiB}, {"KiB", kKiB}}};
  for (const auto& [name, factor] : kBinary) {
    if (bytes >= factor) {
      std::string num = fmt::format("{:.2f}", static_cast<double>(bytes) / factor);
      while (num.back() == '0') num.pop_back();
      if (num.back() == '.') num.pop_back();
      return num + std::string(name);
    }
  }
  return fmt::format("{}B", bytes);
}

}  // namespace salus
