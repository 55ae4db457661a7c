// Snapshots: the daemon's sessions written to a directory when it drains, and read back when
// it starts again (Note [Restarts] in snapshot.cc; docs/operations.md, Restarts).
#pragma once

#include <string>
#include <vector>

#include "salus/status.h"
#include "salus/v1/snapshot.pb.h"

namespace salus::server {

// The snapshot format this daemon writes; it reads this one and older ones.
inline constexpr uint32_t kSnapshotFormat = 1;
// The manifest's file in a snapshot directory, and what it becomes once restored.
inline constexpr const char* kSnapshotManifest = "snapshot.pb";
inline constexpr const char* kSnapshotRestored = "snapshot.restored.pb";

// A snapshot in memory: the manifest, and each session's state bytes (in manifest order; empty
// for a session without state).
struct SnapshotData {
  v1::Snapshot manifest;
  std::vector<std::string> states;
};

// Writes `data` to `dir` (made if missing): each state file, then the manifest, each written,
// synced and renamed into place, and the directory synced; state files of earlier snapshots
// are removed after. Fills in each session's state_file, state_bytes and state_sha256, and
// the format version. The error names the file.
Status WriteSnapshot(const std::string& dir, SnapshotData* data);

// Whether `dir` holds a snapshot to restore (its manifest is there).
bool HasSnapshot(const std::string& dir);

// Reads and verifies the snapshot in `dir`: the manifest's digest and format version, and
// each state file's size and digest against the manifest and against its state values' specs.
// Anything that does not verify is an error naming the file and what is wrong (DATA_LOSS for
// damage, FAILED_PRECONDITION for a format this daemon does not know, NOT_FOUND when there is
// no snapshot).
StatusOr<SnapshotData> ReadSnapshot(const std::string& dir);

// Renames the manifest of `dir` to kSnapshotRestored, so that the snapshot, once taken up, is
// not restored a second time after a later crash.
Status RetireSnapshot(const std::string& dir);

}  // namespace salus::server
