// The daemon's configuration file (and the flags that override it) read into ServerOptions,
// every key checked (Note [Config mistakes] in common/config.h). salus-server and
// `salus-server --check-config` both read a config through here.
#pragma once

#include <string>

#include "common/config.h"
#include "salus/status.h"
#include "server/server.h"

namespace salus::server {

// The top-level keys a config may have, in the order docs/configuration.md lists them.
const std::vector<std::string>& ConfigKeys();

// ServerOptions from `config`, all but model_factory, with the log level in `log_level`.
// Every key is checked: an unknown key anywhere (top level, security, security.curve, limits,
// quotas, the policy's options) is INVALID_ARGUMENT naming it and the nearest known key; the
// policy is created once with its options to check them; the device names are parsed. Reads
// the key files security.curve names. Starts nothing.
StatusOr<ServerOptions> OptionsFromConfig(const Config& config, std::string* log_level);

// The options of `policy` from a config's "policy_options": either the options themselves, or
// an object keyed by policy name ({"fair": {...}, "srtf": {...}}), of which the chosen
// policy's (or none) apply, so that one config carries each policy's options and switching
// "policy" keeps it valid.
nlohmann::json PolicyOptionsFor(const std::string& policy, const nlohmann::json& policy_options);

}  // namespace salus::server
