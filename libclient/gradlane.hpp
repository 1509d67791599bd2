// libclient/gradlane.hpp — a thin, header-only C++ wrapper over gradlane.h: RAII for the
// session, std::string messages, no exceptions (every call returns a gradlane::Result).
//
// Thread rules and data-path guarantees are those of gradlane.h. Client is move-only; its
// destructor closes the session (the daemon then reclaims the arena: Tensor::data dangles).
#ifndef GRADLANE_LIBCLIENT_GRADLANE_HPP_
#define GRADLANE_LIBCLIENT_GRADLANE_HPP_

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gradlane.h"  // same directory, in the tree and once installed

namespace gradlane {

struct Result {
  int code = GL_OK;  // gl_status
  std::string message;
  bool ok() const { return code == GL_OK; }
};

struct Job {
  std::string job_id;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::vector<std::string> peers;
  std::string policy;
  std::string auth_token;
  gl_job_mode mode = GL_MODE_PS;
};

struct Tensor {
  uint32_t id = 0;
  void* data = nullptr;
  uint64_t bytes = 0;
};

class Client {
 public:
  Client() = default;
  Client(Client&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  Client& operator=(Client&& o) noexcept {
    if (this != &o) {
      Close();
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() { Close(); }

  static Result Connect(const gl_connect_options& options, Client* out) {
    gl_client* c = nullptr;
    const int s = gl_connect(&options, &c);
    if (s != GL_OK) return {s, gl_last_error(nullptr)};
    *out = Client(c);
    return {};
  }

  bool connected() const { return c_ != nullptr; }
  gl_client* get() const { return c_; }

  Result RegisterJob(const Job& job) {
    std::vector<const char*> peers;
    for (const auto& p : job.peers) peers.push_back(p.c_str());
    gl_job_info info{job.job_id.c_str(), job.rank, job.world_size,
                     peers.empty() ? nullptr : peers.data(), static_cast<uint32_t>(peers.size()),
                     job.policy.c_str(), job.auth_token.c_str()};
    return Wrap(gl_register_job_mode(c_, &info, job.mode));
  }

  Result RegisterTensor(const std::string& name, uint64_t bytes, gl_dtype dtype, int32_t priority,
                        Tensor* out) {
    out->bytes = bytes;
    return Wrap(gl_register_tensor(c_, name.c_str(), bytes, dtype, priority, &out->id, &out->data));
  }

  // A tensor in GPU memory (gl_register_device_tensor, docs/gpu.md): out->data is the device
  // pointer, where results land.
  Result RegisterDeviceTensor(const std::string& name, void* device_ptr, uint64_t bytes,
                              gl_dtype dtype, int32_t priority, Tensor* out) {
    out->bytes = bytes;
    out->data = device_ptr;
    return Wrap(gl_register_device_tensor(c_, name.c_str(), device_ptr, bytes, dtype, priority,
                                          &out->id));
  }

  // Data path: plain status codes, no strings.
  int Post(uint32_t tensor_id, int64_t iteration, uint64_t offset = 0,
           uint64_t length = GL_WHOLE_TENSOR, uint64_t user_data = 0) {
    return gl_post(c_, tensor_id, iteration, offset, length, user_data);
  }
  // gl_post_after: the range was computed on a CUDA stream that recorded `cuda_event` after it.
  int PostAfter(void* cuda_event, uint32_t tensor_id, int64_t iteration, uint64_t offset = 0,
                uint64_t length = GL_WHOLE_TENSOR, uint64_t user_data = 0) {
    return gl_post_after(c_, tensor_id, iteration, offset, length, user_data, cuda_event);
  }
  int Poll(std::span<gl_completion> out, uint32_t* count) {
    return gl_poll(c_, out.data(), static_cast<uint32_t>(out.size()), count);
  }
  int Wait(std::span<gl_completion> out, uint32_t* count, int timeout_ms) {
    return gl_wait(c_, out.data(), static_cast<uint32_t>(out.size()), count, timeout_ms);
  }

  std::string last_error() const { return c_ ? gl_last_error(c_) : gl_last_error(nullptr); }

  void Close() {
    if (c_ != nullptr) gl_close(std::exchange(c_, nullptr));
  }

 private:
  explicit Client(gl_client* c) : c_(c) {}
  Result Wrap(int s) const { return s == GL_OK ? Result{} : Result{s, gl_last_error(c_)}; }

  gl_client* c_ = nullptr;
};

}  // namespace gradlane

#endif  // GRADLANE_LIBCLIENT_GRADLANE_HPP_
