#include "tools/trace.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace salus::tools {
namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

StatusOr<std::string> ReadFile(const std::string& path, std::string_view what) {
  std::ifstream in(path);
  if (!in) return NotFoundError(fmt::format("{} '{}' cannot be opened", what, path));
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

struct Table {
  std::vector<std::string> header;
  std::vector<std::pair<int, std::vector<std::string>>> rows;  // (line number, fields)
};

StatusOr<Table> ParseCsv(const std::string& text, const std::string& origin) {
  Table t;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (Trim(line).empty() || Trim(line)[0] == '#') continue;
    auto fields = SplitCsvLine(line);
    if (t.header.empty()) {
      t.header = std::move(fields);
      continue;
    }
    if (fields.size() != t.header.size()) {
      return InvalidArgumentError(fmt::format("{}:{}: expected {} fields, got {}", origin, n,
                                              t.header.size(), fields.size()));
    }
    t.rows.emplace_back(n, std::move(fields));
  }
  if (t.header.empty()) return InvalidArgumentError(fmt::format("{}: no header line", origin));
  return t;
}

int Column(const Table& t, std::string_view name) {
  for (size_t i = 0; i < t.header.size(); ++i) {
    if (t.header[i] == name) return static_cast<int>(i);
  }
  return -1;
}

StatusOr<double> ParseNumber(const std::string& s, const std::string& origin, int line,
                             std::string_view column, bool allow_zero = true) {
  double v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v)) {
    return InvalidArgumentError(
        fmt::format("{}:{}: column '{}': '{}' is not a number", origin, line, column, s));
  }
  if (v < 0 || (!allow_zero && v == 0)) {
    return InvalidArgumentError(fmt::format("{}:{}: column '{}': {} must be {}", origin, line,
                                            column, s, allow_zero ? ">= 0" : "> 0"));
  }
  return v;
}

}  // namespace

