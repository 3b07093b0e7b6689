// The rendezvous over POSIX sockets. Rank 0 serves with one poll() loop over the listener and every
// open connection (no thread per peer), so a stray or silent connection never delays the others and
// the deadline is checked in exactly one place.
//
// Wire format, integers big-endian:
//   peer -> rank 0: "MGPLRDV1", rank (u64), world size (u64)                   24 bytes
//   rank 0 -> peer: "MGPLRDV1", status (u8: 0 blob, 1 refusal), length (u32), that many bytes:
//                   the blob, or the reason as text
#include "executor/comm/tcp_rendezvous.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>

#include "core/error.h"

namespace megaplan::exec {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::array<uint8_t, 8> kMagic = {'M', 'G', 'P', 'L', 'R', 'D', 'V', '1'};
constexpr size_t kHeaderBytes = 8 + 8 + 8;
constexpr size_t kReplyHeadBytes = 8 + 1 + 4;
constexpr uint8_t kStatusBlob = 0;
constexpr uint8_t kStatusRefused = 1;
// The blob is an id, not a payload; the cap keeps a garbage length from allocating gigabytes.
constexpr size_t kMaxPayloadBytes = size_t{1} << 20;

// Owns one file descriptor; closes it on destruction so no early return or throw leaks a socket.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::string duration_text(std::chrono::milliseconds duration) {
  const int64_t ms = duration.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

std::string endpoint_text(const std::string& address, int port) {
  // An IPv6 literal needs brackets, or its last group reads as the port.
  if (address.find(':') != std::string::npos) return "[" + address + "]:" + std::to_string(port);
  return address + ":" + std::to_string(port);
}

// "1, 2, 5-9": runs of three or more ranks collapse, so a world of thousands stays one line.
std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    if (j >= i + 2) {
      text += std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]);
    } else {
      text += std::to_string(ranks[i]);
      if (j == i + 1) text += ", " + std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return text;
}

void put_u64(uint8_t* out, uint64_t value) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<uint8_t>(value & 0xff);
    value >>= 8;
  }
}

uint64_t get_u64(const uint8_t* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | in[i];
  return value;
}

// Milliseconds left until `deadline`, rounded up so poll() never spins on a sub-millisecond rest.
int poll_timeout_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, std::numeric_limits<int>::max()));
}

// Waits until `fd` is ready for `events`; false when the deadline passed first.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, poll_timeout_ms(deadline));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return true;  // the next send or recv reports the error
    if (ready == 0 && Clock::now() >= deadline) return false;
  }
}

enum class Io { kDone, kClosed, kTimeout, kError };

// Non-blocking sockets throughout; these loop until all bytes moved, the peer closed, or the
// deadline. On kError, errno holds the cause.
Io send_all(int fd, const uint8_t* data, size_t size, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < size) {
    // MSG_NOSIGNAL: a peer that vanished must give EPIPE here, not kill the process with SIGPIPE.
    const ssize_t result = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (result >= 0) {
      sent += static_cast<size_t>(result);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, POLLOUT, deadline)) return Io::kTimeout;
    } else if (errno != EINTR) {
      return Io::kError;
    }
  }
  return Io::kDone;
}

Io recv_all(int fd, uint8_t* data, size_t size, Clock::time_point deadline) {
  size_t received = 0;
  while (received < size) {
    const ssize_t result = ::recv(fd, data + received, size - received, 0);
    if (result > 0) {
      received += static_cast<size_t>(result);
    } else if (result == 0) {
      return Io::kClosed;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, POLLIN, deadline)) return Io::kTimeout;
    } else if (errno != EINTR) {
      return Io::kError;
    }
  }
  return Io::kDone;
}

std::vector<uint8_t> reply_message(uint8_t status, const uint8_t* payload, size_t size) {
  std::vector<uint8_t> message(kMagic.begin(), kMagic.end());
  message.push_back(status);
  for (int shift = 24; shift >= 0; shift -= 8) {
    message.push_back(static_cast<uint8_t>((size >> shift) & 0xff));
  }
  message.insert(message.end(), payload, payload + size);
  return message;
}

// Tells a peer why it is refused. Best effort: the message is small enough for any socket buffer,
// and a peer that is already gone needs no answer.
void send_refusal(const Socket& socket, const std::string& reason) {
  const auto message = reply_message(kStatusRefused, reinterpret_cast<const uint8_t*>(reason.data()), reason.size());
  (void)send_all(socket.fd(), message.data(), message.size(), Clock::now() + std::chrono::milliseconds(100));
}

std::string peer_text(const sockaddr_storage& address, socklen_t size) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&address), size, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return endpoint_text(host, std::stoi(port));
}

