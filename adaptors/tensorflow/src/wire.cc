// libsalus_tf_wire.so: the client library behind wire.h (see there).
#include "wire.h"

#include <cstring>
#include <map>

#include "salus/client.h"

namespace salus::tf {
namespace {

void SetError(const Status& s, WireError* error) {
  error->code = static_cast<int>(s.code());
  error->message = s.message();
}

class Session final : public WireSession {
 public:
  explicit Session(std::unique_ptr<client::Session> s) : s_(std::move(s)) {}
  uint64_t id() const override { return s_->id(); }
  bool admitted() const override { return s_->admitted(); }

  bool Run(const std::vector<WireFeed>& feeds, const std::vector<std::string>& fetches,
           bool state_only, std::vector<WireResult>* results, WireError* error) override {
    std::vector<client::Tensor> tensors;
    tensors.reserve(feeds.size());
    for (const WireFeed& f : feeds) {
      client::Tensor t;
      t.name = f.name;
      t.dtype = static_cast<client::DType>(f.type);
      t.shape = f.shape;
      t.data.resize(f.bytes);
      if (f.bytes > 0) std::memcpy(t.data.data(), f.data, f.bytes);
      tensors.push_back(std::move(t));
    }
    // A step's loss comes back after its forward pass (Note [Fetches before the end] in the
    // daemon's exec/executable.cc): TensorFlow's Python goes on to the next step while the
    // daemon finishes this one, and the next request follows it there.
    StatusOr<std::map<std::string, client::Tensor>> out =
        state_only ? s_->SyncState(tensors, fetches)
                   : s_->Run(tensors, fetches, /*reply_when_fetched=*/true);
    if (!out.ok()) {
      SetError(out.status(), error);
      return false;
    }
    results->clear();
    for (const std::string& name : fetches) {
      auto it = out->find(name);
      if (it == out->end()) {
        error->code = 13;  // INTERNAL
        error->message = "the daemon's reply lacks '" + name + "'";
        return false;
      }
      WireResult r;
      r.name = name;
      r.type = static_cast<WireType>(it->second.dtype);
      r.shape = it->second.shape;
      r.data = std::move(it->second.data);
      results->push_back(std::move(r));
    }
    return true;
  }

 private:
  std::unique_ptr<client::Session> s_;
};

class Client final : public WireClient {
 public:
  explicit Client(std::unique_ptr<client::Client> c) : c_(std::move(c)) {}

  std::unique_ptr<WireSession> CreateSession(const WireSessionSpec& spec,
                                             WireError* error) override {
    client::SessionOptions o;
    o.name = spec.name;
    o.mode = client::Mode::kInfer;
    o.tf_graph = spec.graph_def;
    o.outputs = spec.outputs;
    // Every session of the process is one job (a step per shape signature, evaluate, predict,
    // eager ops), which takes turns with itself: the daemon admits its sessions as one, so
    // under FIFO none waits behind the job's own (Note [Jobs] in the daemon).
    o.job = "tensorflow";
    for (const auto& [name, dims] : spec.inputs) o.inputs[name] = dims;
    StatusOr<std::unique_ptr<client::Session>> s = c_->CreateSession(o);
    if (!s.ok()) {
      SetError(s.status(), error);
      return nullptr;
    }
    return std::make_unique<Session>(std::move(s).value());
  }

 private:
  std::unique_ptr<client::Client> c_;
};

}  // namespace
}  // namespace salus::tf

extern "C" __attribute__((visibility("default"))) salus::tf::WireClient* SalusTfWireConnect(
    const char* endpoint, const char* client_name, salus::tf::WireError* error) {
  salus::client::Client::Options o;
  o.name = client_name;
  auto c = salus::client::Client::Connect(endpoint, o);
  if (!c.ok()) {
    salus::tf::SetError(c.status(), error);
    return nullptr;
  }
  return new salus::tf::Client(std::move(c).value());
}
