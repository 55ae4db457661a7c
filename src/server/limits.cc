#include "server/limits.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cmath>
#include <string>

#include "common/config.h"

namespace salus::server {

uint64_t DefaultHostBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 8 * kGiB;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2;
}

uint64_t DefaultRequestBytes() { return DefaultHostBytes() / 2; }

StatusOr<Limits> Limits::FromJson(const nlohmann::json& section) {
  Limits l;
  if (section.is_null()) return l;
  if (!section.is_object()) return InvalidArgumentError("\"limits\" must be an object");
  for (const auto& [key, value] : section.items()) {
    if (key == "compile_seconds") {
      if (!value.is_number() || !(value.get<double>() >= 0) ||
          !std::isfinite(value.get<double>())) {
        return InvalidArgumentError(
            fmt::format("limit \"compile_seconds\" must be a number >= 0, got {}", value.dump()));
      }
      l.compile_seconds = value.get<double>();
      continue;
    }
    struct Field {
      const char* name;
      uint64_t* field;
      bool bytes;
    };
    uint64_t max_nodes = static_cast<uint64_t>(l.max_nodes);
    const Field fields[] = {{"max_constant_bytes", &l.max_constant_bytes, true},
                            {"max_nodes", &max_nodes, false},
                            {"compile_threads", &l.compile_threads, false},
                            {"max_name_bytes", &l.max_name_bytes, true},
                            {"max_shared_buffer_bytes", &l.max_shared_buffer_bytes, true},
                            {"shared_buffer_bytes", &l.shared_buffer_bytes, true},
                            {"paced_requests", &l.paced_requests, false},
                            {"reply_backlog", &l.reply_backlog, false},
                            {"reply_backlog_bytes", &l.reply_backlog_bytes, true},
                            {"request_bytes", &l.request_bytes, true},
                            {"host_bytes", &l.host_bytes, true}};
    const Field* f = nullptr;
    for (const Field& candidate : fields) {
      if (key == candidate.name) f = &candidate;
    }
    if (f == nullptr) {
      std::vector<std::string> names = {"compile_seconds"};
      for (const Field& candidate : fields) names.emplace_back(candidate.name);
      return InvalidArgumentError(fmt::format("unknown limit \"{}\"{} (expected {})", key,
                                              DidYouMean(key, names), fmt::join(names, ", ")));
    }
    if (value.is_number_unsigned()) {
      *f->field = value.get<uint64_t>();
    } else if (value.is_string() && f->bytes) {
      auto bytes = ParseBytes(value.get<std::string>());
      if (!bytes.ok()) {
        return InvalidArgumentError(fmt::format("limit \"{}\": {}", key, bytes.status().message()));
      }
      *f->field = *bytes;
    } else {
      return InvalidArgumentError(
          fmt::format("limit \"{}\" must be a non-negative integer{}, got {}", key,
                      f->bytes ? " or a size such as \"4GiB\"" : "", value.dump()));
    }
    if (f->field == &max_nodes) {
      l.max_nodes = static_cast<int64_t>(std::min<uint64_t>(max_nodes, INT64_MAX));
    }
  }
  if (l.compile_threads == 0 || l.compile_threads > 64) {
    return InvalidArgumentError("limit \"compile_threads\" must be in [1, 64]");
  }
  return l;
}

exec::CompileLimits Limits::Compile() const {
  exec::CompileLimits c;
  c.max_constant_bytes = max_constant_bytes;
  c.max_nodes = max_nodes;
  return c;
}

}  // namespace salus::server
