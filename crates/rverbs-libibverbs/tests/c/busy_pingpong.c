/* Issue 13's reproducer, as a user's plain-verbs program writes it: two
 * processes (each with its own device), one RC QP each, connected with a
 * GRH (timeout 12, retry_cnt 7, rnr_retry 7). Both keep one signaled
 * 8-byte SEND outstanding and busy-poll ibv_poll_cq — no sleeping, no
 * yielding — until their own send completed and the peer's send arrived.
 * Optionally CPU hogs spin beside them, in each process.
 *
 * Any completion with an error status (RETRY_EXC_ERR above all) fails the
 * run. Each process prints its slowest iteration and "ALL OK"; the test
 * reads the device counters RVERBS_COUNTERS=1 prints at exit.
 *
 * With IDLE_POLL_MS set, each process first busy-polls its idle CQ (QPs in
 * RTS, no traffic) for that long and prints the CPU time it used, as a
 * share of the wall time: "idle poll cpu F".
 *
 * Usage: busy_pingpong [iterations [hogs per process]] */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define RECVS 32
#define SLOT 8
#define RECV_AT 64 /* receive slots follow the send buffer */
#define STALL_NS (10 * 1000000000LL) /* an iteration this long: give up */

struct peer_info {
	uint32_t qpn;
	uint32_t psn;
	union ibv_gid gid;
};

static const char *role;
/* Set by whichever process fails, so that its peer stops polling for
 * what will never come and exits (printing its counters) at once. */
static int no_shared_flag;
static volatile int *aborted = &no_shared_flag;
static volatile int hogs_stop;

static void fail(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "FAIL %s: ", role);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	*aborted = 1;
	exit(1);
}

static long long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void *hog(void *arg)
{
	(void)arg;
	while (!hogs_stop)
		;
	return NULL;
}

static void write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail("pipe write: %s", strerror(errno));
		p += n;
		len -= n;
	}
}

static void read_all(int fd, void *buf, size_t len)
{
	char *p = buf;
	while (len) {
		ssize_t n = read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			fail("pipe read: the peer went away");
		if (n < 0)
			fail("pipe read: %s", strerror(errno));
		p += n;
		len -= n;
	}
}

/* Both sides write, then read: a barrier. */
static void barrier(int rfd, int wfd)
{
	char c = 's';
	write_all(wfd, &c, 1);
	read_all(rfd, &c, 1);
}

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *buf,
		      uint64_t slot)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(buf + RECV_AT + slot * SLOT),
		.length = SLOT,
		.lkey = mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;
	int err = ibv_post_recv(qp, &wr, &bad);
	if (err)
		fail("ibv_post_recv: %s", strerror(err));
}

static void connect_qp(struct ibv_qp *qp, const struct peer_info *me,
		       const struct peer_info *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = 0,
	};
	int err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
						IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (err)
		fail("INIT: %s", strerror(err));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qpn;
	a.rq_psn = peer->psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = 0;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					    IBV_QP_MAX_DEST_RD_ATOMIC |
					    IBV_QP_MIN_RNR_TIMER);
	if (err)
		fail("RTR: %s", strerror(err));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 12;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = me->psn;
	a.max_rd_atomic = 1;
	err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
					    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (err)
		fail("RTS: %s", strerror(err));
}

