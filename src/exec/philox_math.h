// Philox-4x32-10 and TensorFlow's stateless random ops on it, shared by the CPU kernels
// (cpu_random_kernels.cc) and the CUDA kernels (cuda/tensor_ops.cu), so both devices draw the
// same bits as TensorFlow's CPU kernels (Note [Stateless random numbers]).
//
// C++17 with no project header beyond hd.h: nvcc compiles tensor_ops.cu, which includes this.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "exec/hd.h"

namespace salus::exec {

// Note [Stateless random numbers]
// TensorFlow's stateless random ops (StatelessRandomGetKeyCounter, StatelessRandomUniformV2,
// what Keras 3's Dropout draws its mask with) are Philox-4x32-10 (Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3"): a 64-bit key and a 128-bit counter give four 32-bit
// words. TensorFlow carries the key as one uint64 and the counter as two (low 32 bits first in
// each); the engine carries those uint64 as int64 of the same bits.
//   - Key and counter of a seed (s0, s1), each read as 64 bits (an int32 seed sign-extended):
//     Philox of the counter (lo s0, hi s0, lo s1, hi s1) under the fixed key
//     (0x3ec8f720, 0x02461e29) gives words m0..m3; the key is (m0, m1), the counter
//     (0, 0, m2, m3).
//   - Uniform floats: group g of four outputs is Philox of the counter plus g (a 128-bit sum)
//     under the key; element 4g + i takes word i, the last group as many words as it needs. A
//     word becomes a float in [0, 1) from its low 23 bits: 1.m - 1.
//   - Normal floats (StatelessRandomNormalV2): group g is Philox of the counter plus g, as for
//     uniform floats; words (0, 1) and (2, 3) each give two elements by the Box-Muller transform
//     (PhiloxBoxMuller, TensorFlow's arithmetic: the radius's uniform clamped to at least 1e-7,
//     the angle 2 pi u rounded from double).
//   - Truncated normal floats (StatelessTruncatedNormalV2: normal, redrawn beyond 2 standard
//     deviations): group g reads Philox words from the counter plus 256 g on (256 Philox calls
//     reserved per group), pairs of words in order through Box-Muller, keeping each result of
//     magnitude under 2 until it has four.
// So each group of four elements is independent, and both devices compute it the same way. The
// normal draws match TensorFlow's CPU bit for bit where the device's logf and sincosf are
// glibc's (the CPU); CUDA's differ from them in the last bits.

struct Philox4 {
  uint32_t w[4];
};

// Philox-4x32 with 10 rounds of `counter` under the key (k0, k1).
SALUS_HD Philox4 Philox4x32x10(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMulA = 0xD2511F53u;
  constexpr uint32_t kMulB = 0xCD9E8D57u;
  constexpr uint32_t kWeylA = 0x9E3779B9u;
  constexpr uint32_t kWeylB = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t a = static_cast<uint64_t>(kMulA) * c.w[0];
    const uint64_t b = static_cast<uint64_t>(kMulB) * c.w[2];
    Philox4 next;
    next.w[0] = static_cast<uint32_t>(b >> 32) ^ c.w[1] ^ k0;
    next.w[1] = static_cast<uint32_t>(b);
    next.w[2] = static_cast<uint32_t>(a >> 32) ^ c.w[3] ^ k1;
    next.w[3] = static_cast<uint32_t>(a);
    c = next;
    k0 += kWeylA;
    k1 += kWeylB;
  }
  return c;
}

// The counter of TensorFlow's two uint64 words (low 32 bits first).
SALUS_HD Philox4 PhiloxCounter(uint64_t lo, uint64_t hi) {
  Philox4 c;
  c.w[0] = static_cast<uint32_t>(lo);
  c.w[1] = static_cast<uint32_t>(lo >> 32);
  c.w[2] = static_cast<uint32_t>(hi);
  c.w[3] = static_cast<uint32_t>(hi >> 32);
  return c;
}

// `c` plus `n` as 128-bit integers (wrapping).
SALUS_HD Philox4 PhiloxAdd(Philox4 c, uint64_t n) {
  const uint64_t lo = (static_cast<uint64_t>(c.w[1]) << 32) | c.w[0];
  const uint64_t sum = lo + n;
  uint64_t hi = (static_cast<uint64_t>(c.w[3]) << 32) | c.w[2];
  if (sum < lo) ++hi;
  return PhiloxCounter(sum, hi);
}

// A seed word as TensorFlow reads it: 64 bits of an int64 seed, or an int32 seed (the engine's
// int64 holding it, of which the low 32 bits count) sign-extended.
SALUS_HD uint64_t PhiloxSeedWord(int64_t v, bool int32_seed) {
  if (!int32_seed) return static_cast<uint64_t>(v);
  const auto low = static_cast<uint32_t>(static_cast<uint64_t>(v));
  return (low & 0x80000000u) != 0 ? (0xffffffff00000000ull | low) : static_cast<uint64_t>(low);
}

