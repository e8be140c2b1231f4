/*
 * LD_PRELOAD shim: sets TCP_NODELAY on every TCP socket the process
 * accepts, and keeps it set when the program turns it off (hyper 0.14
 * calls set_nodelay(false) on each accepted socket, which undid a shim
 * that only wrapped accept), so that a relay which leaves Nagle's algorithm on (hyper 0.14
 * in nostr-rs-relay does) is measured as its users would get it at its
 * best, not waiting for the client's delayed ACK (about 40 ms) after each
 * small frame of an answer. The bench checks that it took: it reads
 * TCP_NODELAY off the peer's own sockets (pidfd_getfd) and prints
 * "nodelay shim loaded" when this library is mapped.
 *
 *   cc -O2 -shared -fPIC -o /tmp/nodelay.so tests/bench/nodelay.c -ldl
 *   LD_PRELOAD=/tmp/nodelay.so nostr-rs-relay --config ... &
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static void nodelay(int fd) {
    struct sockaddr_storage addr;
    socklen_t len = sizeof addr;
    int type = 0;
    socklen_t type_len = sizeof type;
    if (fd < 0 || getsockname(fd, (struct sockaddr *)&addr, &len) != 0) return;
    if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) return;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    static int (*real)(int, struct sockaddr *, socklen_t *);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    int s = real(fd, addr, len);
    nodelay(s);
    return s;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    int s = real(fd, addr, len, flags);
    nodelay(s);
    return s;
}

/* A program's own TCP_NODELAY, on or off, becomes on. */
int setsockopt(int fd, int level, int name, const void *value, socklen_t len) {
    static int (*real)(int, int, int, const void *, socklen_t);
    if (!real) real = (int (*)(int, int, int, const void *, socklen_t))dlsym(RTLD_NEXT, "setsockopt");
    static const int one = 1;
    if (level == IPPROTO_TCP && name == TCP_NODELAY) return real(fd, level, name, &one, sizeof one);
    return real(fd, level, name, value, len);
}
