#include "common/logging.h"

#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <mutex>

namespace salus::logging {
namespace {

struct Registry {
  std::mutex mu;
  std::shared_ptr<spdlog::sinks::dist_sink_mt> sink;
  spdlog::level::level_enum level = spdlog::level::info;

  Registry() : sink(std::make_shared<spdlog::sinks::dist_sink_mt>()) {
    sink->add_sink(std::make_shared<spdlog::sinks::stderr_sink_mt>());
  }
};

Registry& GetRegistry() {
  static Registry* registry = new Registry();  // never destroyed: loggers outlive statics
  return *registry;
}

constexpr std::string_view kPattern = "[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v";
constexpr std::string_view kLifecycle = "lifecycle";

// The lifecycle logger stays at info whatever the level, unless logging is off.
spdlog::level::level_enum LevelFor(std::string_view name, spdlog::level::level_enum level) {
  if (name == "salus." + std::string(kLifecycle) && level != spdlog::level::off) {
    return std::min(level, spdlog::level::info);
  }
  return level;
}

}  // namespace

std::shared_ptr<spdlog::logger> Get(std::string_view module) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  const std::string name = "salus." + std::string(module);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = std::make_shared<spdlog::logger>(name, r.sink);
  logger->set_pattern(std::string(kPattern));
  logger->set_level(LevelFor(name, r.level));
  logger->flush_on(spdlog::level::info);
  spdlog::register_logger(logger);
  return logger;
}

Status SetLevel(std::string_view level) {
  static constexpr std::string_view kLevels[] = {"trace", "debug",    "info", "warn",
                                                 "error", "critical", "off"};
  bool known = false;
  for (auto l : kLevels) known |= (l == level);
  if (!known) {
    return InvalidArgumentError("unknown log level '" + std::string(level) +
                                "' (expected trace, debug, info, warn, error, critical or off)");
  }
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.level = spdlog::level::from_str(std::string(level));
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) {
    if (l->name().rfind("salus.", 0) == 0) l->set_level(LevelFor(l->name(), r.level));
  });
  return OkStatus();
}

void AddSink(spdlog::sink_ptr sink) { GetRegistry().sink->add_sink(std::move(sink)); }
void RemoveSink(const spdlog::sink_ptr& sink) { GetRegistry().sink->remove_sink(sink); }

std::string FormatEvent(std::string_view name, const nlohmann::json& fields) {
  // dump() without indentation never emits a newline; strings are escaped.
  return "event: " + std::string(name) + " " +
         fields.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void Event(std::string_view module, std::string_view name, const nlohmann::json& fields) {
  Get(module)->info("{}", FormatEvent(name, fields));
}

void Lifecycle(std::string_view name, const nlohmann::json& fields) {
  Event(kLifecycle, name, fields);
}

}  // namespace salus::logging
