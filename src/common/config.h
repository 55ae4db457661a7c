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
  // Where the config came from: its file, or "<defaults>".
  const std::string& origin() const { return origin_; }
  // The sub-object at key (empty object if absent), e.g. a policy's options.
  nlohmann::json Section(std::string_view key) const;

 private:
  const nlohmann::json* Find(std::string_view key) const;
  StatusOr<const nlohmann::json*> Require(std::string_view key) const;

  nlohmann::json root_;
  std::string origin_ = "<defaults>";
};

// Note [Config mistakes]
// A misspelt key would otherwise be ignored and its default used without a word, so every
// section of the daemon's config refuses keys it does not know, naming the key, where it was,
// and the nearest known key when one is close enough to be the one meant.

// The candidate nearest `name` by edit distance (case, '-' and '_' ignored), or "" when none is
// within a third of the longer name's length (at least 2 edits).
std::string NearestName(std::string_view name, const std::vector<std::string>& candidates);

// ": did you mean 'X'?" for NearestName's X, or "" when there is none.
std::string DidYouMean(std::string_view name, const std::vector<std::string>& candidates);

// INVALID_ARGUMENT for the first key of `object` (a JSON object) not among `known`:
// "unknown key 'metrics-listen' in <where>: did you mean 'metrics_listen'? (known: ...)".
Status CheckKnownKeys(const nlohmann::json& object, std::string_view where,
                      const std::vector<std::string>& known);

}  // namespace salus
