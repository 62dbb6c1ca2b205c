// core/rendezvous.h: the TCP rendezvous of processes started by torchrun-style environment variables
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) without MPI: rank 0 hands a blob of bytes (NCCL's
// 128-byte unique id) to every other rank (Note [Starting a process group] in core/distributed.h).
// Internal: not part of include/normtape.h. Not here: the collectives themselves (core/distributed.h).
// Linux sockets; one thread; nothing is left open when it returns or throws.
#pragma once

#include <string>

namespace normtape::detail {

// tcp_rendezvous: rank 0 listens on `port` (every interface, IPv6 and IPv4, SO_REUSEADDR), accepts
// world_size - 1 connections, reads each peer's rank (int32, network order), then sends every peer
// `payload` (its length as a uint32 in network order, then the bytes). Ranks 1 .. world_size - 1
// connect to host:port (host resolved by getaddrinfo, IPv4 or IPv6; name and connection retried every
// 100 ms until the deadline, since rank 0 may not listen yet), send their rank and receive the payload.
// Every wait ends by the deadline, timeout_s seconds after the call. With world_size == 1 it returns
// at once and opens no socket. Returns the payload on every rank (rank 0 returns its own argument; the
// others ignore theirs).
// Throws DistributedError when the deadline passes: on rank 0 naming the ranks that did not connect
// ("tcp_rendezvous: ranks 1, 3 of 4 did not connect to port 29500 within 5 s"); on the others, that
// rank 0 at host:port could not be reached (with the last error: "Connection refused", or
// getaddrinfo's for a name that does not resolve) or did not send the payload in time. Also throws
// DistributedError for a socket error (with its strerror text; "bind: Address already in use" when
// another process holds the port), a peer that sends a rank out of range or twice, a connection
// closed before the payload (as when rank 0 failed), and a payload longer than 1 MiB (rank 0 checks
// its own before opening a socket). Throws Error for world_size < 1, rank outside [0, world_size),
// port outside [1, 65535], or timeout_s not a finite number > 0.
std::string tcp_rendezvous(const std::string& host, int port, int rank, int world_size, const std::string& payload,
                           double timeout_s);

}  // namespace normtape::detail
