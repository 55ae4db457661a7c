// The admission rules: where a session goes in the arena, decided over a read-only snapshot
// (mem/admission.h) and applied by the memory manager. Each policy names its rule
// (Policy::admission_rule), since who shares the device is part of the policy:
//   pack         Algorithm 1 (docs/memory.md), as many lanes as the safety condition allows
//                (PACK, FAIR);
//   single-lane  one lane per lane class, grown to the largest E (SRTF, PRIORITY, FAIR's
//                single-lane option);
//   exclusive    one resident job on the device at a time (FIFO; Note [Jobs]).
// Every rule keeps a lane to sessions of one LaneClass. Asked to make room for a page-in with
// candidates to page out, a rule takes the shortest prefix of them after which its own
// condition admits the session (Note [Paging] in src/mem/arena_memory_manager.cc).
#pragma once

#include <memory>

#include "mem/admission.h"

namespace salus::sched {

std::shared_ptr<const mem::AdmissionRule> PackRule();
std::shared_ptr<const mem::AdmissionRule> SingleLaneRule();
std::shared_ptr<const mem::AdmissionRule> ExclusiveRule();

}  // namespace salus::sched
