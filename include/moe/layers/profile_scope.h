// Forward latency per module kind (and layer) for the flops profiler. Off except during the
// profiled step: a Scope then costs one relaxed atomic load. Only forward passes are timed
// (ForwardPhase), so an activation-checkpoint recompute inside the backward is not counted
// twice; on CUDA each scope synchronises the device at its ends (the profiled step only).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "moe/monitor/flops_report.h"

namespace moe::layers::profile {

void start(bool sync_cuda);                 // begin recording
std::vector<monitor::ModuleTiming> stop();  // end recording; in first-seen order

class ForwardPhase {  // the model's forward of one micro-batch
 public:
  ForwardPhase();
  ~ForwardPhase();
  ForwardPhase(const ForwardPhase&) = delete;
  ForwardPhase& operator=(const ForwardPhase&) = delete;

 private:
  bool previous_;
};

class Layer {  // scopes inside belong to layer `index`
 public:
  explicit Layer(int64_t index);
  ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

 private:
  int64_t previous_;
};

class Scope {  // times one module kind ("attention", "router", ...)
 public:
  explicit Scope(const char* kind);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* kind_;
  bool on_ = false;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace moe::layers::profile
