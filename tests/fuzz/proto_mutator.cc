// ProtoMutator (proto_mutator.h): reflection-based mutation and cross-over of protobuf messages.
#include "proto_mutator.h"

#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

// libFuzzer's own byte-level mutation, callable from a custom mutator.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace salus::fuzz {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Deeper trees are not walked: protobuf's parser refuses nesting past 100 anyway.
constexpr int kMaxDepth = 48;
// A walk stops listing sites and strings past these counts (a mutation needs one of each).
constexpr size_t kMaxSites = size_t{1} << 16;
constexpr size_t kMaxStrings = 4096;
// Strings longer than this are not offered to other fields (names are short).
constexpr size_t kMaxPooledString = 256;
// A "long string" mutation makes one of up to this many bytes.
constexpr size_t kLongString = 4096;
// libFuzzer's mutation of a string or bytes value may grow it to at most this.
constexpr size_t kMaxMutatedBytes = size_t{1} << 16;
// Tries of a whole mutation before the input is kept as it was (each result was too large).
constexpr int kTries = 4;

// proto3 strings must be valid UTF-8 (the parser refuses them otherwise).
bool NeedsUtf8(const FieldDescriptor* f) {
  return f->type() == FieldDescriptor::TYPE_STRING &&
         f->file()->syntax() == FileDescriptor::SYNTAX_PROTO3;
}

void MakeAscii(std::string* s) {
  for (char& c : *s) c = static_cast<char>(static_cast<unsigned char>(c) & 0x7f);
}

// Appends element `i` of `src`'s repeated field `f` to the same field of `dst` (which may be
// `src` itself).
void AppendElement(const Message& src, int i, const FieldDescriptor* f, Message* dst) {
  const Reflection* rs = src.GetReflection();
  const Reflection* rd = dst->GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      rd->AddInt32(dst, f, rs->GetRepeatedInt32(src, f, i));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      rd->AddInt64(dst, f, rs->GetRepeatedInt64(src, f, i));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      rd->AddUInt32(dst, f, rs->GetRepeatedUInt32(src, f, i));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      rd->AddUInt64(dst, f, rs->GetRepeatedUInt64(src, f, i));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      rd->AddFloat(dst, f, rs->GetRepeatedFloat(src, f, i));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      rd->AddDouble(dst, f, rs->GetRepeatedDouble(src, f, i));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      rd->AddBool(dst, f, rs->GetRepeatedBool(src, f, i));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      rd->AddEnumValue(dst, f, rs->GetRepeatedEnumValue(src, f, i));
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      rd->AddString(dst, f, rs->GetRepeatedString(src, f, i));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      // A copy first: `src` may be `dst`, and the element may contain `dst`.
      std::unique_ptr<Message> copy(rs->GetRepeatedMessage(src, f, i).New());
      copy->CopyFrom(rs->GetRepeatedMessage(src, f, i));
      rd->AddMessage(dst, f)->CopyFrom(*copy);
      break;
    }
  }
}

}  // namespace

void ProtoMutator::Walk(Message* msg, int depth, Census* census) {
  census->messages.push_back(msg);
  if (depth >= kMaxDepth) return;
  const Descriptor* d = msg->GetDescriptor();
  const Reflection* r = msg->GetReflection();
  for (int k = 0; k < d->field_count(); ++k) {
    const FieldDescriptor* f = d->field(k);
    if (census->sites.size() < kMaxSites) census->sites.push_back({msg, f});
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        const int n = r->FieldSize(*msg, f);
        for (int i = 0; i < n; ++i) Walk(r->MutableRepeatedMessage(msg, f, i), depth + 1, census);
      } else if (r->HasField(*msg, f)) {
        Walk(r->MutableMessage(msg, f), depth + 1, census);
      }
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING &&
               f->type() == FieldDescriptor::TYPE_STRING) {
      auto offer = [&](std::string s) {
        if (census->strings.size() < kMaxStrings && s.size() <= kMaxPooledString) {
          census->strings.push_back(std::move(s));
        }
      };
      if (f->is_repeated()) {
        const int n = r->FieldSize(*msg, f);
        for (int i = 0; i < n && census->strings.size() < kMaxStrings; ++i) {
          offer(r->GetRepeatedString(*msg, f, i));
        }
      } else if (r->HasField(*msg, f)) {
        offer(r->GetString(*msg, f));
      }
    }
  }
}

