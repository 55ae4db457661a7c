// ProtoMutator: a small structure-aware mutator for protobuf messages, for libFuzzer's
// LLVMFuzzerCustomMutator and LLVMFuzzerCustomCrossOver (libprotobuf-mutator is not packaged in
// Debian 12). It works through google::protobuf::Reflection, so one class serves every message
// type a target parses.
//
// Algorithm: a mutation walks the message tree and lists every (message, field) site, every
// sub-message by type and every string value seen; it picks one site at random and applies one
// change that fits the field: a scalar becomes an interesting value (0, -1, 1, 2^31, 2^40,
// -2^63, NaN, infinities, huge), a neighbour of its value, or a random one; a string becomes
// empty, long, another string of the message (so graph edges are rewired to names that exist),
// a dictionary word, or libFuzzer's byte mutation of itself; a bytes field gets
// LLVMFuzzerMutate; a repeated field gets an element added, deleted, duplicated or two swapped;
// a message field is set (which also sets an unset oneof), cleared, or overwritten by a copy of
// another sub-message of its type; any field may be cleared. 1-3 such changes per input,
// chosen by the seed libFuzzer hands the custom mutator, so a run is reproducible.
//
// Bytes that do not parse as the message start from `fallback` (an empty or seed message).
// Results larger than libFuzzer's max_size are tried again, and the input is kept unchanged
// when no try fits.
#pragma once

#include <google/protobuf/message.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace salus::fuzz {

class ProtoMutator {
 public:
  explicit ProtoMutator(unsigned seed) : rng_(seed) {}

  // Words a string mutation may pick (names a harness knows its target looks up).
  void set_dictionary(std::vector<std::string> words) { dictionary_ = std::move(words); }

  // Applies 1-3 random changes to `msg`.
  void Mutate(google::protobuf::Message* msg);
  // Mixes `other` (a message of `msg`'s type) into `msg`: a sub-message of `msg` is replaced by
  // one of the same type from `other`, or a repeated field gets elements of `other`'s.
  void CrossOver(const google::protobuf::Message& other, google::protobuf::Message* msg);

  // LLVMFuzzerCustomMutator's work: parses `data` as `fallback`'s type (starting from
  // `fallback` when it does not parse), mutates and serializes it into `data`; returns the new
  // size, at most `max_size`.
  size_t MutateSerialized(const google::protobuf::Message& fallback, uint8_t* data, size_t size,
                          size_t max_size);
  // LLVMFuzzerCustomCrossOver's work; returns the size written to `out` (0: nothing).
  size_t CrossOverSerialized(const google::protobuf::Message& fallback, const uint8_t* data1,
                             size_t size1, const uint8_t* data2, size_t size2, uint8_t* out,
                             size_t max_out);

 private:
  struct Site {
    google::protobuf::Message* msg;
    const google::protobuf::FieldDescriptor* field;
  };
  // What one walk of the tree found.
  struct Census {
    std::vector<Site> sites;
    std::vector<google::protobuf::Message*> messages;  // every (sub-)message, root first
    std::vector<std::string> strings;                  // string values seen, deduplicated lazily
  };

  void Walk(google::protobuf::Message* msg, int depth, Census* census);
  void MutateSite(const Site& site, const Census& census);
  void MutateRepeated(const Site& site, const Census& census);
  // Sets a singular field, or appends to a repeated one when `append`.
  void SetScalar(google::protobuf::Message* msg, const google::protobuf::FieldDescriptor* f,
                 bool append, int index, const Census& census);
  // A copy of a random message of `type` in `census` other than `other_than`; null when there
  // is none. Taken before the tree changes (a change may free what `census` lists), and a
  // copy because the source may contain its destination or lie inside it.
  std::unique_ptr<google::protobuf::Message> CopyOfAnother(
      const google::protobuf::Descriptor* type, const google::protobuf::Message* other_than,
      const Census& census);

  int64_t Int(int64_t current, bool wide);
  uint64_t UInt(uint64_t current, bool wide);
  double Real(double current, bool single);
  std::string String(const std::string& current, bool utf8, const Census& census);
  size_t Below(size_t n) {
    return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_);
  }
  bool OneIn(size_t n) { return Below(n) == 0; }

  std::minstd_rand rng_;
  std::vector<std::string> dictionary_;
};

}  // namespace salus::fuzz

// Defines libFuzzer's custom mutator and cross-over hooks for a target whose inputs are
// serialized `MessageType`s, changed by the ProtoMutator that `make_mutator(seed)` returns.
#define SALUS_FUZZ_PROTO_HOOKS(MessageType, make_mutator)                                         \
  extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,          \
                                            unsigned seed) {                                      \
    return make_mutator(seed).MutateSerialized(MessageType(), data, size, max_size);              \
  }                                                                                               \
  extern "C" size_t LLVMFuzzerCustomCrossOver(const uint8_t* data1, size_t size1,                 \
                                              const uint8_t* data2, size_t size2, uint8_t* out,   \
                                              size_t max_out, unsigned seed) {                    \
    return make_mutator(seed).CrossOverSerialized(MessageType(), data1, size1, data2, size2, out, \
                                                  max_out);                                       \
  }
