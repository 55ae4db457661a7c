#include "server/server_config.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>

#include "common/curve_keys.h"
#include "common/logging.h"
#include "sched/policy.h"

namespace salus::server {
namespace {

// The "security.curve" section: key files, allowed and administrator keys, open mode.
Status ReadSecurity(const Config& config, SecurityOptions* out) {
  const nlohmann::json& root = config.json();
  if (root.contains("security")) {
    const nlohmann::json& security = root["security"];
    if (!security.is_object())
      return InvalidArgumentError("config key 'security' must be an object");
    SALUS_RETURN_IF_ERROR(CheckKnownKeys(security, "'security'", {"curve"}));
    if (security.contains("curve")) {
      if (!security["curve"].is_object()) {
        return InvalidArgumentError("config key 'security.curve' must be an object");
      }
      SALUS_RETURN_IF_ERROR(CheckKnownKeys(security["curve"], "'security.curve'",
                                           {"secret_key_file", "client_keys", "client_keys_file",
                                            "admin_keys", "admin_keys_file", "open"}));
    }
  }
  auto keys = [&](const char* list_key, const char* file_key,
                  std::vector<std::string>* into) -> Status {
    if (config.Has(list_key)) {
      SALUS_ASSIGN_OR_RETURN(std::vector<std::string> listed, config.GetStrings(list_key));
      for (const std::string& k : listed) {
        SALUS_ASSIGN_OR_RETURN(std::string key, ResolveKey(k));
        into->push_back(std::move(key));
      }
    }
    if (config.Has(file_key)) {
      SALUS_ASSIGN_OR_RETURN(std::string path, config.GetString(file_key));
      SALUS_ASSIGN_OR_RETURN(std::vector<std::string> listed, ReadKeyList(path));
      into->insert(into->end(), listed.begin(), listed.end());
    }
    return OkStatus();
  };
  if (config.Has("security.curve.secret_key_file")) {
    SALUS_ASSIGN_OR_RETURN(std::string path, config.GetString("security.curve.secret_key_file"));
    SALUS_ASSIGN_OR_RETURN(out->curve_secret_key, ReadKeyFile(path));
    struct stat st {};
    if (stat(path.c_str(), &st) == 0 && (st.st_mode & 0077) != 0) {
      logging::Get("server")->warn(
          "the secret key file '{}' can be read by other users (mode {:o}): chmod 600 it", path,
          st.st_mode & 0777);
    }
  }
  SALUS_RETURN_IF_ERROR(
      keys("security.curve.client_keys", "security.curve.client_keys_file", &out->client_keys));
  SALUS_RETURN_IF_ERROR(
      keys("security.curve.admin_keys", "security.curve.admin_keys_file", &out->admin_keys));
  SALUS_ASSIGN_OR_RETURN(out->open, config.GetBool("security.curve.open", false));
  return OkStatus();
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

const std::vector<std::string>& ConfigKeys() {
  static const std::vector<std::string> keys = {"listen",
                                                "listen_remote",
                                                "device",
                                                "memory",
                                                "policy",
                                                "policy_options",
                                                "metrics_listen",
                                                "log_level",
                                                "lease_seconds",
                                                "overcommit",
                                                "paging_quantum_ms",
                                                "metrics_per_session",
                                                "limits",
                                                "quotas",
                                                "security",
                                                "max_folded_bytes",
                                                "state_dir",
                                                "snapshot_timeout_seconds",
                                                "snapshot_every_iterations"};
  return keys;
}

nlohmann::json PolicyOptionsFor(const std::string& policy, const nlohmann::json& policy_options) {
  if (!policy_options.is_object() || policy_options.empty()) return policy_options;
  const std::vector<std::string> names = sched::PolicyNames();
  for (const auto& [key, value] : policy_options.items()) {
    if (std::find(names.begin(), names.end(), key) == names.end()) return policy_options;
  }
  const std::string chosen = Lower(policy);
  return policy_options.contains(chosen) ? policy_options[chosen] : nlohmann::json();
}

StatusOr<ServerOptions> OptionsFromConfig(const Config& config, std::string* log_level) {
  SALUS_RETURN_IF_ERROR(
      CheckKnownKeys(config.json(), fmt::format("config '{}'", config.origin()), ConfigKeys()));
  const nlohmann::json& root = config.json();
  ServerOptions o;
  SALUS_ASSIGN_OR_RETURN(o.device, config.GetString("device", o.device));
  SALUS_ASSIGN_OR_RETURN(o.policy, config.GetString("policy", o.policy));
  SALUS_ASSIGN_OR_RETURN(o.metrics_listen, config.GetString("metrics_listen", o.metrics_listen));
  SALUS_ASSIGN_OR_RETURN(*log_level, config.GetString("log_level", "info"));
  SALUS_ASSIGN_OR_RETURN(o.metrics_per_session, config.GetBool("metrics_per_session", false));
  SALUS_ASSIGN_OR_RETURN(o.memory, config.GetBytes("memory", 0));
  if (config.Has("listen")) {
    SALUS_ASSIGN_OR_RETURN(o.listen, config.GetStrings("listen"));
  }
  if (config.Has("listen_remote")) {
    SALUS_ASSIGN_OR_RETURN(o.security.listen_remote, config.GetStrings("listen_remote"));
  }
  SALUS_RETURN_IF_ERROR(ReadSecurity(config, &o.security));
  SALUS_ASSIGN_OR_RETURN(o.quotas,
                         Quotas::FromJson(root.contains("quotas") ? root["quotas"] : nullptr));
  SALUS_ASSIGN_OR_RETURN(double lease, config.GetDouble("lease_seconds", 30.0));
  if (!(lease > 0)) return InvalidArgumentError("config key 'lease_seconds' must be positive");
  o.lease = FromSeconds(lease);
  SALUS_ASSIGN_OR_RETURN(o.overcommit, config.GetDouble("overcommit", 1.0));
  if (!(o.overcommit >= 1.0)) {
    return InvalidArgumentError("config key 'overcommit' must be a ratio of at least 1");
  }
  SALUS_ASSIGN_OR_RETURN(double quantum, config.GetDouble("paging_quantum_ms", 1000.0));
  if (!(quantum >= 0) || quantum > 3.6e6) {
    return InvalidArgumentError("config key 'paging_quantum_ms' must be in [0, 3600000]");
  }
  o.paging_quantum = FromSeconds(quantum / 1000.0);
  const nlohmann::json raw_options =
      root.contains("policy_options") ? root["policy_options"] : nlohmann::json();
  if (!raw_options.is_null() && !raw_options.is_object()) {
    return InvalidArgumentError(fmt::format(
        "config key 'policy_options' must be a JSON object, got {}", raw_options.dump()));
  }
  o.policy_options = PolicyOptionsFor(o.policy, raw_options);
  // The policy itself checks its name and options (the engine creates it again at start).
  SALUS_RETURN_IF_ERROR(sched::CreatePolicy(o.policy, o.policy_options).status());
  SALUS_ASSIGN_OR_RETURN(o.limits,
                         Limits::FromJson(root.contains("limits") ? root["limits"] : nullptr));
  // max_folded_bytes: the older name of limits.max_constant_bytes.
  if (config.Has("max_folded_bytes")) {
    SALUS_ASSIGN_OR_RETURN(o.limits.max_constant_bytes, config.GetBytes("max_folded_bytes"));
  }
  SALUS_ASSIGN_OR_RETURN(o.state_dir, config.GetString("state_dir", ""));
  SALUS_ASSIGN_OR_RETURN(double snapshot_timeout,
                         config.GetDouble("snapshot_timeout_seconds", 300));
  if (!(snapshot_timeout > 0) || snapshot_timeout > 86400) {
    return InvalidArgumentError("config key 'snapshot_timeout_seconds' must be in (0, 86400]");
  }
  o.snapshot_timeout = FromSeconds(snapshot_timeout);
  SALUS_ASSIGN_OR_RETURN(const int64_t every, config.GetInt("snapshot_every_iterations", 0));
  if (every < 0) {
    return InvalidArgumentError("config key 'snapshot_every_iterations' must be >= 0");
  }
  if (every > 0 && o.state_dir.empty()) {
    return InvalidArgumentError(
        "config key 'snapshot_every_iterations' needs a state directory ('state_dir' or "
        "--state-dir) to write to");
  }
  o.snapshot_every_iterations = static_cast<uint64_t>(every);
  auto devices = DeviceNames(o.device);
  if (!devices.ok()) return devices.status().WithContext("config key 'device'");
  return o;
}

}  // namespace salus::server
