// This step's keys and values into the paged cache, row by row: cache row slots[i] = k[i], v[i] (the CPU
// backend's `index_copy_`, which took 155 us a layer for a 2,048-token prefill, most of it per-row dispatch).
#include <cstring>

#include "common.h"
#include "kernels.h"

namespace inferlab {

// k, v (N, Hkv, D) with any row stride (views of the qkv projection's output), heads and elements dense;
// caches (blocks, bs, Hkv, D) contiguous, of k's dtype; slots (N,) int64, each < blocks x bs
void kv_write(at::Tensor k, at::Tensor v, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots) {
  PROFILE("inferlab::kv_write");
  const int64_t N = k.size(0), row = k.size(1) * k.size(2), rows = k_cache.numel() / std::max<int64_t>(1, row);
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k.stride(2) == 1 && v.stride(2) == 1 &&
              k.stride(1) == k.size(2) && v.stride(1) == v.size(2), "kv_write: k, v (N, Hkv, D), dense heads");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes() &&
              k_cache.dim() == 4 && k_cache.size(2) * k_cache.size(3) == row &&
              k_cache.scalar_type() == k.scalar_type() && v_cache.scalar_type() == k.scalar_type() &&
              v.scalar_type() == k.scalar_type(), "kv_write: caches (blocks, bs, Hkv, D) of k's dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == N,
              "kv_write: one int64 slot per row");
  const int64_t* s = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < N; ++i) TORCH_CHECK(s[i] >= 0 && s[i] < rows, "kv_write: slot ", s[i], " out of range");
  const int64_t bytes = row * k.element_size(), ks = k.stride(0) * k.element_size(),
                vs = v.stride(0) * v.element_size();
  const auto *kp = static_cast<const char*>(k.data_ptr()), *vp = static_cast<const char*>(v.data_ptr());
  auto *kc = static_cast<char*>(k_cache.data_ptr()), *vc = static_cast<char*>(v_cache.data_ptr());
  at::parallel_for(0, N, std::max<int64_t>(1, (64 << 10) / bytes), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      std::memcpy(kc + s[i] * bytes, kp + i * ks, bytes);
      std::memcpy(vc + s[i] * bytes, vp + i * vs, bytes);
    }
  });
}

}  // namespace inferlab