void ProtoMutator::Mutate(Message* msg) {
  const size_t changes = 1 + Below(3);
  for (size_t i = 0; i < changes; ++i) {
    // Walked again for each change: the last one may have freed what the census points to.
    Census census;
    Walk(msg, 0, &census);
    if (census.sites.empty()) return;
    MutateSite(census.sites[Below(census.sites.size())], census);
  }
}

void ProtoMutator::MutateSite(const Site& site, const Census& census) {
  Message* msg = site.msg;
  const FieldDescriptor* f = site.field;
  const Reflection* r = msg->GetReflection();
  if (f->is_repeated()) return MutateRepeated(site, census);
  if (OneIn(8)) return r->ClearField(msg, f);
  if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
    return SetScalar(msg, f, /*append=*/false, /*index=*/-1, census);
  }
  // The copy is taken first: setting a oneof member frees the other members' messages, which
  // the census may list.
  std::unique_ptr<Message> copy = CopyOfAnother(f->message_type(), nullptr, census);
  const bool was_set = r->HasField(*msg, f);
  Message* sub = r->MutableMessage(msg, f);  // sets it (and so its oneof) when it was not
  if (!was_set && OneIn(2)) return;          // an empty message
  if (copy != nullptr) {
    sub->CopyFrom(*copy);
  } else {
    sub->Clear();
  }
}

void ProtoMutator::MutateRepeated(const Site& site, const Census& census) {
  Message* msg = site.msg;
  const FieldDescriptor* f = site.field;
  const Reflection* r = msg->GetReflection();
  const int n = r->FieldSize(*msg, f);
  const bool is_message = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
  enum { kAdd, kDelete, kDuplicate, kSwap, kChange, kClear, kOps };
  int op = static_cast<int>(Below(kOps));
  if (op == kClear && !OneIn(3)) op = kAdd;  // clearing a whole list rarely helps
  if (n == 0) op = kAdd;
  switch (op) {
    case kAdd: {
      if (!is_message) return SetScalar(msg, f, /*append=*/true, -1, census);
      auto copy = OneIn(2) ? CopyOfAnother(f->message_type(), nullptr, census) : nullptr;
      Message* added = r->AddMessage(msg, f);
      if (copy != nullptr) added->CopyFrom(*copy);
      return;
    }
    case kDelete: {
      // Moved to the end, keeping the others' order, then removed.
      for (int i = static_cast<int>(Below(n)); i + 1 < n; ++i) r->SwapElements(msg, f, i, i + 1);
      return r->RemoveLast(msg, f);
    }
    case kDuplicate: {
      AppendElement(*msg, static_cast<int>(Below(n)), f, msg);
      const int to = static_cast<int>(Below(n + 1));  // and moved to a random place
      for (int i = n; i > to; --i) r->SwapElements(msg, f, i, i - 1);
      return;
    }
    case kSwap:
      return r->SwapElements(msg, f, static_cast<int>(Below(n)), static_cast<int>(Below(n)));
    case kChange: {
      const int i = static_cast<int>(Below(n));
      if (!is_message) return SetScalar(msg, f, /*append=*/false, i, census);
      auto copy = CopyOfAnother(f->message_type(), &r->GetRepeatedMessage(*msg, f, i), census);
      if (copy != nullptr) r->MutableRepeatedMessage(msg, f, i)->CopyFrom(*copy);
      return;
    }
    default:
      return r->ClearField(msg, f);
  }
}

std::unique_ptr<Message> ProtoMutator::CopyOfAnother(const Descriptor* type,
                                                     const Message* other_than,
                                                     const Census& census) {
  std::vector<const Message*> same;
  for (const Message* m : census.messages) {
    if (m != other_than && m->GetDescriptor() == type) same.push_back(m);
  }
  if (same.empty()) return nullptr;
  const Message* src = same[Below(same.size())];
  std::unique_ptr<Message> copy(src->New());
  copy->CopyFrom(*src);
  return copy;
}

