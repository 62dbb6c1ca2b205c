// core/rendezvous.cpp: tcp_rendezvous (core/rendezvous.h) over POSIX sockets. Every socket is
// non-blocking and owned by a Socket, which closes it on every path; every wait is a poll() that
// ends by the deadline. No threads, no signals (MSG_NOSIGNAL).
#include "core/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"

namespace normtape::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxPayload = size_t{1} << 20;  // bytes
constexpr auto kRetry = std::chrono::milliseconds(100);
constexpr int kSocketFlags = SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC;

// Owns a socket's file descriptor (-1: none) and closes it.
class Socket {
public:
    explicit Socket(int fd = -1) : fd_(fd) {}
    Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    Socket& operator=(Socket&& other) noexcept {
        if (this != &other) {
            if (fd_ >= 0) ::close(fd_);
            fd_ = std::exchange(other.fd_, -1);
        }
        return *this;
    }
    Socket(const Socket&) = delete;
    Socket& operator=(const Socket&) = delete;
    ~Socket() {
        if (fd_ >= 0) ::close(fd_);
    }
    int fd() const { return fd_; }

private:
    int fd_;
};

[[noreturn]] void throw_errno(const std::string& what, int err) {
    throw_error<DistributedError>(what, ": ", std::strerror(err));
}

// Milliseconds from now to the deadline, rounded up so that a poll() that times out ends at or after
// it; 0 once it has passed.
int ms_left(Clock::time_point deadline) {
    int64_t left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

// Waits until `fd` is ready for `events` (or has an error, which the next call on it reports).
// Returns false when the deadline passes first. Throws DistributedError if poll() fails.
bool wait_for(int fd, short events, Clock::time_point deadline, const std::string& what) {
    for (;;) {
        pollfd p{fd, events, 0};
        int n = ::poll(&p, 1, ms_left(deadline));
        if (n > 0) return true;
        if (n < 0 && errno != EINTR) throw_errno(what + ": poll", errno);
        if (n == 0 && Clock::now() >= deadline) return false;
    }
}

// Sends (or receives) exactly n bytes at `data` before the deadline; false when it passes first.
// Throws DistributedError, starting with `what`, for a socket error or a connection the other end closed.
bool transfer(int fd, void* data, size_t n, bool sending, Clock::time_point deadline, const std::string& what) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
        if (!wait_for(fd, sending ? POLLOUT : POLLIN, deadline, what)) return false;
        ssize_t done = sending ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
        if (done < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (done < 0) throw_errno(what, errno);
        if (done == 0) throw_error<DistributedError>(what, ": the connection was closed by the other end");
        p += done;
        n -= static_cast<size_t>(done);
    }
    return true;
}

// A socket listening on `port` of every interface: IPv6 that also takes IPv4, or IPv4 alone on a host
// without IPv6. Throws DistributedError if the port cannot be had (say, another process listens there).
Socket listen_on(int port, const std::string& what) {
    const int one = 1, zero = 0;
    Socket s(::socket(AF_INET6, kSocketFlags, 0));
    const bool v6 = s.fd() >= 0;
    if (!v6) s = Socket(::socket(AF_INET, kSocketFlags, 0));
    if (s.fd() < 0) throw_errno(what + ": socket", errno);
    if (::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
        throw_errno(what + ": SO_REUSEADDR", errno);
    int rc;
    if (v6) {
        if (::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) != 0)
            throw_errno(what + ": IPV6_V6ONLY", errno);
        sockaddr_in6 a{};
        a.sin6_family = AF_INET6;
        a.sin6_addr = in6addr_any;
        a.sin6_port = htons(static_cast<uint16_t>(port));
        rc = ::bind(s.fd(), reinterpret_cast<const sockaddr*>(&a), sizeof a);
    } else {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons(static_cast<uint16_t>(port));
        rc = ::bind(s.fd(), reinterpret_cast<const sockaddr*>(&a), sizeof a);
    }
    if (rc != 0) throw_errno(what + ": bind", errno);
    if (::listen(s.fd(), SOMAXCONN) != 0) throw_errno(what + ": listen", errno);
    return s;
}

// One attempt to connect to `address` before the deadline: the connected socket, or none with the
// reason in `error`. A socket that connected to itself (its port picked from the ephemeral range
// while nothing listened there) counts as a failed attempt.
Socket try_connect(const addrinfo* address, Clock::time_point deadline, std::string& error, const std::string& what) {
    auto fail = [&](const char* reason) {
        error = reason;
        return Socket();
    };
    Socket s(::socket(address->ai_family, kSocketFlags, address->ai_protocol));
    if (s.fd() < 0) return fail(std::strerror(errno));
    if (::connect(s.fd(), address->ai_addr, address->ai_addrlen) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) return fail(std::strerror(errno));
        if (!wait_for(s.fd(), POLLOUT, deadline, what)) return fail("no answer");
        int err = 0;
        socklen_t len = sizeof err;
        if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err != 0) return fail(std::strerror(err));
    }
    sockaddr_storage self{}, peer{};
    socklen_t self_len = sizeof self, peer_len = sizeof peer;
    if (::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&self), &self_len) == 0 &&
        ::getpeername(s.fd(), reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 && self_len == peer_len &&
        std::memcmp(&self, &peer, self_len) == 0)
        return fail("connected to itself");
    return s;
}

