// salus-sim: replays a job trace through the real scheduler and memory manager on a virtual
// clock, and writes jobs.jsonl and summary.json.
//
//   salus-sim --trace FILE --policy fifo|srtf|pack|fair|priority --capacity 16GiB --out DIR
//             [--seed N] [--turnaround S] [--policy-options JSON]
#include <boost/program_options.hpp>
#include <chrono>
#include <iostream>

#include "common/logging.h"
#include "common/units.h"
#include "device/memory_provider.h"
#include "tools/simulator.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  std::string trace, policy, capacity_text, out, profiles, policy_options;
  salus::tools::SimOptions opts;
  po::options_description desc(
      "salus-sim: replay a trace through Salus's scheduler and memory manager");
  desc.add_options()("help,h", "show this help")(
      "trace", po::value(&trace)->required(),
      "trace CSV: job_id,workload,submit_time_s,iterations[,persistent_mb,ephemeral_mb,"
      "iteration_s,utilization,turnaround_s,priority]")("policy", po::value(&policy)->required(),
                                                        "fifo, srtf, pack, fair or priority")(
      "capacity", po::value(&capacity_text)->default_value("16GiB"), "device memory, e.g. 16GiB")(
      "out", po::value(&out)->required(), "output folder for jobs.jsonl and summary.json")(
      "seed", po::value(&opts.seed)->default_value(1), "seed of the iteration-time jitter")(
      "jitter", po::value(&opts.jitter)->default_value(0.0),
      "iteration time varies uniformly by +-this fraction (0: none)")(
      "quantum", po::value(&opts.quantum_s)->default_value(0.0),
      "group a job's iterations into scheduling units of about this many seconds (0: exact)")(
      "turnaround", po::value(&opts.turnaround_s)->default_value(0.0),
      "seconds from a reply to the client's next request, for jobs whose trace gives no "
      "turnaround_s (0: back to back)")(
      "policy-options", po::value(&policy_options)->default_value(""),
      "the policy's options as a JSON object, e.g. {\"single_lane\":true}")(
      "profiles", po::value(&profiles)->default_value(SALUS_DEFAULT_PROFILES),
      "workload profiles CSV");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "salus-sim: " << e.what() << "\n\n" << desc;
    return 2;
  }
  salus::logging::SetLevel("warn").IgnoreError();  // per-admission events would flood stderr

  auto fail = [](const salus::Status& s) {
    std::cerr << "salus-sim: " << s.ToString() << "\n";
    return 1;
  };
  auto capacity = salus::ParseBytes(capacity_text);
  if (!capacity.ok()) return fail(capacity.status().WithContext("--capacity"));
  opts.capacity = *capacity;
  opts.policy = policy;
  if (!policy_options.empty()) {
    opts.policy_options = nlohmann::json::parse(policy_options, nullptr, false);
    if (opts.policy_options.is_discarded()) {
      return fail(salus::InvalidArgumentError("--policy-options is not valid JSON"));
    }
  }
  auto prof = salus::tools::LoadProfiles(profiles);
  if (!prof.ok()) return fail(prof.status());
  auto jobs = salus::tools::LoadTrace(trace, *prof);
  if (!jobs.ok()) return fail(jobs.status());
  auto provider = salus::device::CreateMemoryProvider("fake");
  if (!provider.ok()) return fail(provider.status());

  const auto t0 = std::chrono::steady_clock::now();
  auto result = salus::tools::Simulate(*jobs, opts, provider->get());
  if (!result.ok()) return fail(result.status());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result->summary["wall_s"] = wall;
  if (auto s = salus::tools::WriteSimResult(*result, out); !s.ok()) return fail(s);
  const auto& sum = result->summary;
  std::cout << "policy " << policy << ": " << sum["finished"] << " jobs finished, "
            << sum["refused"] << " refused; makespan " << sum["makespan_s"].get<double>()
            << " s, avg JCT " << sum["avg_jct_s"].get<double>() << " s, p95 JCT "
            << sum["p95_jct_s"].get<double>() << " s, avg queuing "
            << sum["avg_queuing_s"].get<double>() << " s, max lanes " << sum["max_lanes"]
            << ", safety violations " << sum["safety_violations"] << " (" << wall << " s wall)\n";
  return result->safety_violations == 0 ? 0 : 3;
}