void ProtoMutator::SetScalar(Message* msg, const FieldDescriptor* f, bool append, int index,
                             const Census& census) {
  const Reflection* r = msg->GetReflection();
  const bool repeated = index >= 0;
  // Each case reads the current value (the default when appending), changes it and writes it
  // back in the way the site asks: set, set element `index`, or append.
#define SALUS_SET_SCALAR(Kind, value_expr)                   \
  do {                                                       \
    if (append) {                                            \
      const auto cur = decltype(r->Get##Kind(*msg, f)){};    \
      r->Add##Kind(msg, f, value_expr);                      \
    } else if (repeated) {                                   \
      const auto cur = r->GetRepeated##Kind(*msg, f, index); \
      r->SetRepeated##Kind(msg, f, index, value_expr);       \
    } else {                                                 \
      const auto cur = r->Get##Kind(*msg, f);                \
      r->Set##Kind(msg, f, value_expr);                      \
    }                                                        \
  } while (false)
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      SALUS_SET_SCALAR(Int32, static_cast<int32_t>(Int(cur, false)));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      SALUS_SET_SCALAR(Int64, Int(cur, true));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      SALUS_SET_SCALAR(UInt32, static_cast<uint32_t>(UInt(cur, false)));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      SALUS_SET_SCALAR(UInt64, UInt(cur, true));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      SALUS_SET_SCALAR(Float, static_cast<float>(Real(cur, true)));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      SALUS_SET_SCALAR(Double, Real(cur, false));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      SALUS_SET_SCALAR(Bool, !cur);
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      // A declared value mostly; proto3's open enums also take any number.
      const auto* e = f->enum_type();
      const bool open = f->file()->syntax() == FileDescriptor::SYNTAX_PROTO3;
      auto pick = [&](int current) {
        if (open && OneIn(8)) return static_cast<int32_t>(Int(current, false));
        return e->value(static_cast<int>(Below(e->value_count())))->number();
      };
      SALUS_SET_SCALAR(EnumValue, pick(cur));
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING:
      SALUS_SET_SCALAR(String, String(cur, NeedsUtf8(f), census));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;  // not a scalar
  }
#undef SALUS_SET_SCALAR
}

int64_t ProtoMutator::Int(int64_t current, bool wide) {
  static constexpr int64_t kInteresting[] = {0,
                                             -1,
                                             1,
                                             2,
                                             3,
                                             4,
                                             7,
                                             8,
                                             16,
                                             64,
                                             255,
                                             256,
                                             1024,
                                             65536,
                                             std::numeric_limits<int32_t>::max(),
                                             std::numeric_limits<int32_t>::min(),
                                             int64_t{1} << 31,
                                             int64_t{1} << 32,
                                             int64_t{1} << 40,
                                             -(int64_t{1} << 31),
                                             std::numeric_limits<int64_t>::min(),
                                             std::numeric_limits<int64_t>::max()};
  // Unsigned arithmetic: a neighbour of the extremes wraps rather than overflowing.
  const auto u = static_cast<uint64_t>(current);
  switch (Below(5)) {
    case 0:
    case 1: {
      const size_t count = wide ? std::size(kInteresting) : 16;  // 32 bits: up to -2^31
      return kInteresting[Below(count)];
    }
    case 2:
      return static_cast<int64_t>(OneIn(2) ? u + 1 + Below(4) : u - 1 - Below(4));
    case 3:
      return static_cast<int64_t>(Below(72)) - 8;
    default:
      return static_cast<int64_t>(u ^ (uint64_t{1} << Below(wide ? 64 : 32)));
  }
}

uint64_t ProtoMutator::UInt(uint64_t current, bool wide) {
  return static_cast<uint64_t>(Int(static_cast<int64_t>(current), wide));
}

double ProtoMutator::Real(double current, bool single) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double huge =
      single ? std::numeric_limits<float>::max() : std::numeric_limits<double>::max();
  const double tiny =
      single ? std::numeric_limits<float>::denorm_min() : std::numeric_limits<double>::denorm_min();
  const double interesting[] = {0,     -0.0, 1,    -1,    0.5,  2,     1e-6, 1e30,
                                -1e30, kNaN, kInf, -kInf, huge, -huge, tiny};
  double v = 0;
  switch (Below(4)) {
    case 0:
    case 1:
      v = interesting[Below(std::size(interesting))];
      break;
    case 2:
      v = OneIn(2) ? current * 2 : current + (OneIn(2) ? 1 : -1);
      break;
    default:
      v = std::uniform_real_distribution<double>(-10, 10)(rng_);
  }
  // A float field cannot hold a larger finite double (the conversion would be undefined).
  if (single && std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max()) {
    v = std::copysign(kInf, v);
  }
  return v;
}

