// tests/test_rendezvous.cpp: tcp_rendezvous (core/rendezvous.h) on 127.0.0.1, its ranks as threads of
// this process: every rank gets rank 0's payload; world_size 1 opens no socket; the timeouts of rank 0
// (naming the ranks that did not connect) and of the others; peers that send a bad rank; a port that
// is taken; the argument checks.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/rendezvous.h"

using namespace normtape;
using detail::tcp_rendezvous;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// An IPv4 socket on 127.0.0.1:port (port 0: one the system picks), listening or not; -1 if bind fails.
int bound_socket(int port, bool listening) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || (listening && ::listen(fd, 4) != 0)) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// A port that nothing listens on now: the system picks it, and the socket that had it is closed.
int free_port() {
    int fd = bound_socket(0, false);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    ::close(fd);
    return ntohs(a.sin_port);
}

// A peer that is not tcp_rendezvous: connects to 127.0.0.1:port (retrying for up to 5 s, while rank 0
// starts) and sends `rank`. Returns the connected socket, which the caller closes.
int raw_peer(int port, int32_t rank) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    for (Clock::time_point start = Clock::now(); seconds_since(start) < 5;) {
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
            uint32_t net = htonl(static_cast<uint32_t>(rank));
            REQUIRE(::send(fd, &net, sizeof net, MSG_NOSIGNAL) == sizeof net);
            return fd;
        }
        ::close(fd);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL("raw_peer: could not connect to port " << port);
    return -1;
}

// Runs rank 0 of world_size on `port` on a thread and returns what it threw ("" if nothing).
std::thread rank0_thread(int port, int world_size, double timeout_s, std::string& error) {
    return std::thread([=, &error] {
        try {
            tcp_rendezvous("127.0.0.1", port, 0, world_size, "id", timeout_s);
        } catch (const DistributedError& e) {
            error = e.what();
        }
    });
}

}  // namespace

TEST_SUITE("rendezvous") {

TEST_CASE("rendezvous: three ranks on threads all get rank 0's 128-byte payload") {
    const int port = free_port();
    std::string id(128, '\0');
    for (int i = 0; i < 128; ++i) id[i] = static_cast<char>(i * 37 + 11);  // every byte value class, zeros too
    std::vector<std::string> got(3), errors(3);
    std::vector<std::thread> threads;
    // Ranks 1 and 2 start first, so that they retry until rank 0 listens; rank 2 resolves a name.
    for (int rank : {2, 1, 0}) {
        if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(250));
        const std::string host = rank == 2 ? "localhost" : "127.0.0.1";
        threads.emplace_back([&, rank, host] {
            try {
                got[rank] = tcp_rendezvous(host, port, rank, 3, rank == 0 ? id : "ignored", 10.0);
            } catch (const std::exception& e) {
                errors[rank] = e.what();
            }
        });
    }
    for (std::thread& t : threads) t.join();
    for (int rank = 0; rank < 3; ++rank) {
        INFO("rank " << rank << ": " << errors[rank]);
        CHECK(errors[rank].empty());
        CHECK(got[rank] == id);
    }
}

TEST_CASE("rendezvous: world_size 1 returns the payload at once, opening no socket") {
    const int taken = bound_socket(0, true);  // a port already listened on: a socket would fail there
    REQUIRE(taken >= 0);
    sockaddr_in a{};
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(taken, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    const Clock::time_point start = Clock::now();
    CHECK(tcp_rendezvous("127.0.0.1", ntohs(a.sin_port), 0, 1, "payload", 5.0) == "payload");
    CHECK(tcp_rendezvous("127.0.0.1", ntohs(a.sin_port), 0, 1, "", 5.0).empty());
    CHECK(seconds_since(start) < 0.1);
    ::close(taken);
}

TEST_CASE("rendezvous: rank 0 alone times out, naming the ranks that did not connect") {
    const int port = free_port();
    const Clock::time_point start = Clock::now();
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", port, 0, 3, "id", 0.5),
                         ("tcp_rendezvous: ranks 1, 2 of 3 did not connect to port " + std::to_string(port) +
                          " within 0.5 s").c_str(),
                         DistributedError);
    const double waited = seconds_since(start);
    CHECK(waited >= 0.49);
    CHECK(waited < 5);
}

