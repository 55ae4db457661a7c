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

namespace {

// Whether `j` holds a string longer than kMaxEventStringBytes anywhere.
bool HasLongString(const nlohmann::json& j) {
  if (j.is_string()) return j.get_ref<const std::string&>().size() > kMaxEventStringBytes;
  if (j.is_structured()) {
    for (const auto& item : j) {
      if (HasLongString(item)) return true;
    }
  }
  return false;
}

// `j` with every string longer than kMaxEventStringBytes cut there, saying how much was cut.
nlohmann::json Shortened(const nlohmann::json& j) {
  if (j.is_string()) {
    const std::string& text = j.get_ref<const std::string&>();
    if (text.size() <= kMaxEventStringBytes) return j;
    return text.substr(0, kMaxEventStringBytes) + "...(" +
           std::to_string(text.size() - kMaxEventStringBytes) + " more bytes)";
  }
  if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, value] : j.items()) out[key] = Shortened(value);
    return out;
  }
  if (j.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& value : j) out.push_back(Shortened(value));
    return out;
  }
  return j;
}

}  // namespace

std::string FormatEvent(std::string_view name, const nlohmann::json& fields) {
  // dump() without indentation never emits a newline; strings are escaped. A client's strings
  // (names, paths) may be long: each is cut, so no request makes the log much longer than it.
  auto dump = [](const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  return "event: " + std::string(name) + " " +
         (HasLongString(fields) ? dump(Shortened(fields)) : dump(fields));
}

void Event(std::string_view module, std::string_view name, const nlohmann::json& fields) {
  Get(module)->info("{}", FormatEvent(name, fields));
}

void Lifecycle(std::string_view name, const nlohmann::json& fields) {
  Event(kLifecycle, name, fields);
}

}  // namespace salus::logging
