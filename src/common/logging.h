// One spdlog logger per module ("mem", "sched", "server", ...), all writing to one shared
// sink (stderr by default), and the machine-readable event lines tools parse:
//
//   event: <name> {json}
//
// An event is a single line; its JSON never contains a newline.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "salus/status.h"

namespace salus::logging {

// The module's logger, created on first use. Thread-safe.
std::shared_ptr<spdlog::logger> Get(std::string_view module);

// "trace", "debug", "info", "warn", "error", "critical" or "off"; applies to every logger,
// present and future. InvalidArgument names a bad level.
Status SetLevel(std::string_view level);

// Adds a sink every module logger writes to (tests capture output this way).
void AddSink(spdlog::sink_ptr sink);
void RemoveSink(const spdlog::sink_ptr& sink);

// Longest string an event shows; a longer one is cut there, with the count of bytes cut.
inline constexpr size_t kMaxEventStringBytes = 256;

// "event: <name> {json}" with the JSON on one line, every string at most kMaxEventStringBytes.
std::string FormatEvent(std::string_view name, const nlohmann::json& fields);

// Logs FormatEvent(name, fields) at info level on the module's logger.
void Event(std::string_view module, std::string_view name, const nlohmann::json& fields);

// A lifecycle event (ready, signal, draining, stopped): what supervisors and tools wait for,
// so it is written at every log level but "off", on the logger "salus.lifecycle".
void Lifecycle(std::string_view name, const nlohmann::json& fields);

}  // namespace salus::logging
