#pragma once

// RMSNorm with its residual add in one pass: a layer's `sum = x + delta (+ bias)` and
// `h = weight * rms_norm(sum)` as one call instead of about nine ops, each row read once.
// The arithmetic is transformers' RMSNorm and the unfused path's, rounding where they
// round: each add in the activations' type, the mean square in f32, the normalised row
// rounded to the type before the weight multiplies it. The host build (norms.cpp) is the
// CPU's path and the reference of the CUDA build (cuda/norms.cu).
//
// Torch-free and CUDA-free.
#include <cstdint>

#include "engine/paged_attention.hpp"

namespace computron::engine {

struct rms_norm_args {
  element_type type = element_type::f32;
  int64_t rows = 0;
  int64_t width = 0;
  /// [rows, width], contiguous.
  const void* x = nullptr;
  /// [rows, width], contiguous, or null (a norm alone). With it, the row normed is
  /// x + delta, then + bias where there is one (the residual stream after a block's
  /// output), and `sum` gets it.
  const void* delta = nullptr;
  void* sum = nullptr;
  /// [width], or null; only with `delta`.
  const void* bias = nullptr;
  /// [width].
  const void* weight = nullptr;
  /// [rows, width], contiguous: weight x the normalised row.
  void* out = nullptr;
  float eps = 1e-6f;
};

/// Why a call cannot run (nullptr: it can).
const char* rms_norm_refusal(const rms_norm_args& a);

/// rms_norm_refusal, and f16 (the GPU's type; CPUs run f32 and bf16).
const char* rms_norm_host_refusal(const rms_norm_args& a);

/// The host build over rows [begin, end), each independent (a caller runs ranges on
/// several threads). Only with arguments rms_norm_host_refusal accepts.
void rms_norm_host(const rms_norm_args& a, int64_t begin, int64_t end);

}  // namespace computron::engine