// Rank 0: takes every other rank's connection and rank, then sends each the payload.
std::string serve(int port, int world_size, const std::string& payload, double timeout_s, Clock::time_point deadline) {
    const std::string what = "tcp_rendezvous: rank 0 on port " + std::to_string(port);
    Socket listener = listen_on(port, what);
    std::vector<Socket> peers(static_cast<size_t>(world_size));  // by rank; peers[0] stays empty
    int arrived = 0;
    auto timed_out = [&]() {
        std::vector<int> missing;
        for (int r = 1; r < world_size; ++r)
            if (peers[r].fd() < 0) missing.push_back(r);
        std::string list = missing.size() == 1 ? "rank " : "ranks ";
        for (size_t i = 0; i < missing.size(); ++i) list += (i ? ", " : "") + std::to_string(missing[i]);
        throw_error<DistributedError>("tcp_rendezvous: ", list, " of ", world_size, " did not connect to port ", port,
                                      " within ", timeout_s, " s");
    };
    while (arrived < world_size - 1) {
        if (!wait_for(listener.fd(), POLLIN, deadline, what)) timed_out();
        Socket peer(::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (peer.fd() < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED))
            continue;
        if (peer.fd() < 0) throw_errno(what + ": accept", errno);
        uint32_t net = 0;
        if (!transfer(peer.fd(), &net, sizeof net, false, deadline, what + ", reading a peer's rank")) timed_out();
        const int32_t r = static_cast<int32_t>(ntohl(net));
        NT_CHECK_AS(DistributedError, r >= 1 && r < world_size, what, ": a peer sent rank ", r,
                    ", expected one in [1, ", world_size, ")");
        NT_CHECK_AS(DistributedError, peers[r].fd() < 0, what, ": two peers sent rank ", r);
        peers[r] = std::move(peer);
        ++arrived;
    }
    std::string message(sizeof(uint32_t) + payload.size(), '\0');  // length, then the bytes
    const uint32_t length = htonl(static_cast<uint32_t>(payload.size()));
    std::memcpy(message.data(), &length, sizeof length);
    std::memcpy(message.data() + sizeof length, payload.data(), payload.size());
    for (int r = 1; r < world_size; ++r) {
        const std::string to = what + ", sending the payload to rank " + std::to_string(r);
        if (!transfer(peers[r].fd(), message.data(), message.size(), true, deadline, to))
            throw_error<DistributedError>(to, ": it did not take it within ", timeout_s, " s");
    }
    return payload;
}

// Ranks 1 .. world_size - 1: connect to rank 0 (retrying until it listens), send the rank, receive the payload.
std::string join(const std::string& host, int port, int rank, int world_size, double timeout_s,
                 Clock::time_point deadline) {
    const std::string at = "rank 0 at " + host + ":" + std::to_string(port);
    const std::string what = "tcp_rendezvous: rank " + std::to_string(rank) + " of " + std::to_string(world_size);
    Socket s;
    std::string error = "no address";
    for (;;) {
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* found = nullptr;
        // The name is resolved on every try: a launcher's host name may appear only once rank 0's host is up.
        const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
        std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(rc == 0 ? found : nullptr, ::freeaddrinfo);
        if (rc != 0) error = std::string("getaddrinfo: ") + ::gai_strerror(rc);
        for (const addrinfo* a = addresses.get(); a != nullptr && s.fd() < 0; a = a->ai_next)
            s = try_connect(a, deadline, error, what);
        if (s.fd() >= 0) break;
        NT_CHECK_AS(DistributedError, Clock::now() < deadline, what, " could not reach ", at, " within ", timeout_s,
                    " s (last error: ", error, ")");
        std::this_thread::sleep_for(std::min<Clock::duration>(kRetry, deadline - Clock::now()));
    }
    const std::string talking = what + ", talking to " + at;
    auto check_answered = [&](bool answered) {
        NT_CHECK_AS(DistributedError, answered, what, " connected to ", at, ", which did not send the payload within ",
                    timeout_s, " s");
    };
    uint32_t net = htonl(static_cast<uint32_t>(rank));
    check_answered(transfer(s.fd(), &net, sizeof net, true, deadline, talking));
    check_answered(transfer(s.fd(), &net, sizeof net, false, deadline, talking));
    const uint32_t length = ntohl(net);
    NT_CHECK_AS(DistributedError, length <= kMaxPayload, talking, ": it sent a payload of ", length,
                " bytes, more than the limit of ", kMaxPayload, " (1 MiB)");
    std::string payload(length, '\0');
    check_answered(transfer(s.fd(), payload.data(), payload.size(), false, deadline, talking));
    return payload;
}

}  // namespace

std::string tcp_rendezvous(const std::string& host, int port, int rank, int world_size, const std::string& payload,
                           double timeout_s) {
    NT_CHECK(world_size >= 1, "tcp_rendezvous: expected world_size >= 1, got ", world_size);
    NT_CHECK(rank >= 0 && rank < world_size, "tcp_rendezvous: expected a rank in [0, ", world_size, "), got ", rank);
    NT_CHECK(port >= 1 && port <= 65535, "tcp_rendezvous: expected a port in [1, 65535], got ", port);
    NT_CHECK(std::isfinite(timeout_s) && timeout_s > 0,
             "tcp_rendezvous: expected a finite timeout_s > 0 (seconds), got ", timeout_s);
    NT_CHECK_AS(DistributedError, rank != 0 || payload.size() <= kMaxPayload, "tcp_rendezvous: rank 0's payload is ",
                payload.size(), " bytes, more than the limit of ", kMaxPayload, " (1 MiB)");
    if (world_size == 1) return payload;
    // A timeout beyond a year waits a year: it keeps the deadline far from the clock's overflow.
    const auto wait = std::chrono::duration<double>(std::min(timeout_s, 3.2e7));
    const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(wait);
    return rank == 0 ? serve(port, world_size, payload, timeout_s, deadline)
                     : join(host, port, rank, world_size, timeout_s, deadline);
}

}  // namespace normtape::detail
