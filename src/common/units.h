// Byte sizes as people write them: "16GiB", "512MiB", "1.5GB", "4096".
//
// Binary units (KiB, MiB, GiB, TiB, and the shorthands K, M, G, T) are powers of 1024;
// decimal units (KB, MB, GB, TB) powers of 1000. Units are case-insensitive, a space may
// separate number and unit, a bare number is bytes. Fractions are allowed when the result
// is a whole number of bytes after rounding down ("1.5KiB" = 1536).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "salus/status.h"

namespace salus {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;
inline constexpr uint64_t kTiB = 1024 * kGiB;

// InvalidArgument naming the offending string for empty, negative, malformed, unknown-unit
// or overflowing input.
StatusOr<uint64_t> ParseBytes(std::string_view text);

// The largest binary unit that keeps the value >= 1, with at most two decimals and no
// trailing zeros: 17179869184 -> "16GiB", 1610612736 -> "1.5GiB", 100 -> "100B".
std::string FormatBytes(uint64_t bytes);

}  // namespace salus
