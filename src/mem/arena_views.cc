// The memory manager's views (lanes, statistics, the memory map) and its invariants.
#include <fmt/format.h>

#include <algorithm>

#include "common/check.h"
#include "mem/arena_memory_manager.h"

namespace salus::mem {

std::vector<LaneInfo> ArenaMemoryManager::Lanes() const {
  MutexLock lock(&mu_);
  std::vector<LaneInfo> out;
  out.reserve(lanes_.size());
  uint64_t offset = 0;
  for (const auto& [id, l] : lanes_) {
    out.push_back(LaneInfo{id, l.lane_class, offset, l.size, l.sessions, l.in_iteration});
    offset += l.size;
  }
  return out;
}

size_t ArenaMemoryManager::WaitingCount() const {
  MutexLock lock(&mu_);
  return waiting_.size();
}

uint64_t ArenaMemoryManager::CommittedBytes() const {
  MutexLock lock(&mu_);
  return persistent_bytes_ + lane_bytes_;
}

MemoryStatsSnapshot ArenaMemoryManager::StatsSnapshot() const {
  MutexLock lock(&mu_);
  return SnapshotLocked();
}

MemoryStatsSnapshot ArenaMemoryManager::SnapshotLocked() const {
  MemoryStatsSnapshot s;
  s.capacity = capacity_;
  s.persistent_committed_bytes = persistent_bytes_;
  s.ephemeral_committed_bytes = lane_bytes_;
  s.persistent_footprint_bytes = region_.extent();
  s.admitted_sessions = sessions_.size();
  s.waiting_sessions = waiting_.size();
  s.paged_bytes = paged_bytes_;
  s.paged_sessions = paged_sessions_;
  s.page_outs = page_outs_;
  s.page_ins = page_ins_;
  s.paged_out_bytes = paged_out_bytes_;
  s.paged_in_bytes = paged_in_bytes_;
  s.host_pool_bytes = host_pool_bytes_;
  s.persistent = persistent_stats_;
  s.ephemeral = closed_lane_stats_;
  uint64_t offset = 0;
  for (const auto& [id, l] : lanes_) {
    const MemoryStats ls = l.allocator->stats();
    s.ephemeral.Merge(ls);
    s.lanes.push_back(LaneStats{id, offset, l.size, ls});
    offset += l.size;
  }
  for (const auto& [id, l] : draining_) s.ephemeral.Merge(l.allocator->stats());
  ephemeral_peak_ = std::max(ephemeral_peak_, s.ephemeral.current_bytes);
  s.ephemeral.peak_bytes = ephemeral_peak_;
  for (const auto& [id, x] : sessions_) {
    SessionStats ss{id, x.lane, x.residence, x.req, x.persistent, x.ephemeral};
    ss.ephemeral.current_bytes = 0;
    s.sessions.push_back(ss);
  }
  return s;
}

nlohmann::json ArenaMemoryManager::Stats() const {
  const MemoryStatsSnapshot s = StatsSnapshot();
  nlohmann::json lanes = nlohmann::json::array();
  for (const LaneStats& l : s.lanes) {
    lanes.push_back({{"id", l.lane},
                     {"offset", l.offset},
                     {"size", l.size},
                     {"ephemeral", ToJson(l.ephemeral)}});
  }
  nlohmann::json sessions = nlohmann::json::array();
  for (const SessionStats& x : s.sessions) {
    const bool in_region =
        x.residence == Residence::kResident || x.residence == Residence::kPagingIn;
    sessions.push_back({{"id", x.session},
                        {"lane", x.lane},
                        {"residence", ResidenceName(x.residence)},
                        {"resident_bytes", in_region ? x.requirement.persistent_bytes : 0},
                        {"paged_bytes", in_region ? 0 : x.requirement.persistent_bytes},
                        {"persistent_bytes", x.requirement.persistent_bytes},
                        {"ephemeral_bytes", x.requirement.ephemeral_bytes},
                        {"persistent", ToJson(x.persistent)},
                        {"ephemeral", ToJson(x.ephemeral)}});
  }
  return {{"capacity", s.capacity},
          {"committed_bytes", s.persistent_committed_bytes + s.ephemeral_committed_bytes},
          {"persistent_committed_bytes", s.persistent_committed_bytes},
          {"ephemeral_committed_bytes", s.ephemeral_committed_bytes},
          {"persistent_footprint_bytes", s.persistent_footprint_bytes},
          {"admitted_sessions", s.admitted_sessions},
          {"waiting_sessions", s.waiting_sessions},
          {"paging",
           {{"paged_bytes", s.paged_bytes},
            {"paged_sessions", s.paged_sessions},
            {"page_outs", s.page_outs},
            {"page_ins", s.page_ins},
            {"paged_out_bytes", s.paged_out_bytes},
            {"paged_in_bytes", s.paged_in_bytes},
            {"host_pool_bytes", s.host_pool_bytes}}},
          {"regions", {{"persistent", ToJson(s.persistent)}, {"ephemeral", ToJson(s.ephemeral)}}},
          {"lanes", lanes},
          {"sessions", sessions}};
}

nlohmann::json ArenaMemoryManager::MemoryMap() const {
  MutexLock lock(&mu_);
  std::vector<std::pair<uint64_t, uint64_t>> used;  // (offset, size)
  nlohmann::json lanes = nlohmann::json::array();
  uint64_t offset = 0;
  auto lane_json = [&](const Lane& l, std::optional<uint64_t> layout) {
    nlohmann::json j = {{"id", l.id},
                        {"class", LaneClassName(l.lane_class)},
                        {"size", l.size},
                        {"sessions", l.sessions},
                        {"in_iteration", l.in_iteration}};
    j["offset"] = layout ? nlohmann::json(*layout) : nlohmann::json(nullptr);
    if (l.in_iteration) {
      j["placed"] = {{"offset", l.placed_offset}, {"size", l.placed_size}};
      used.emplace_back(l.placed_offset, l.placed_size);
    }
    if (l.closed)
      j["state"] = "draining";
    else if (!l.placed || l.placed_offset != *layout || l.placed_size != l.size) {
      j["state"] = "moves at next iteration";
    } else {
      j["state"] = "placed";
    }
    return j;
  };
  for (const auto& [id, l] : lanes_) {
    lanes.push_back(lane_json(l, offset));
    used.emplace_back(offset, l.size);
    offset += l.size;
  }
  for (const auto& [id, l] : draining_) lanes.push_back(lane_json(l, std::nullopt));
  nlohmann::json blocks = nlohmann::json::array();
  nlohmann::json paged = nlohmann::json::array();
  for (const auto& [id, s] : sessions_) {
    if (s.residence == Residence::kPagingOut || s.residence == Residence::kPagedOut) {
      paged.push_back({{"session", id},
                       {"size", s.req.persistent_bytes},
                       {"state", ResidenceName(s.residence)}});
      continue;
    }
    if (s.req.persistent_bytes == 0) continue;
    const char* state = s.block_pending                       ? "pending"
                        : s.residence == Residence::kPagingIn ? "paging in"
                                                              : "placed";
    blocks.push_back({{"session", id},
                      {"offset", s.block_offset},
                      {"size", s.req.persistent_bytes},
                      {"state", state}});
    used.emplace_back(s.block_offset, s.req.persistent_bytes);
  }
  for (const auto& [tid, m] : moving_) {
    if (!m.to_host && !m.released) continue;  // the block of a session paging in, listed above
    blocks.push_back({{"session", m.released ? nlohmann::json(nullptr) : nlohmann::json(m.session)},
                      {"offset", m.offset},
                      {"size", m.size},
                      {"state", m.to_host ? "paging out" : "retiring"},
                      {"transfer", tid}});
    used.emplace_back(m.offset, m.size);
  }
  for (const Retiring& r : retiring_) {
    blocks.push_back({{"session", nullptr},
                      {"offset", r.offset},
                      {"size", r.size},
                      {"state", "retiring"},
                      {"lane", r.lane}});
    used.emplace_back(r.offset, r.size);
  }
  std::sort(used.begin(), used.end());
  nlohmann::json free = nlohmann::json::array();
  uint64_t at = 0;
  for (const auto& [o, n] : used) {
    if (n == 0) continue;
    if (o > at) free.push_back({{"offset", at}, {"size", o - at}});
    at = std::max(at, o + n);
  }
  if (at < capacity_) free.push_back({{"offset", at}, {"size", capacity_ - at}});
  return {{"capacity", capacity_},
          {"alignment", kArenaAlignment},
          {"regions",
           {{"ephemeral", {{"offset", 0}, {"size", lane_bytes_}}},
            {"persistent", {{"offset", region_.floor()}, {"size", region_.extent()}}}}},
          {"lanes", lanes},
          {"persistent_blocks", blocks},
          {"paged_sessions", paged},
          {"free_ranges", free}};
}

// ----------------------------------------------------------------------------------------
// Invariants

void ArenaMemoryManager::DcheckInvariants() const {
#if SALUS_DCHECK_IS_ON
  const Status s = CheckInvariantsLocked();
  SALUS_DCHECK(s.ok(), s.ToString());
#endif
}

Status ArenaMemoryManager::CheckInvariants() const {
  MutexLock lock(&mu_);
  return CheckInvariantsLocked();
}

Status ArenaMemoryManager::CheckInvariantsLocked() const {
  auto broken = [](std::string what) { return InternalError("memory invariant broken: " + what); };
  const uint64_t c = capacity_;
  // Invariant 1, and the footprint rule that implies it (Note [Persistent footprint]).
  if (persistent_bytes_ + lane_bytes_ > c) {
    return broken(
        fmt::format("safety condition: ΣP {} + ΣL {} > C {}", persistent_bytes_, lane_bytes_, c));
  }
  if (region_.extent() + lane_bytes_ > c) {
    return broken(
        fmt::format("persistent footprint {} + ΣL {} > C {}", region_.extent(), lane_bytes_, c));
  }
  uint64_t sum_p = 0, sum_paged = 0;
  size_t paged = 0, in_lanes = 0;
  for (const auto& [id, s] : sessions_) {
    const bool in_region =
        s.residence == Residence::kResident || s.residence == Residence::kPagingIn;
    if (!in_region) {
      sum_paged += s.req.persistent_bytes;
      ++paged;
      if (s.lane != 0) return broken(fmt::format("paged-out session {} is in lane {}", id, s.lane));
      if (s.host == nullptr && !s.fresh && !s.leaving && s.req.persistent_bytes > 0) {
        return broken(fmt::format("paged-out session {} has no host copy", id));
      }
      continue;
    }
    ++in_lanes;
    sum_p += s.req.persistent_bytes;
    const auto lane = lanes_.find(s.lane);
    if (lane == lanes_.end()) return broken(fmt::format("session {} in no open lane", id));
    if (s.req.persistent_bytes > 0) {
      const auto b = region_.blocks().find(s.block_offset);
      if (b == region_.blocks().end() || b->second != s.req.persistent_bytes) {
        return broken(fmt::format("session {}'s block is not in the persistent region", id));
      }
      if (s.block_pending != Hazard(s.block_offset, s.req.persistent_bytes, 0, id).has_value()) {
        return broken(fmt::format("session {}'s block is {} but {}", id,
                                  s.block_pending ? "pending" : "placed",
                                  s.block_pending ? "nothing occupies it" : "it is occupied"));
      }
    }
  }
  if (sum_paged != paged_bytes_ || paged != paged_sessions_) {
    return broken(fmt::format("{} sessions hold {} paged bytes but the count says {} and {}", paged,
                              sum_paged, paged_sessions_, paged_bytes_));
  }
  if (options_.overcommit > 1.0 && static_cast<double>(sum_p + sum_paged) >
                                       options_.overcommit * static_cast<double>(capacity_)) {
    return broken(fmt::format("overcommit: ΣP {} of admitted sessions > {} × C", sum_p + sum_paged,
                              options_.overcommit));
  }
  if (sum_p != persistent_bytes_ || region_.block_bytes() != sum_p) {
    return broken(fmt::format("ΣP {} but the sessions hold {} and the region {}", persistent_bytes_,
                              sum_p, region_.block_bytes()));
  }
  if (persistent_stats_.current_bytes != sum_p || !persistent_stats_.Balanced()) {
    return broken("persistent statistics do not account for the blocks");
  }
  uint64_t sum_l = 0;
  size_t members = 0;
  for (const auto& [id, l] : lanes_) {
    if (l.sessions.empty()) return broken(fmt::format("open lane {} has no session", id));
    if (l.size != *l.ephemeral.rbegin()) {
      return broken(fmt::format("lane {} has size {} but its largest E is {}", id, l.size,
                                *l.ephemeral.rbegin()));
    }
    if (!lanes_by_size_.contains({l.lane_class, l.size, id})) {
      return broken("lane size index out of date");
    }
    if (l.in_iteration != in_flight_.contains(id)) return broken("in-flight set out of date");
    for (const SessionId s : l.sessions) {
      const auto it = sessions_.find(s);
      if (it == sessions_.end() || it->second.lane != id) {
        return broken(fmt::format("lane {} lists session {}, which is not in it", id, s));
      }
      if (it->second.req.lane_class != l.lane_class) {
        return broken(fmt::format("lane {} ({}) holds session {} of another class", id,
                                  LaneClassName(l.lane_class), s));
      }
    }
    members += l.sessions.size();
    sum_l += l.size;
  }
  if (sum_l != lane_bytes_ || lanes_by_size_.size() != lanes_.size() || members != in_lanes) {
    return broken(fmt::format("ΣL {} but the lanes hold {}", lane_bytes_, sum_l));
  }
  SALUS_RETURN_IF_ERROR(options_.rule->CheckShape(LiveView(*this)));
  for (const auto& [id, l] : draining_) {
    if (!l.in_iteration || !l.closed || !in_flight_.contains(id)) {
      return broken(fmt::format("draining lane {} is not mid-iteration", id));
    }
  }
  // Invariant 2 and 3 physically: lanes mid-iteration are disjoint from each other and from
  // placed blocks; layout places stay below the persistent region.
  if (lane_bytes_ > region_.floor()) return broken("lane layout reaches the persistent region");
  // (offset, size, lane or session id, is a lane); names are formatted only on failure.
  struct Placed {
    uint64_t offset, size, id;
    bool lane;
    bool operator<(const Placed& o) const { return offset < o.offset; }
  };
  std::vector<Placed> placed;
  placed.reserve(in_flight_.size() + sessions_.size());
  for (const LaneId id : in_flight_) {
    const auto it = lanes_.find(id);
    const Lane& l = it != lanes_.end() ? it->second : draining_.at(id);
    placed.push_back({l.placed_offset, l.placed_size, id, true});
  }
  for (const auto& [id, s] : sessions_) {
    const bool in_region =
        s.residence == Residence::kResident || s.residence == Residence::kPagingIn;
    if (in_region && s.req.persistent_bytes > 0 && !s.block_pending) {
      placed.push_back({s.block_offset, s.req.persistent_bytes, id, false});
    }
  }
  for (const auto& [tid, m] : moving_) {  // a page-in's range is its session's block, above
    if (m.to_host || m.released) placed.push_back({m.offset, m.size, m.session, false});
  }
  std::sort(placed.begin(), placed.end());
  uint64_t end = 0;
  for (const Placed& x : placed) {
    if (x.size == 0) continue;
    const auto name = [&] {
      return fmt::format("{} {}", x.lane ? "lane" : "block of session", x.id);
    };
    if (x.offset + x.size > c) return broken(name() + " leaves the arena");
    if (x.offset < end) return broken(name() + " overlaps its neighbour");
    end = x.offset + x.size;
  }
  return OkStatus();
}

}  // namespace salus::mem
