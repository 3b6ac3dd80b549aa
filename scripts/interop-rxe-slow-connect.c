/*
 * scripts/interop-rxe-slow-connect.c — preloaded (LD_PRELOAD) into the
 * host's perftest -R clients by scripts/interop-rxe-cases when the guest is
 * the server: each rdma_connect() waits 100 ms, then is librdmacm's.
 *
 * Why: perftest 4.5's server listens for its test connection only after a
 * handshake over a first connection, which the client leaves at the same
 * moment; its REQ must come after the server's rdma_listen. Against a
 * kernel client the address and route resolution and the context set-up in
 * between are system calls; rverbs does them in user space in under a
 * millisecond, while the guest (QEMU TCG) takes several to get to its
 * rdma_listen. A REQ that comes first is rejected "invalid service ID" and
 * perftest's retry then crashes (it reuses the ids it has just destroyed).
 * The wait stands in for the kernel client's slower path; nothing else of
 * the program changes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <time.h>

struct rdma_cm_id;
struct rdma_conn_param;

typedef int (*connect_fn)(struct rdma_cm_id *, struct rdma_conn_param *);

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	static connect_fn real;
	struct timespec wait = { 0, 100 * 1000 * 1000L };

	if (!real)
		real = (connect_fn)dlsym(RTLD_NEXT, "rdma_connect");
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	while (nanosleep(&wait, &wait) && errno == EINTR)
		;
	return real(id, param);
}