// Rank 0's listening socket on every interface: IPv6 dual-stack (IPv4 peers arrive as
// ::ffff:a.b.c.d), or plain IPv4 where the host has no IPv6.
Socket listen_on(int port) {
  int last_error = 0;
  for (const int family : {AF_INET6, AF_INET}) {
    Socket socket(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!socket.valid()) {
      last_error = errno;
      continue;
    }
    const int on = 1;
    const int off = 0;
    // SO_REUSEADDR: a previous run's connections in TIME_WAIT must not keep the port for minutes.
    ::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    int bound = -1;
    if (family == AF_INET6) {
      ::setsockopt(socket.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
      sockaddr_in6 address{};
      address.sin6_family = AF_INET6;
      address.sin6_addr = in6addr_any;
      address.sin6_port = htons(static_cast<uint16_t>(port));
      bound = ::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof(address));
    } else {
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_ANY);
      address.sin_port = htons(static_cast<uint16_t>(port));
      bound = ::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof(address));
    }
    if (bound == 0 && ::listen(socket.fd(), SOMAXCONN) == 0) return socket;
    last_error = errno;
    // A port in use is in use for IPv4 too; only a missing IPv6 stack is worth the second try.
    if (last_error == EADDRINUSE || last_error == EACCES) break;
  }
  std::string rule = "rank 0 cannot listen on port " + std::to_string(port) + ": " + std::strerror(last_error);
  if (last_error == EADDRINUSE)
    rule += " (another job, or a previous run's rank 0, holds it; pick another MASTER_PORT)";
  throw SpecError("MASTER_PORT", rule);
}

// A connected rank sends nothing after its header, so readable means it closed or broke.
bool peer_gone(const Socket& socket) {
  pollfd entry{socket.fd(), POLLIN, 0};
  return ::poll(&entry, 1, 0) != 0;
}

// A connection rank 0 accepted and is still reading the header of.
struct PendingPeer {
  Socket socket;
  std::string from;
  std::array<uint8_t, kHeaderBytes> header{};
  size_t received = 0;
};

// A rank whose header was accepted; it waits for the blob.
struct ConnectedPeer {
  Socket socket;
  std::string from;
};

