// core/layer_recipe.h's buffer structs on a Backend: each field the sizes struct lists (a count
// above zero) allocated as its kind says — an activation, fp32, or int32 indices — and released.
// The stage chunk and the MoE MLP allocate through these, so that what they hold is what the
// memory walk prices.
#pragma once

#include <cstddef>
#include <type_traits>

#include "core/layer_recipe.h"
#include "executor/runtime/backend.h"

namespace megaplan::exec {

template <typename Sizes, typename Buffers>
void allocate_buffers(Backend& backend, const Sizes& sizes, Buffers& buffers) {
  for_each_buffer(sizes, buffers, [&](const auto& size, auto& buffer) {
    if (size.count == 0) return;
    const auto n = static_cast<std::size_t>(size.count);
    using Size = std::decay_t<decltype(size)>;
    if constexpr (std::is_same_v<Size, ActivationElements>) {
      buffer = backend.allocate_activation(n);
    } else if constexpr (std::is_same_v<Size, IndexElements>) {
      buffer = backend.allocate_indices(n);
    } else {
      buffer = backend.allocate(n);
    }
  });
}

template <typename Buffers>
void release_buffers(Backend& backend, Buffers& buffers) {
  for_each_buffer(buffers, [&](auto& buffer) {
    if (buffer) backend.release(buffer);
    buffer = nullptr;
  });
}

}  // namespace megaplan::exec