TEST_CASE("rendezvous: rank 0 names the one rank that did not connect when the others did") {
    const int port = free_port();
    std::string error;
    std::thread rank0 = rank0_thread(port, 4, 0.5, error);
    const int peer3 = raw_peer(port, 3), peer1 = raw_peer(port, 1);
    rank0.join();
    ::close(peer3);
    ::close(peer1);
    CHECK(error == "tcp_rendezvous: rank 2 of 4 did not connect to port " + std::to_string(port) + " within 0.5 s");
}

TEST_CASE("rendezvous: a rank with no rank 0 to reach times out, naming host and port") {
    const int port = free_port();
    const std::string want = "tcp_rendezvous: rank 1 of 2 could not reach rank 0 at 127.0.0.1:" +
                             std::to_string(port) + " within 0.5 s (last error: ";
    const Clock::time_point start = Clock::now();
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", port, 1, 2, "", 0.5), doctest::Contains(want.c_str()),
                         DistributedError);
    const double waited = seconds_since(start);
    CHECK(waited >= 0.49);
    CHECK(waited < 5);
}

TEST_CASE("rendezvous: a rank whose rank 0 fails hears of it before the deadline") {
    // Rank 0 of 3 refuses a peer that claims rank 7 and closes every connection: rank 1 sees the close.
    const int port = free_port();
    std::string error0, error1;
    std::thread rank0 = rank0_thread(port, 3, 10.0, error0);
    const Clock::time_point start = Clock::now();
    std::thread rank1([&] {
        try {
            tcp_rendezvous("127.0.0.1", port, 1, 3, "", 10.0);
        } catch (const DistributedError& e) {
            error1 = e.what();
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 1 first, most of the time
    const int peer = raw_peer(port, 7);
    rank0.join();
    rank1.join();
    ::close(peer);
    CHECK(error0.find("a peer sent rank 7, expected one in [1, 3)") != std::string::npos);
    CHECK(error1.find("tcp_rendezvous: rank 1 of 3") != std::string::npos);
    CHECK(seconds_since(start) < 5);
}

TEST_CASE("rendezvous: rank 0 refuses a peer that sends rank 0 or a rank twice") {
    const int port = free_port();
    std::string error;
    std::thread rank0 = rank0_thread(port, 3, 5.0, error);
    int peer = raw_peer(port, 0);
    rank0.join();
    ::close(peer);
    CHECK(error.find("a peer sent rank 0, expected one in [1, 3)") != std::string::npos);

    rank0 = rank0_thread(port, 3, 5.0, error);
    const int first = raw_peer(port, 2), second = raw_peer(port, 2);
    rank0.join();
    ::close(first);
    ::close(second);
    CHECK(error == "tcp_rendezvous: rank 0 on port " + std::to_string(port) + ": two peers sent rank 2");
}

TEST_CASE("rendezvous: rank 0 on a port another socket listens on throws, with strerror") {
    const int taken = bound_socket(0, true);
    REQUIRE(taken >= 0);
    sockaddr_in a{};
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(taken, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", ntohs(a.sin_port), 0, 2, "id", 0.5),
                         doctest::Contains(": bind: Address already in use"), DistributedError);
    ::close(taken);
}

TEST_CASE("rendezvous: bad arguments throw Error naming tcp_rendezvous") {
    const auto bad = doctest::Contains("tcp_rendezvous: expected");
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", 29500, 0, 0, "", 1.0), bad, Error);
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", 29500, -1, 2, "", 1.0), bad, Error);
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", 29500, 2, 2, "", 1.0),
                         "tcp_rendezvous: expected a rank in [0, 2), got 2", Error);
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", 0, 0, 2, "", 1.0), bad, Error);
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", 65536, 0, 2, "", 1.0),
                         "tcp_rendezvous: expected a port in [1, 65535], got 65536", Error);
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", 29500, 0, 2, "", 0.0), bad, Error);
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", 29500, 0, 2, "", -1.0), bad, Error);
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", 29500, 0, 2, "", std::nan("")), bad, Error);
    // A payload over 1 MiB on rank 0 is refused before any socket, also with world_size 1.
    CHECK_THROWS_WITH_AS(tcp_rendezvous("127.0.0.1", 29500, 0, 1, std::string((1 << 20) + 1, 'x'), 1.0),
                         doctest::Contains("more than the limit of 1048576 (1 MiB)"), DistributedError);
    CHECK(tcp_rendezvous("127.0.0.1", 29500, 0, 1, std::string(1 << 20, 'x'), 1.0).size() == (1 << 20));
}

}  // TEST_SUITE