// TensorFlow's key and counter of the seed (s0, s1): key (one uint64), counter (two).
SALUS_HD void PhiloxKeyCounterOfSeed(uint64_t s0, uint64_t s1, uint64_t* key, uint64_t* counter) {
  const Philox4 mix = Philox4x32x10(PhiloxCounter(s0, s1), 0x3ec8f720u, 0x02461e29u);
  *key = (static_cast<uint64_t>(mix.w[1]) << 32) | mix.w[0];
  counter[0] = 0;
  counter[1] = (static_cast<uint64_t>(mix.w[3]) << 32) | mix.w[2];
}

// Philox of `counter` under TensorFlow's uint64 key.
SALUS_HD Philox4 PhiloxWords(uint64_t key, Philox4 counter) {
  return Philox4x32x10(counter, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

// A word as a float in [0, 1): 1.m - 1 with the word's low 23 bits as the mantissa m.
SALUS_HD float PhiloxUniformFloat(uint32_t word) {
  const uint32_t bits = (127u << 23) | (word & 0x7fffffu);
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f - 1.0f;
}

// Elements [4g, min(4g + 4, count)) of the uniform floats of key and counter (TensorFlow's
// uint64 words) into y.
SALUS_HD void PhiloxUniformGroup(uint64_t key, uint64_t counter_lo, uint64_t counter_hi, int64_t g,
                                 int64_t count, float* y) {
  const Philox4 words =
      PhiloxWords(key, PhiloxAdd(PhiloxCounter(counter_lo, counter_hi), static_cast<uint64_t>(g)));
  const int64_t first = 4 * g;
  for (int i = 0; i < 4 && first + i < count; ++i) y[first + i] = PhiloxUniformFloat(words.w[i]);
}

// Two normal floats of two words, as TensorFlow's BoxMullerFloat computes them.
SALUS_HD void PhiloxBoxMuller(uint32_t x0, uint32_t x1, float* f0, float* f1) {
  constexpr double kPi = 3.14159265358979323846;
  float u1 = PhiloxUniformFloat(x0);
  if (u1 < 1.0e-7f) u1 = 1.0e-7f;
  const auto angle = static_cast<float>(2.0 * kPi * static_cast<double>(PhiloxUniformFloat(x1)));
  const float radius = sqrtf(-2.0f * logf(u1));
  sincosf(angle, f0, f1);
  *f0 *= radius;
  *f1 *= radius;
}

// Elements [4g, min(4g + 4, count)) of the normal floats of key and counter into y.
SALUS_HD void PhiloxNormalGroup(uint64_t key, uint64_t counter_lo, uint64_t counter_hi, int64_t g,
                                int64_t count, float* y) {
  const Philox4 words =
      PhiloxWords(key, PhiloxAdd(PhiloxCounter(counter_lo, counter_hi), static_cast<uint64_t>(g)));
  float f[4];
  PhiloxBoxMuller(words.w[0], words.w[1], &f[0], &f[1]);
  PhiloxBoxMuller(words.w[2], words.w[3], &f[2], &f[3]);
  const int64_t first = 4 * g;
  for (int i = 0; i < 4 && first + i < count; ++i) y[first + i] = f[i];
}

// Elements [4g, min(4g + 4, count)) of the truncated normal floats of key and counter into y.
SALUS_HD void PhiloxTruncatedNormalGroup(uint64_t key, uint64_t counter_lo, uint64_t counter_hi,
                                         int64_t g, int64_t count, float* y) {
  constexpr uint64_t kCallsPerGroup = 256;
  Philox4 counter =
      PhiloxAdd(PhiloxCounter(counter_lo, counter_hi), static_cast<uint64_t>(g) * kCallsPerGroup);
  float f[4];
  int have = 0;
  while (have < 4) {
    const Philox4 words = PhiloxWords(key, counter);
    counter = PhiloxAdd(counter, 1);
    for (int pair = 0; pair < 4 && have < 4; pair += 2) {
      float two[2];
      PhiloxBoxMuller(words.w[pair], words.w[pair + 1], &two[0], &two[1]);
      for (int i = 0; i < 2 && have < 4; ++i) {
        if (fabsf(two[i]) < 2.0f) f[have++] = two[i];
      }
    }
  }
  const int64_t first = 4 * g;
  for (int i = 0; i < 4 && first + i < count; ++i) y[first + i] = f[i];
}

// The distributions of the engine's stateless random ops: SalusRandomUniform, SalusRandomNormal,
// SalusRandomTruncatedNormal.
enum class PhiloxDistribution { kUniform, kNormal, kTruncatedNormal };

SALUS_HD void PhiloxGroup(PhiloxDistribution d, uint64_t key, uint64_t counter_lo,
                          uint64_t counter_hi, int64_t g, int64_t count, float* y) {
  switch (d) {
    case PhiloxDistribution::kUniform:
      PhiloxUniformGroup(key, counter_lo, counter_hi, g, count, y);
      return;
    case PhiloxDistribution::kNormal:
      PhiloxNormalGroup(key, counter_lo, counter_hi, g, count, y);
      return;
    case PhiloxDistribution::kTruncatedNormal:
      PhiloxTruncatedNormalGroup(key, counter_lo, counter_hi, g, count, y);
      return;
  }
}

}  // namespace salus::exec