std::string ProtoMutator::String(const std::string& current, bool utf8, const Census& census) {
  std::string s;
  switch (Below(7)) {
    case 0:
      break;  // empty
    case 1:
      s.assign(1 + Below(kLongString), static_cast<char>('a' + Below(26)));
      break;
    case 2:
    case 3:
      if (!census.strings.empty()) {
        s = census.strings[Below(census.strings.size())];
        break;
      }
      [[fallthrough]];
    case 4:
      if (!dictionary_.empty()) {
        s = dictionary_[Below(dictionary_.size())];
        break;
      }
      [[fallthrough]];
    default: {
      // libFuzzer's byte mutations (insert, erase, flip, copy parts, its own dictionary).
      const size_t max = std::min(current.size() * 2 + 64, kMaxMutatedBytes);
      s = current;
      s.resize(std::max(max, current.size()));
      s.resize(LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(s.data()), current.size(), s.size()));
    }
  }
  if (utf8) MakeAscii(&s);
  return s;
}

void ProtoMutator::CrossOver(const Message& other, Message* msg) {
  std::unique_ptr<Message> theirs(other.New());
  theirs->CopyFrom(other);
  Census mine, their;
  Walk(msg, 0, &mine);
  Walk(theirs.get(), 0, &their);
  Message* dst = mine.messages[Below(mine.messages.size())];
  std::vector<const Message*> same;
  for (const Message* m : their.messages) {
    if (m->GetDescriptor() == dst->GetDescriptor()) same.push_back(m);
  }
  if (same.empty()) {  // the roots always match
    dst = msg;
    same.push_back(theirs.get());
  }
  const Message* src = same[Below(same.size())];
  if (dst != msg && OneIn(2)) return dst->CopyFrom(*src);
  // Elements of one of `src`'s repeated fields appended to the same field of `dst`.
  const Descriptor* d = dst->GetDescriptor();
  const Reflection* r = src->GetReflection();
  std::vector<const FieldDescriptor*> lists;
  for (int k = 0; k < d->field_count(); ++k) {
    if (d->field(k)->is_repeated() && r->FieldSize(*src, d->field(k)) > 0) {
      lists.push_back(d->field(k));
    }
  }
  if (lists.empty()) return;
  const FieldDescriptor* f = lists[Below(lists.size())];
  const int n = r->FieldSize(*src, f);
  const int first = static_cast<int>(Below(n));
  const int count = 1 + static_cast<int>(Below(n - first));
  for (int i = first; i < first + count; ++i) AppendElement(*src, i, f, dst);
}

size_t ProtoMutator::MutateSerialized(const Message& fallback, uint8_t* data, size_t size,
                                      size_t max_size) {
  std::unique_ptr<Message> parsed(fallback.New());
  if (!parsed->ParsePartialFromArray(data, static_cast<int>(size))) parsed->CopyFrom(fallback);
  for (int t = 0; t < kTries; ++t) {
    std::unique_ptr<Message> msg(parsed->New());
    msg->CopyFrom(*parsed);
    Mutate(msg.get());
    const std::string out = msg->SerializePartialAsString();
    if (out.size() <= max_size) {
      std::memcpy(data, out.data(), out.size());
      return out.size();
    }
  }
  return size;
}

size_t ProtoMutator::CrossOverSerialized(const Message& fallback, const uint8_t* data1,
                                         size_t size1, const uint8_t* data2, size_t size2,
                                         uint8_t* out, size_t max_out) {
  std::unique_ptr<Message> a(fallback.New()), b(fallback.New());
  if (!a->ParsePartialFromArray(data1, static_cast<int>(size1))) a->CopyFrom(fallback);
  if (!b->ParsePartialFromArray(data2, static_cast<int>(size2))) b->CopyFrom(fallback);
  CrossOver(*b, a.get());
  const std::string s = a->SerializePartialAsString();
  if (s.size() > max_out) return 0;
  std::memcpy(out, s.data(), s.size());
  return s.size();
}

}  // namespace salus::fuzz