static void run(int rfd, int wfd, long iters, int nhogs, uint32_t psn)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		fail("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		fail("ibv_open_device: %s", strerror(errno));
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 128, NULL, NULL, 0);
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE)
			       : NULL;
	if (!pd || !cq || !buf || !mr)
		fail("pd %p cq %p mr %p: %s", (void *)pd, (void *)cq, (void *)mr,
		     strerror(errno));
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 64,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		fail("ibv_create_qp: %s", strerror(errno));
	struct ibv_port_attr port;
	if (ibv_query_port(ctx, 1, &port) || port.state != IBV_PORT_ACTIVE)
		fail("port 1 not active");
	struct peer_info me = { .qpn = qp->qp_num, .psn = psn }, peer;
	if (ibv_query_gid(ctx, 1, 0, &me.gid))
		fail("ibv_query_gid");
	write_all(wfd, &me, sizeof me);
	read_all(rfd, &peer, sizeof peer);
	connect_qp(qp, &me, &peer);
	for (uint64_t s = 0; s < RECVS; s++)
		post_recv(qp, mr, buf, s);

	pthread_t hogs[16];
	if (nhogs > 16)
		nhogs = 16;
	for (int i = 0; i < nhogs; i++)
		if (pthread_create(&hogs[i], NULL, hog, NULL))
			fail("pthread_create");
	barrier(rfd, wfd);

	const char *idle_ms = getenv("IDLE_POLL_MS");
	if (idle_ms && atol(idle_ms) > 0) {
		struct rusage a, b;
		struct ibv_wc iwc[8];
		getrusage(RUSAGE_SELF, &a);
		long long t0 = now_ns(), span = atol(idle_ms) * 1000000LL;
		while (now_ns() - t0 < span) {
			int n = ibv_poll_cq(cq, 8, iwc);
			if (n != 0)
				fail("idle CQ polled %d", n);
		}
		getrusage(RUSAGE_SELF, &b);
		long long wall = now_ns() - t0;
		long long cpu = (b.ru_utime.tv_sec - a.ru_utime.tv_sec +
				 b.ru_stime.tv_sec - a.ru_stime.tv_sec) * 1000000000LL +
				(b.ru_utime.tv_usec - a.ru_utime.tv_usec +
				 b.ru_stime.tv_usec - a.ru_stime.tv_usec) * 1000LL;
		printf("%s: idle poll cpu %.4f\n", role, (double)cpu / (double)wall);
		barrier(rfd, wfd);
	}

	long long slowest = 0, total = 0, last_poll = 0;
	long poller_stalls = 0;
	long slowest_at = 0;
	long sent = 0, received = 0;
	for (long i = 0; i < iters; i++) {
		long long start = now_ns();
		memcpy(buf, &i, sizeof i);
		struct ibv_sge sge = {
			.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey,
		};
		struct ibv_send_wr wr = {
			.wr_id = 1000000 + i,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_SIGNALED,
		};
		struct ibv_send_wr *bad;
		int err = ibv_post_send(qp, &wr, &bad);
		if (err)
			fail("ibv_post_send %ld: %s", i, strerror(err));
		while (sent <= i || received <= i) {
			struct ibv_wc wc[8];
			/* Two polls 10 ms or more apart: the host kept this
			 * thread off the cores (a poll sleeps 1 ms at most),
			 * counted once per whole 10 ms. */
			long long t = now_ns();
			if (last_poll)
				poller_stalls += (t - last_poll) / 10000000LL;
			last_poll = t;
			int n = ibv_poll_cq(cq, 8, wc);
			if (n < 0)
				fail("ibv_poll_cq: %d", n);
			for (int k = 0; k < n; k++) {
				if (wc[k].status != IBV_WC_SUCCESS)
					fail("iteration %ld (sent %ld, received %ld): "
					     "%s completion wr_id %llu: %s (%d), "
					     "vendor_err %u, after %lld us",
					     i, sent, received,
					     wc[k].wr_id < RECVS ? "receive" : "send",
					     (unsigned long long)wc[k].wr_id,
					     ibv_wc_status_str(wc[k].status),
					     wc[k].status, wc[k].vendor_err,
					     (now_ns() - start) / 1000);
				if (wc[k].opcode & IBV_WC_RECV) {
					long got;
					memcpy(&got, buf + RECV_AT + wc[k].wr_id * SLOT,
					       sizeof got);
					if (wc[k].byte_len != 8 || got != received)
						fail("receive %ld: %u bytes, "
						     "message %ld",
						     received, wc[k].byte_len, got);
					received++;
					post_recv(qp, mr, buf, wc[k].wr_id);
				} else if (wc[k].opcode == IBV_WC_SEND &&
					   wc[k].wr_id == (uint64_t)(1000000 + sent)) {
					sent++;
				} else {
					fail("unexpected completion: opcode %d "
					     "wr_id %llu",
					     wc[k].opcode,
					     (unsigned long long)wc[k].wr_id);
				}
			}
			if (*aborted)
				fail("the peer failed (iteration %ld)", i);
			if (now_ns() - start > STALL_NS)
				fail("iteration %ld stalled for %lld s (sent %ld, "
				     "received %ld)",
				     i, STALL_NS / 1000000000LL, sent, received);
		}
		long long took = now_ns() - start;
		total += took;
		if (took > slowest) {
			slowest = took;
			slowest_at = i;
		}
	}
	hogs_stop = 1;
	for (int i = 0; i < nhogs; i++)
		pthread_join(hogs[i], NULL);
	/* Neither side tears down while the other may still wait for an
	 * ACK from it. */
	barrier(rfd, wfd);

	printf("%s: slowest %lld us at iteration %ld of %ld, mean %lld us, "
	       "%d hogs\n",
	       role, slowest / 1000, slowest_at, iters,
	       iters ? total / iters / 1000 : 0, nhogs);
	printf("%s: poller stalls %ld\n", role, poller_stalls);
	int e1 = ibv_destroy_qp(qp), e2 = ibv_destroy_cq(cq),
	    e3 = ibv_dereg_mr(mr), e4 = ibv_dealloc_pd(pd),
	    e5 = ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(buf);
	if (e1 || e2 || e3 || e4 || e5)
		fail("teardown: %d %d %d %d %d", e1, e2, e3, e4, e5);
	printf("%s: ALL OK\n", role);
}

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 1000;
	int nhogs = argc > 2 ? atoi(argv[2]) : 0;
	setvbuf(stdout, NULL, _IOLBF, 0);
	setvbuf(stderr, NULL, _IONBF, 0);
	role = "parent";
	void *shared = mmap(NULL, sizeof *aborted, PROT_READ | PROT_WRITE,
			    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED)
		fail("mmap: %s", strerror(errno));
	aborted = shared;

	int to_child[2], to_parent[2];
	if (pipe(to_child) || pipe(to_parent))
		fail("pipe: %s", strerror(errno));
	pid_t pid = fork();
	if (pid < 0)
		fail("fork: %s", strerror(errno));
	/* A backstop (in each process: alarms are not inherited) for a hang
	 * outside the polling loop's own deadline. */
	alarm(120);
	if (pid == 0) {
		role = "child";
		close(to_child[1]);
		close(to_parent[0]);
		run(to_child[0], to_parent[1], iters, nhogs, 0x2000);
		return 0;
	}
	close(to_child[0]);
	close(to_parent[1]);
	run(to_parent[0], to_child[1], iters, nhogs, 0x1000);
	int status;
	if (waitpid(pid, &status, 0) != pid)
		fail("waitpid: %s", strerror(errno));
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail("the child failed: status %#x", status);
	return 0;
}
