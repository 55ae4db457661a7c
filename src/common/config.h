// Configuration: a JSON object from a file, with command-line overrides on top.
//
// Keys are dotted paths into nested objects ("memory.capacity"). An override is
// "key=value"; the value is read as JSON when it parses as JSON ("4", "true", "[1,2]"), and
// as a plain string otherwise ("16GiB", "fair"). Every error names the file or override and
// the key at fault.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "salus/status.h"

namespace salus {

class Config {
 public:
  Config() : root_(nlohmann::json::object()) {}

  static StatusOr<Config> FromFile(const std::string& path);
  static StatusOr<Config> FromJsonText(std::string_view text, std::string_view origin);

  Status ApplyOverride(std::string_view assignment);
  Status ApplyOverrides(const std::vector<std::string>& assignments);

  bool Has(std::string_view key) const;

  StatusOr<std::string> GetString(std::string_view key) const;
  StatusOr<int64_t> GetInt(std::string_view key) const;
  StatusOr<double> GetDouble(std::string_view key) const;
  StatusOr<bool> GetBool(std::string_view key) const;
  // An integer number of bytes or a size string ("16GiB").
  StatusOr<uint64_t> GetBytes(std::string_view key) const;
  // A list of strings, or a single string taken as a list of one.
  StatusOr<std::vector<std::string>> GetStrings(std::string_view key) const;

  // The value at key, or `fallback` when the key is absent. A present value of the wrong
  // type is still an error.
  StatusOr<std::string> GetString(std::string_view key, std::string fallback) const;
  StatusOr<int64_t> GetInt(std::string_view key, int64_t fallback) const;
  StatusOr<double> GetDouble(std::string_view key, double fallback) const;
  StatusOr<bool> GetBool(std::string_view key, bool fallback) const;
  StatusOr<uint64_t> GetBytes(std::string_view key, uint64_t fallback) const;

  const nlohmann::json& json() const { return root_; }
  // The sub-object at key (empty object if absent), e.g. a policy's options.
  nlohmann::json Section(std::string_view key) const;

 private:
  const nlohmann::json* Find(std::string_view key) const;
  StatusOr<const nlohmann::json*> Require(std::string_view key) const;

  nlohmann::json root_;
  std::string origin_ = "<defaults>";
};

}  // namespace salus