std::vector<uint8_t> serve_as_rank0(int64_t world_size, int port, const std::vector<uint8_t>& blob,
                                    std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  Socket listener = listen_on(port);
  std::vector<PendingPeer> pending;
  std::map<int64_t, ConnectedPeer> connected;
  std::vector<std::string> refusals;  // reasons, for the timeout message

  while (static_cast<int64_t>(connected.size()) < world_size - 1 && Clock::now() < deadline) {
    std::vector<pollfd> fds;
    fds.push_back({listener.fd(), POLLIN, 0});
    for (const auto& peer : pending) fds.push_back({peer.socket.fd(), POLLIN, 0});
    std::vector<int64_t> connected_ranks;
    for (const auto& [rank, peer] : connected) {
      // Watched too: a rank that crashes after connecting must be forgotten so it can reconnect.
      fds.push_back({peer.socket.fd(), POLLIN, 0});
      connected_ranks.push_back(rank);
    }
    const int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms(deadline));
    if (ready < 0 && errno != EINTR) {
      throw SpecError("MASTER_PORT", std::string("rank 0: poll failed: ") + std::strerror(errno));
    }
    if (ready <= 0) continue;

    // Connected ranks first (their indices follow the pending ones), before `pending` changes.
    for (size_t i = 0; i < connected_ranks.size(); ++i) {
      if (fds[1 + pending.size() + i].revents == 0) continue;
      connected.erase(connected_ranks[i]);  // readable: it closed (see peer_gone)
    }

    std::vector<PendingPeer> still_pending;
    for (size_t i = 0; i < pending.size(); ++i) {
      PendingPeer& peer = pending[i];
      if (fds[1 + i].revents == 0) {
        still_pending.push_back(std::move(peer));
        continue;
      }
      const ssize_t result =
          ::recv(peer.socket.fd(), peer.header.data() + peer.received, kHeaderBytes - peer.received, 0);
      if (result < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        still_pending.push_back(std::move(peer));
        continue;
      }
      if (result <= 0) continue;  // closed before a full header: drop it
      peer.received += static_cast<size_t>(result);
      if (peer.received < kHeaderBytes) {
        if (!std::equal(peer.header.begin(), peer.header.begin() + std::min(peer.received, kMagic.size()),
                        kMagic.begin())) {
          refusals.push_back("a connection from " + peer.from + " that is no megaplan rendezvous");
          continue;
        }
        still_pending.push_back(std::move(peer));
        continue;
      }
      if (!std::equal(kMagic.begin(), kMagic.end(), peer.header.begin())) {
        refusals.push_back("a connection from " + peer.from + " that is no megaplan rendezvous");
        continue;
      }
      const auto rank = static_cast<int64_t>(get_u64(peer.header.data() + 8));
      const auto peer_world = static_cast<int64_t>(get_u64(peer.header.data() + 16));
      std::string reason;
      if (peer_world != world_size) {
        reason = "rank " + std::to_string(rank) + " from " + peer.from + " announced world size " +
                 std::to_string(peer_world) + ", but rank 0 runs a world of " + std::to_string(world_size) +
                 " (another job on the same MASTER_PORT?)";
      } else if (rank < 1 || rank >= world_size) {
        reason = "a peer from " + peer.from + " announced rank " + std::to_string(rank) + ", outside 1.." +
                 std::to_string(world_size - 1);
      } else if (const auto found = connected.find(rank); found != connected.end() && peer_gone(found->second.socket)) {
        connected.erase(found);  // the first connection died: this is the rank coming back
      } else if (found != connected.end()) {
        reason = "rank " + std::to_string(rank) + " connected twice, from " + found->second.from + " and from " +
                 peer.from + " (two processes with one RANK?)";
      }
      if (!reason.empty()) {
        send_refusal(peer.socket, "rank 0 refused this process: " + reason);
        refusals.push_back(reason);
        continue;
      }
      connected.emplace(rank, ConnectedPeer{std::move(peer.socket), peer.from});
    }
    pending = std::move(still_pending);

    if (fds[0].revents != 0) {
      while (true) {
        sockaddr_storage from{};
        socklen_t from_size = sizeof(from);
        const int fd =
            ::accept4(listener.fd(), reinterpret_cast<sockaddr*>(&from), &from_size, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;  // EAGAIN: accepted everything queued; other errors: the peer gave up
        PendingPeer peer;
        peer.socket = Socket(fd);
        peer.from = peer_text(from, from_size);
        pending.push_back(std::move(peer));
      }
    }
  }

  if (static_cast<int64_t>(connected.size()) < world_size - 1) {
    std::vector<int64_t> missing;
    for (int64_t rank = 1; rank < world_size; ++rank) {
      if (!connected.count(rank)) missing.push_back(rank);
    }
    std::string rule = "rank(s) " + rank_list(missing) + " did not connect to rank 0 on port " + std::to_string(port) +
                       " within " + duration_text(timeout) + " (" + std::to_string(connected.size()) + " of " +
                       std::to_string(world_size - 1) + " did)";
    for (const auto& reason : refusals) rule += "; refused " + reason;
    rule += "; every rank needs the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE";
    // The connected ranks fail with the same words instead of waiting out their own timeouts.
    for (const auto& [rank, peer] : connected) send_refusal(peer.socket, rule);
    throw SpecError("MASTER_ADDR", rule);
  }

  const auto message = reply_message(kStatusBlob, blob.data(), blob.size());
  std::vector<int64_t> unreached;
  for (const auto& [rank, peer] : connected) {
    if (send_all(peer.socket.fd(), message.data(), message.size(), deadline) != Io::kDone) {
      unreached.push_back(rank);
    }
  }
  if (!unreached.empty()) {
    throw SpecError("MASTER_ADDR",
                    "rank(s) " + rank_list(unreached) + " disconnected before rank 0 could send them the id");
  }
  return blob;
}

// One non-blocking connect to `address`, waiting at most until `deadline`. Invalid socket on
// failure, with errno set.
Socket connect_once(const addrinfo& address, Clock::time_point deadline) {
  Socket socket(::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address.ai_protocol));
  if (!socket.valid()) return socket;
  if (::connect(socket.fd(), address.ai_addr, address.ai_addrlen) == 0) return socket;
  if (errno != EINPROGRESS) return Socket();
  if (!wait_ready(socket.fd(), POLLOUT, deadline)) {
    errno = ETIMEDOUT;
    return Socket();
  }
  int error = 0;
  socklen_t size = sizeof(error);
  if (::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &size) != 0) return Socket();
  if (error != 0) {
    errno = error;
    return Socket();
  }
  return socket;
}