std::vector<std::string> SplitCsvLine(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = line.find(',', start);
    out.push_back(Trim(line.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

StatusOr<std::map<std::string, Profile>> LoadProfiles(const std::string& path) {
  SALUS_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "profiles file"));
  SALUS_ASSIGN_OR_RETURN(Table t, ParseCsv(text, path));
  const int cw = Column(t, "workload"), ck = Column(t, "kind"), cp = Column(t, "persistent_mb"),
            ce = Column(t, "ephemeral_mb"), ci = Column(t, "iteration_s");
  if (cw < 0 || cp < 0 || ce < 0 || ci < 0) {
    return InvalidArgumentError(fmt::format(
        "{}: needs the columns workload, persistent_mb, ephemeral_mb, iteration_s", path));
  }
  std::map<std::string, Profile> out;
  for (const auto& [line, f] : t.rows) {
    Profile p;
    p.workload = f[cw];
    p.kind = ck >= 0 ? f[ck] : "training";
    SALUS_ASSIGN_OR_RETURN(p.persistent_mb, ParseNumber(f[cp], path, line, "persistent_mb"));
    SALUS_ASSIGN_OR_RETURN(p.ephemeral_mb, ParseNumber(f[ce], path, line, "ephemeral_mb"));
    if (!f[ci].empty()) {
      SALUS_ASSIGN_OR_RETURN(double it, ParseNumber(f[ci], path, line, "iteration_s", false));
      p.iteration_s = it;
    }
    out[p.workload] = p;
  }
  return out;
}

StatusOr<std::vector<TraceJob>> ParseTrace(const std::string& text, const std::string& origin,
                                           const std::map<std::string, Profile>& profiles) {
  SALUS_ASSIGN_OR_RETURN(Table t, ParseCsv(text, origin));
  const int cj = Column(t, "job_id"), cw = Column(t, "workload"), cs = Column(t, "submit_time_s"),
            cn = Column(t, "iterations");
  std::vector<std::string> missing;
  if (cj < 0) missing.push_back("job_id");
  if (cw < 0) missing.push_back("workload");
  if (cs < 0) missing.push_back("submit_time_s");
  if (cn < 0) missing.push_back("iterations");
  if (!missing.empty()) {
    std::string names;
    for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m;
    return InvalidArgumentError(fmt::format("{}:1: missing column(s) {}", origin, names));
  }
  const int cp = Column(t, "persistent_mb"), ce = Column(t, "ephemeral_mb"),
            ci = Column(t, "iteration_s"), cu = Column(t, "utilization"),
            ct = Column(t, "turnaround_s"), cr = Column(t, "priority"),
            cf = Column(t, "swap_fraction"), cd = Column(t, "device");
  std::vector<TraceJob> jobs;
  std::set<std::string> ids;
  for (const auto& row : t.rows) {
    // Plain names, not a structured binding: lambdas below capture them.
    const int line = row.first;
    const std::vector<std::string>& f = row.second;
    TraceJob j;
    j.line = line;
    j.job_id = f[cj];
    j.workload = f[cw];
    if (j.job_id.empty())
      return InvalidArgumentError(fmt::format("{}:{}: empty job_id", origin, line));
    if (!ids.insert(j.job_id).second) {
      return InvalidArgumentError(
          fmt::format("{}:{}: duplicate job_id '{}'", origin, line, j.job_id));
    }
    SALUS_ASSIGN_OR_RETURN(j.submit_s, ParseNumber(f[cs], origin, line, "submit_time_s"));
    SALUS_ASSIGN_OR_RETURN(double iters, ParseNumber(f[cn], origin, line, "iterations", false));
    if (iters != std::floor(iters)) {
      return InvalidArgumentError(
          fmt::format("{}:{}: column 'iterations': {} is not a whole number", origin, line, f[cn]));
    }
    j.iterations = static_cast<int64_t>(iters);

    auto given = [&](int c) { return c >= 0 && !f[c].empty(); };
    const auto pit = profiles.find(j.workload);
    const bool has_profile = pit != profiles.end();
    if (!has_profile && !(given(cp) && given(ce) && given(ci))) {
      return InvalidArgumentError(fmt::format(
          "{}:{}: unknown workload '{}' (not in the profiles, and the trace does not give "
          "persistent_mb, ephemeral_mb and iteration_s)",
          origin, line, j.workload));
    }
    double p_mb = has_profile ? pit->second.persistent_mb : 0;
    double e_mb = has_profile ? pit->second.ephemeral_mb : 0;
    double it_s = has_profile ? pit->second.iteration_s.value_or(-1) : -1;  // -1: none
    if (given(cp)) {
      SALUS_ASSIGN_OR_RETURN(p_mb, ParseNumber(f[cp], origin, line, "persistent_mb"));
    }
    if (given(ce)) {
      SALUS_ASSIGN_OR_RETURN(e_mb, ParseNumber(f[ce], origin, line, "ephemeral_mb"));
    }
    if (given(ci)) {
      SALUS_ASSIGN_OR_RETURN(it_s, ParseNumber(f[ci], origin, line, "iteration_s", false));
    }
    if (it_s < 0) {
      return InvalidArgumentError(
          fmt::format("{}:{}: workload '{}' has no measured iteration time; give iteration_s",
                      origin, line, j.workload));
    }
    if (given(cu)) {
      SALUS_ASSIGN_OR_RETURN(j.utilization, ParseNumber(f[cu], origin, line, "utilization", false));
    }
    if (given(ct)) {
      SALUS_ASSIGN_OR_RETURN(double turnaround, ParseNumber(f[ct], origin, line, "turnaround_s"));
      j.turnaround_s = turnaround;
    }
    if (given(cr)) {
      int priority = 0;
      const auto [ptr, ec] = std::from_chars(f[cr].data(), f[cr].data() + f[cr].size(), priority);
      if (ec != std::errc() || ptr != f[cr].data() + f[cr].size() || priority < -100 ||
          priority > 100) {
        return InvalidArgumentError(
            fmt::format("{}:{}: column 'priority': '{}' is not an integer in [-100, 100]", origin,
                        line, f[cr]));
      }
      j.priority = priority;
    }
    if (given(cf)) {
      SALUS_ASSIGN_OR_RETURN(double fraction, ParseNumber(f[cf], origin, line, "swap_fraction"));
      if (fraction >= 1) {
        return InvalidArgumentError(
            fmt::format("{}:{}: column 'swap_fraction': {} is not in [0, 1)", origin, line, f[cf]));
      }
      j.swap_fraction = fraction;
    }
    if (given(cd)) {
      int device = 0;
      const auto [ptr, ec] = std::from_chars(f[cd].data(), f[cd].data() + f[cd].size(), device);
      if (ec != std::errc() || ptr != f[cd].data() + f[cd].size() || device < 0) {
        return InvalidArgumentError(fmt::format(
            "{}:{}: column 'device': '{}' is not a device index (0, 1, ...)", origin, line, f[cd]));
      }
      j.device = device;
    }
    j.training = !has_profile || pit->second.kind != "inference";
    j.persistent_bytes = static_cast<uint64_t>(std::llround(p_mb * kProfileMegabyte));
    j.ephemeral_bytes = static_cast<uint64_t>(std::llround(e_mb * kProfileMegabyte));
    j.iteration_s = it_s;
    jobs.push_back(std::move(j));
  }
  return jobs;
}

StatusOr<std::vector<TraceJob>> LoadTrace(const std::string& path,
                                          const std::map<std::string, Profile>& profiles) {
  SALUS_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "trace"));
  return ParseTrace(text, path, profiles);
}

}  // namespace salus::tools
