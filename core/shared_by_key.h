// Values made once per key and shared by several threads: a thread asking for a key another is
// making waits for it (threads walking neighbouring items of one list often need the same key at
// once, and would otherwise both make it), and what making it threw is thrown to every asker. With
// a budget, every kept value is forgotten when one more would pass it, and a value larger than it
// is not kept (those still being made are returned to whoever waits for them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <mutex>

namespace megaplan {

template <class Key, class Value>
class SharedByKey {
 public:
  using Shared = std::shared_ptr<const Value>;
  // `cost(value)`: what a value counts against `budget`.
  explicit SharedByKey(std::size_t budget = SIZE_MAX, std::size_t (*cost)(const Value&) = nullptr)
      : budget_(budget), cost_(cost) {}

  template <class Make>
  Shared get(const Key& key, const Make& make) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (const auto found = values_.find(key); found != values_.end()) {
      const std::shared_future<Shared> made = found->second;
      lock.unlock();  // waited for without the lock
      return made.get();
    }
    std::promise<Shared> promise;
    const std::shared_future<Shared> making = promise.get_future().share();
    values_.emplace(key, making);
    lock.unlock();
    Shared value;
    try {
      value = std::make_shared<const Value>(make());
      promise.set_value(value);
    } catch (...) {
      promise.set_exception(std::current_exception());
      throw;
    }
    if (!cost_) return value;
    const std::size_t cost = cost_(*value);
    lock.lock();
    if (kept_ + cost > budget_) {
      values_.clear();
      kept_ = 0;
    }
    if (cost <= budget_) {
      values_.try_emplace(key, making);  // again, if forgotten meanwhile
      kept_ += cost;
    } else {
      values_.erase(key);
    }
    return value;
  }

 private:
  const std::size_t budget_;
  std::size_t (*const cost_)(const Value&);
  std::mutex mutex_;
  std::map<Key, std::shared_future<Shared>> values_;
  std::size_t kept_ = 0;  // the cost of the values kept
};

}  // namespace megaplan