// Connects to rank 0, retrying (rank 0 may not be listening yet) until the deadline.
Socket connect_to_rank0(const std::string& address, int port, Clock::time_point deadline,
                        std::chrono::milliseconds timeout) {
  const std::string endpoint = endpoint_text(address, port);
  const std::string service = std::to_string(port);
  std::string last_error = "no attempt";
  auto pause = std::chrono::milliseconds(10);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* resolved = nullptr;
    const int lookup = ::getaddrinfo(address.c_str(), service.c_str(), &hints, &resolved);
    if (lookup == 0) {
      std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(resolved, &::freeaddrinfo);
      for (const addrinfo* entry = resolved; entry != nullptr; entry = entry->ai_next) {
        // Each address gets at most 2 s, so a black-holed IPv6 route still leaves time for IPv4.
        const auto attempt_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(2));
        Socket socket = connect_once(*entry, attempt_deadline);
        if (socket.valid()) return socket;
        last_error = std::strerror(errno);
      }
    } else if (lookup == EAI_AGAIN) {
      last_error = ::gai_strerror(lookup);  // the resolver may come back; keep trying
    } else {
      throw SpecError("MASTER_ADDR", "cannot resolve \"" + address + "\": " + ::gai_strerror(lookup));
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      throw SpecError("MASTER_ADDR", "could not reach rank 0 at " + endpoint + " within " + duration_text(timeout) +
                                         ": " + last_error);
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

std::vector<uint8_t> receive_from_rank0(int64_t rank, int64_t world_size, const std::string& address, int port,
                                        std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  const std::string endpoint = endpoint_text(address, port);
  Socket socket = connect_to_rank0(address, port, deadline, timeout);

  std::array<uint8_t, kHeaderBytes> header{};
  std::copy(kMagic.begin(), kMagic.end(), header.begin());
  put_u64(header.data() + 8, static_cast<uint64_t>(rank));
  put_u64(header.data() + 16, static_cast<uint64_t>(world_size));
  auto fail = [&](Io result, const std::string& step) -> SpecError {
    const int error = errno;
    if (result == Io::kTimeout) {
      return SpecError("MASTER_ADDR", "rank " + std::to_string(rank) + " connected to rank 0 at " + endpoint +
                                          " but got no reply within " + duration_text(timeout) +
                                          " (rank 0 replies once all " + std::to_string(world_size) +
                                          " ranks have connected)");
    }
    if (result == Io::kClosed) {
      return SpecError("MASTER_ADDR", "rank 0 at " + endpoint + " closed the connection " + step +
                                          " (is it a megaplan rank 0 of this job?)");
    }
    return SpecError("MASTER_ADDR",
                     "talking to rank 0 at " + endpoint + " failed " + step + ": " + std::strerror(error));
  };
  if (const Io sent = send_all(socket.fd(), header.data(), header.size(), deadline); sent != Io::kDone) {
    throw fail(sent, "while this rank sent its header");
  }

  std::array<uint8_t, kReplyHeadBytes> head{};
  if (const Io got = recv_all(socket.fd(), head.data(), head.size(), deadline); got != Io::kDone) {
    throw fail(got, "before replying");
  }
  size_t size = 0;
  for (size_t i = 9; i < kReplyHeadBytes; ++i) size = (size << 8) | head[i];
  const uint8_t status = head[8];
  if (!std::equal(kMagic.begin(), kMagic.end(), head.begin()) || (status != kStatusBlob && status != kStatusRefused) ||
      size > kMaxPayloadBytes) {
    throw SpecError("MASTER_ADDR",
                    "the process at " + endpoint + " answered, but not as a megaplan rank 0 (wrong MASTER_PORT?)");
  }
  std::vector<uint8_t> payload(size);
  if (const Io got = recv_all(socket.fd(), payload.data(), payload.size(), deadline); got != Io::kDone) {
    throw fail(got, "in the middle of its reply");
  }
  if (status == kStatusRefused) throw SpecError("MASTER_ADDR", std::string(payload.begin(), payload.end()));
  return payload;
}

}  // namespace

std::vector<uint8_t> tcp_broadcast_from_rank0(int64_t rank, int64_t world_size, const std::string& address, int port,
                                              const std::vector<uint8_t>& blob_on_rank0,
                                              std::chrono::milliseconds timeout) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("tcp_broadcast_from_rank0: rank " + std::to_string(rank) + " of world " +
                                std::to_string(world_size));
  }
  if (port < 1 || port > 65535) {
    throw SpecError("MASTER_PORT", "must be a TCP port in 1..65535, got " + std::to_string(port));
  }
  if (world_size == 1) return blob_on_rank0;
  if (rank == 0) {
    if (blob_on_rank0.size() > kMaxPayloadBytes) {
      throw std::invalid_argument("tcp_broadcast_from_rank0: the blob exceeds 1 MiB");
    }
    return serve_as_rank0(world_size, port, blob_on_rank0, timeout);
  }
  return receive_from_rank0(rank, world_size, address, port, timeout);
}

}  // namespace megaplan::exec
