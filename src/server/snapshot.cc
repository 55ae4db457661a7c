#include "server/snapshot.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/sha256.h"
#include "server/session_runtime.h"

namespace salus::server {

// Note [Restarts]
// A session's persistent state lives in the daemon, so a restart would end every job. Instead
// a drain may write a snapshot (salus.v1.Drain.snapshot_dir, or the configured state_dir on
// SIGTERM): new work is refused (UNAVAILABLE) from the moment the drain starts, the iterations
// already queued still run, and then each session's persistent values are read by a
// state-only request queued after them, so what is written is the state at an iteration
// boundary with every accepted iteration applied and answered. Beside it go what recreates
// the session (its CreateSession as the client sent it, model included), its iteration count,
// and its client: id, name, principal and the SHA-256 of its token (the registry keeps no
// more than that itself), and the allocations as granted (tokens included, as the device
// plugin's own state keeps them: the snapshot's files are the daemon user's alone). A session
// waiting for admission has run nothing, so its state is its model's and is not read.
//
// `salus-server --restore DIR` (or a state_dir holding a snapshot) reads it back before it
// serves anyone: every file is checked against the digests in the manifest, and anything
// that does not verify refuses the whole snapshot (the daemon does not start, unless told to
// start empty). Then the allocations are granted again and the clients taken up with their
// tokens (a device plugin that grants an allocation again finds it there), and each session is
// compiled again for the device found now (another GPU, or the CPU), with its id and iteration
// count, and a state write queued before anything else it will run. A client that comes back
// presents the token it had and finds its sessions as they were; one that does not is closed
// when its lease runs out, as any silent client. The manifest is then renamed (RetireSnapshot),
// so a crash later does not bring back this older state in place of the one the jobs reached.
//
// Files are written whole or not at all: each goes to a temporary name, is synced, and is
// renamed into place, the manifest last; the directory is synced after. State files carry the
// snapshot's time in their names, so a snapshot written over an older one never overwrites a
// file the older manifest still names before the new manifest is in place.

namespace {

namespace fs = std::filesystem;

Status Errno(std::string_view what, const std::string& path) {
  return InternalError(fmt::format("{} '{}': {}", what, path, std::strerror(errno)));
}

// Writes `bytes` to `path` by way of a temporary file, synced, then renamed.
Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".partial";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status s = Errno("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    Status s = Errno("cannot sync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Errno("cannot rename into place", path);
    ::unlink(tmp.c_str());
    return s;
  }
  return OkStatus();
}

Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? OkStatus() : Errno("cannot sync", dir);
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(fmt::format("snapshot file '{}' cannot be opened", path));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return DataLossError(fmt::format("snapshot file '{}' cannot be read", path));
  return std::move(out).str();
}

std::string Hex(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

// A name the manifest gives a file of the snapshot: in its directory, nowhere else.
bool PlainName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

// Reads session `s`'s CreateSession back from its file, checked against its digest.
Status ReadCreate(const std::string& dir, v1::SnapshotSession* s) {
  if (!PlainName(s->create_file())) {
    return DataLossError(
        fmt::format("snapshot in '{}': session {} names no valid spec file", dir, s->session_id()));
  }
  const std::string path = (fs::path(dir) / s->create_file()).string();
  auto bytes = ReadWholeFile(path);
  if (!bytes.ok()) {
    return DataLossError(
        fmt::format("snapshot spec file '{}' of session {} is missing", path, s->session_id()));
  }
  if (Sha256(*bytes) != s->create_sha256()) {
    return DataLossError(
        fmt::format("snapshot spec file '{}' is damaged: its SHA-256 is {}, the "
                    "manifest says {}",
                    path, Hex(Sha256(*bytes)), Hex(s->create_sha256())));
  }
  if (!s->mutable_create()->ParseFromString(*bytes)) {
    return DataLossError(fmt::format("snapshot spec file '{}' does not parse", path));
  }
  return OkStatus();
}

}  // namespace

