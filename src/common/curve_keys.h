// CURVE keys as text: the 40-character Z85 form of a 32-byte key, as ZeroMQ writes it.
//
// A key is given either inline or as the path of a file holding it. A key file may hold
// comment lines (starting with '#') and whitespace around the key; nothing else. Every error
// names the file or the offending text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "salus/status.h"

namespace salus {

inline constexpr size_t kCurveKeyZ85Chars = 40;

// Whether `text` is exactly one Z85-encoded 32-byte key.
bool IsZ85Key(std::string_view text);

// The key in the file at `path`.
StatusOr<std::string> ReadKeyFile(const std::string& path);

// `key_or_path` itself when it is a Z85 key, else the key in the file it names.
StatusOr<std::string> ResolveKey(const std::string& key_or_path);

// Every key in the file at `path`, one per line (an allow-list of clients).
StatusOr<std::vector<std::string>> ReadKeyList(const std::string& path);

}  // namespace salus
