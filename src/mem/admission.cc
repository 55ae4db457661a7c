#include "mem/admission.h"

#include <algorithm>
#include <iterator>

namespace salus::mem {

std::string_view StepName(AdmissionDecision::Step step) {
  switch (step) {
    case AdmissionDecision::Step::kNewLane:
      return "new lane";
    case AdmissionDecision::Step::kJoin:
      return "join";
    case AdmissionDecision::Step::kGrow:
      return "grow";
    case AdmissionDecision::Step::kWait:
      return "wait";
  }
  return "?";
}

size_t ArenaView::ResidentOutside(uint64_t job) const {
  std::vector<uint64_t> jobs;
  ResidentJobs(&jobs);
  if (job == 0) return jobs.size();
  return static_cast<size_t>(
      std::count_if(jobs.begin(), jobs.end(), [job](uint64_t j) { return j != job; }));
}

size_t ArenaView::ResidentJobCount() const {
  std::vector<uint64_t> jobs;
  ResidentJobs(&jobs);
  std::sort(jobs.begin(), jobs.end());
  const auto first_job = std::upper_bound(jobs.begin(), jobs.end(), uint64_t{0});
  // Sessions of no job each count; the others once per job.
  return static_cast<size_t>(first_job - jobs.begin()) +
         static_cast<size_t>(std::distance(first_job, std::unique(first_job, jobs.end())));
}

void ArenaSnapshot::ResidentJobs(std::vector<uint64_t>* out) const {
  for (const auto& [id, r] : resident) out->push_back(r.job);
}

std::optional<LaneView> ArenaSnapshot::SmallestLane(LaneClass cls, uint64_t at_least) const {
  const Lane* best = nullptr;
  for (const auto& [id, l] : lanes) {
    if (l.lane_class != cls || l.size < at_least) continue;
    if (best == nullptr || l.size < best->size) best = &l;
  }
  if (best == nullptr) return std::nullopt;
  return LaneView{best->id, best->lane_class, best->size};
}

std::optional<LaneView> ArenaSnapshot::FindLane(LaneId id) const {
  const auto it = lanes.find(id);
  if (it == lanes.end()) return std::nullopt;
  return LaneView{id, it->second.lane_class, it->second.size};
}

size_t ArenaSnapshot::LaneCount(LaneClass cls) const {
  size_t n = 0;
  for (const auto& [id, l] : lanes) n += l.lane_class == cls;
  return n;
}

bool ArenaSnapshot::PageOut(SessionId session) {
  const auto it = resident.find(session);
  if (it == resident.end()) return false;
  const Resident r = it->second;
  resident.erase(it);
  if (r.persistent_bytes > 0) region.Remove(r.block_offset);
  const auto lit = lanes.find(r.lane);
  if (lit != lanes.end()) {
    Lane& l = lit->second;
    l.members.erase(l.members.find(r.ephemeral_bytes));
    const uint64_t size = l.members.empty() ? 0 : *l.members.rbegin();
    lane_total -= l.size - size;
    l.size = size;
    if (l.members.empty()) lanes.erase(lit);
  }
  return true;
}

}  // namespace salus::mem
