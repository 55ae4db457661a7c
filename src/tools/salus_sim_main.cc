// salus-sim: replays a job trace through the real scheduler and memory manager on a virtual
// clock, and writes jobs.jsonl and summary.json.
//
//   salus-sim --trace FILE --policy fifo|srtf|pack|fair|priority --capacity 16GiB --out DIR
//             [--seed N] [--turnaround S] [--policy-options JSON]
//             [--overcommit X] [--host-bandwidth-gbps G] [--paging-quantum-ms MS]
//             [--swap-fraction F] [--swap-points N] [--swap-overlap H]
//             [--devices N] [--no-defragment] [--interference F]
#include <boost/program_options.hpp>
#include <chrono>
#include <iostream>

#include "common/logging.h"
#include "common/units.h"
#include "common/version.h"
#include "device/memory_provider.h"
#include "tools/simulator.h"

namespace po = boost::program_options;

// Link bandwidths are quoted in decimal gigabytes per second.
constexpr double kBytesPerGB = 1e9;

int main(int argc, char** argv) {
  std::string trace, policy, capacity_text, out, profiles, policy_options;
  salus::tools::SimOptions opts;
  double host_gbps = salus::tools::kDefaultHostBandwidthBytesPerS / kBytesPerGB;
  po::options_description desc(
      "salus-sim: replay a trace through Salus's scheduler and memory manager");
  desc.add_options()("help,h", "show this help")("version", "print the version and exit")(
      "trace", po::value(&trace)->required(),
      "trace CSV: job_id,workload,submit_time_s,iterations[,persistent_mb,ephemeral_mb,"
      "iteration_s,utilization,turnaround_s,priority,swap_fraction,device]")(
      "policy", po::value(&policy)->required(), "fifo, srtf, pack, fair or priority")(
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
      "overcommit", po::value(&opts.overcommit)->default_value(1.0),
      "admit sessions while the persistent memory of all of them is at most this times the "
      "capacity, paging to host memory what does not fit (1: no paging)")(
      "host-bandwidth-gbps", po::value(&host_gbps)->default_value(host_gbps),
      "copy bandwidth between device and host memory in GB/s (gigabytes, 1e9 bytes, per "
      "second), one copy at a time; the default is a PCIe 4.0 x16 link's practical rate")(
      "paging-quantum-ms", po::value(&opts.paging_quantum_ms)->default_value(1000.0),
      "a session made resident is not paged out before this many ms and one iteration")(
      "swap-fraction", po::value(&opts.swap_fraction)->default_value(0.0),
      "training jobs may swap up to this fraction of their ephemeral memory to host memory "
      "within an iteration, for a smaller lane at a cost in time (0: no swapping; a trace's "
      "swap_fraction column overrides it per job)")(
      "swap-points", po::value(&opts.swap_points)->default_value(4),
      "swap points a job offers, the first swapping nothing")(
      "swap-overlap", po::value(&opts.swap_overlap)->default_value(0.5),
      "the fraction of an iteration that swap copies hide behind; longer copies stall it")(
      "devices", po::value(&opts.devices)->default_value(1),
      "identical devices of --capacity each, with their own compute and copy path; the engine "
      "places, moves and unpacks jobs across them")(
      "no-defragment",
      "the engine does not move jobs between devices by itself (to let waiting ones in, or to "
      "an idle device)")(
      "interference", po::value(&opts.interference)->default_value(0.0),
      "each iteration runs slower by this factor per other iteration beside it on its device, "
      "beyond sharing compute (what introspective packing detects; 0: none)")(
      "profiles", po::value(&profiles)->default_value(SALUS_DEFAULT_PROFILES),
      "workload profiles CSV");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("version")) {
      std::cout << salus::VersionText("salus-sim");
      return 0;
    }
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
  opts.host_bandwidth = host_gbps * kBytesPerGB;
  opts.defragment = vm.count("no-defragment") == 0;
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
            << ", safety violations " << sum["safety_violations"];
  if (sum.contains("paging")) {
    const auto& pg = sum["paging"];
    std::cout << "; paging: " << pg["page_ins"] << " page-ins, " << pg["page_outs"]
              << " page-outs, " << pg["copied_bytes"].get<double>() / kBytesPerGB
              << " GB copied, copy path busy " << pg["copy_busy_s"].get<double>() << " s";
  }
  if (sum.contains("devices")) {
    const auto& dv = sum["devices"];
    double util = 0;
    for (const auto& u : dv["utilization"]) util += u.get<double>();
    std::cout << "; " << dv["count"] << " devices, mean utilization "
              << util / dv["count"].get<double>() << ", " << dv["migrations"]["finished"]
              << " moves, pairs kept/apart/moved " << dv["pairs"]["kept"] << "/"
              << dv["pairs"]["apart"] << "/" << dv["pairs"]["moved"];
  }
  if (sum.contains("swapping")) {
    const auto& sw = sum["swapping"];
    std::cout << "; swapping: " << sw["jobs_swapped"] << " jobs, " << sw["swapped_units"]
              << " units, " << sw["copied_bytes"].get<double>() / kBytesPerGB << " GB copied";
  }
  std::cout << " (" << wall << " s wall)\n";
  return result->safety_violations == 0 ? 0 : 3;
}