Status WriteSnapshot(const std::string& dir, SnapshotData* data) {
  std::error_code ec;
  // Made for the daemon's user alone: it holds the sessions' state and allocation tokens.
  if (fs::create_directories(dir, ec)) {
    fs::permissions(dir, fs::perms::owner_all, ec);
  }
  if (ec) {
    return InternalError(
        fmt::format("cannot make the snapshot directory '{}': {}", dir, ec.message()));
  }
  v1::Snapshot& m = data->manifest;
  m.set_format_version(kSnapshotFormat);
  if (m.written_unix_ms() == 0) {
    m.set_written_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count());
  }
  if (data->states.size() != static_cast<size_t>(m.sessions_size())) {
    return InternalError("a snapshot needs one state per session");
  }
  std::set<std::string> written;
  for (int i = 0; i < m.sessions_size(); ++i) {
    v1::SnapshotSession& s = *m.mutable_sessions(i);
    // The CreateSession in a file of its own, named by its digest: written once.
    std::string create;
    if (!s.create().SerializeToString(&create)) {
      return InternalError(
          fmt::format("session {}: its CreateSession cannot be encoded", s.session_id()));
    }
    s.set_create_sha256(Sha256(create));
    s.set_create_file(fmt::format("create-{}.pb", Hex(s.create_sha256())));
    s.clear_create();
    const std::string create_path = (fs::path(dir) / s.create_file()).string();
    if (written.insert(s.create_file()).second &&
        !(fs::exists(create_path, ec) && fs::file_size(create_path, ec) == create.size())) {
      SALUS_RETURN_IF_ERROR(WriteFileAtomically(create_path, create));
    }
    const std::string& state = data->states[static_cast<size_t>(i)];
    s.clear_state_file();
    s.set_state_bytes(state.size());
    s.clear_state_sha256();
    if (s.state().empty()) continue;
    s.set_state_file(fmt::format("state-{}-{}.bin", m.written_unix_ms(), s.session_id()));
    s.set_state_sha256(Sha256(state));
    SALUS_RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir) / s.state_file()).string(), state));
    written.insert(s.state_file());
  }
  v1::SnapshotFile file;
  if (!m.SerializeToString(file.mutable_manifest())) {
    return InternalError("the snapshot's manifest cannot be encoded");
  }
  file.set_sha256(Sha256(file.manifest()));
  SALUS_RETURN_IF_ERROR(
      WriteFileAtomically((fs::path(dir) / kSnapshotManifest).string(), file.SerializeAsString()));
  SALUS_RETURN_IF_ERROR(SyncDirectory(dir));
  // The older snapshots' files that nothing names any more.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if ((name.rfind("state-", 0) == 0 || name.rfind("create-", 0) == 0) &&
        written.count(name) == 0) {
      fs::remove(e.path(), ec);
    }
  }
  return OkStatus();
}

bool HasSnapshot(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kSnapshotManifest, ec);
}

StatusOr<SnapshotData> ReadSnapshot(const std::string& dir) {
  const std::string path = (fs::path(dir) / kSnapshotManifest).string();
  if (!HasSnapshot(dir)) return NotFoundError(fmt::format("no snapshot in '{}'", dir));
  SALUS_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  v1::SnapshotFile file;
  if (!file.ParseFromString(bytes)) {
    return DataLossError(fmt::format("snapshot manifest '{}' is damaged: it does not parse", path));
  }
  if (file.sha256() != Sha256(file.manifest())) {
    return DataLossError(
        fmt::format("snapshot manifest '{}' is damaged: its digest does not match", path));
  }
  SnapshotData data;
  if (!data.manifest.ParseFromString(file.manifest())) {
    return DataLossError(fmt::format("snapshot manifest '{}' does not parse", path));
  }
  const v1::Snapshot& m = data.manifest;
  if (m.format_version() == 0 || m.format_version() > kSnapshotFormat) {
    return FailedPreconditionError(
        fmt::format("snapshot '{}' has format {}; this daemon reads formats 1 to {}", path,
                    m.format_version(), kSnapshotFormat));
  }
  for (v1::SnapshotSession& s : *data.manifest.mutable_sessions()) {
    SALUS_RETURN_IF_ERROR(ReadCreate(dir, &s));
    uint64_t expected = 0;
    for (const v1::TensorSpec& t : s.state()) {
      auto b = TensorBytes(t);
      if (!b.ok()) {
        return DataLossError(fmt::format("snapshot '{}': session {}: {}", path, s.session_id(),
                                         b.status().message()));
      }
      expected += *b;
    }
    if (expected != s.state_bytes()) {
      return DataLossError(
          fmt::format("snapshot '{}': session {} lists {} bytes of state values but says {}", path,
                      s.session_id(), expected, s.state_bytes()));
    }
    if (s.state().empty()) {
      data.states.emplace_back();
      continue;
    }
    const std::string name = s.state_file();
    if (!PlainName(name)) {
      return DataLossError(
          fmt::format("snapshot '{}': session {} names no valid state file", path, s.session_id()));
    }
    const std::string state_path = (fs::path(dir) / name).string();
    auto state = ReadWholeFile(state_path);
    if (!state.ok()) {
      return DataLossError(fmt::format("snapshot state file '{}' of session {} is missing",
                                       state_path, s.session_id()));
    }
    if (state->size() != s.state_bytes()) {
      return DataLossError(
          fmt::format("snapshot state file '{}' has {} bytes, the manifest says {} (truncated?)",
                      state_path, state->size(), s.state_bytes()));
    }
    if (Sha256(*state) != s.state_sha256()) {
      return DataLossError(fmt::format(
          "snapshot state file '{}' is damaged: its SHA-256 is {}, the manifest says {}",
          state_path, Hex(Sha256(*state)), Hex(s.state_sha256())));
    }
    data.states.push_back(std::move(*state));
  }
  return data;
}

Status RetireSnapshot(const std::string& dir) {
  const fs::path from = fs::path(dir) / kSnapshotManifest;
  const fs::path to = fs::path(dir) / kSnapshotRestored;
  if (::rename(from.c_str(), to.c_str()) != 0) return Errno("cannot retire", from.string());
  return SyncDirectory(dir);
}

}  // namespace salus::server
