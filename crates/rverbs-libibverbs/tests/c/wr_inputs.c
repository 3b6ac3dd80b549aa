/* Work request inputs are checked before they are read, as mlx5 does:
 *  (a) num_sge above the queue's max_sge is EINVAL, `*bad_wr` at that WR,
 *      without reading past the SGE array the program gave (the array ends
 *      at a guard page: a read past it crashes the test);
 *  (b) IBV_SEND_INLINE with more than max_inline_data bytes is EINVAL
 *      before a byte is copied (the data ends at a guard page);
 *  (c) a WR list longer than the queue's room, even a cyclic one
 *      (wr.next = &wr), stops at the first WR that does not fit: ENOMEM
 *      with `*bad_wr` there, as mlx5 answers once its queue is full — not
 *      a hang, not memory exhausted (alarm and RLIMIT_AS make either a
 *      failure rather than a stuck machine);
 *  (d) the same checks in the extended API (ibv_wr_*), reported by
 *      ibv_wr_complete.
 * argv[1], when given, runs one part ("a" to "d"). Prints "ALL OK"
 * and exits 0 when every check holds. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <infiniband/verbs.h>

#include "check.h"

/* `len` bytes ending right before a page that cannot be read or written. */
static void *guarded(size_t len)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	if (len > pg)
		abort();
	char *m = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED || mprotect(m + pg, pg, PROT_NONE))
		abort();
	return m + pg - len;
}

#include "connect.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static char *buf;
static union ibv_gid gid;

/* A connected loopback pair; `cap` comes back as the QPs got it. */
static void pair(struct ibv_qp_cap *cap, struct ibv_qp **a, struct ibv_qp **b)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .cap = *cap, .qp_type = IBV_QPT_RC,
	};
	*a = ibv_create_qp(pd, &ia);
	*b = ibv_create_qp(pd, &ia);
	if (!*a || !*b || connect_qp(*a, (*b)->qp_num, &gid) ||
	    connect_qp(*b, (*a)->qp_num, &gid)) {
		fprintf(stderr, "FAIL: QP pair: errno %d\n", errno);
		exit(1);
	}
	*cap = ia.cap;
}

/* An RDMA WRITE into b's half of buf. */
static struct ibv_send_wr write_wr(struct ibv_sge *sg, int num_sge)
{
	struct ibv_send_wr w = {
		.wr_id = 1, .sg_list = sg, .num_sge = num_sge,
		.opcode = IBV_WR_RDMA_WRITE,
		.wr.rdma = { .remote_addr = (uintptr_t)(buf + 4096), .rkey = mr->rkey },
	};
	return w;
}

static void part_a(void)
{
	struct ibv_qp_cap cap = { .max_send_wr = 16, .max_recv_wr = 16,
				  .max_send_sge = 2, .max_recv_sge = 2 };
	struct ibv_qp *a, *b;
	pair(&cap, &a, &b);
	struct ibv_send_wr *bad = NULL;
	struct ibv_recv_wr *rbad = NULL;

	/* max_send_sge entries ending at the guard page: posted (the last
	 * entry is where the array ends). */
	int n = (int)cap.max_send_sge;
	struct ibv_sge *sg = guarded(n * sizeof *sg);
	for (int i = 0; i < n; i++)
		sg[i] = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = 8,
					  .lkey = mr->lkey };
	struct ibv_send_wr w = write_wr(sg, n);
	CHECK(ibv_post_send(a, &w, &bad) == 0, "max_send_sge SGEs: errno %d", errno);

	/* One more, a huge count, a negative one, NULL with a count: EINVAL
	 * at the WR, the array unread past its end. */
	int counts[] = { n + 1, 1 << 30, -1 };
	for (unsigned i = 0; i < sizeof counts / sizeof *counts; i++) {
		w = write_wr(sg, counts[i]);
		bad = NULL;
		CHECK(ibv_post_send(a, &w, &bad) == EINVAL && bad == &w,
		      "send num_sge %d: bad_wr %p, want %p", counts[i], (void *)bad,
		      (void *)&w);
	}
	w = write_wr(NULL, n + 1);
	bad = NULL;
	CHECK(ibv_post_send(a, &w, &bad) == EINVAL && bad == &w, "send NULL sg_list");
	/* Behind a good WR: that one is posted, bad_wr at the second. */
	struct ibv_send_wr w2 = write_wr(sg, 1 << 30);
	w = write_wr(sg, 1);
	w.next = &w2;
	bad = NULL;
	CHECK(ibv_post_send(a, &w, &bad) == EINVAL && bad == &w2, "second WR refused");

	/* The receive queue: max_recv_sge, then one more. */
	n = (int)cap.max_recv_sge;
	struct ibv_sge *rsg = guarded(n * sizeof *rsg);
	for (int i = 0; i < n; i++)
		rsg[i] = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = 8,
					   .lkey = mr->lkey };
	struct ibv_recv_wr r = { .wr_id = 2, .sg_list = rsg, .num_sge = n };
	CHECK(ibv_post_recv(b, &r, &rbad) == 0, "max_recv_sge SGEs: errno %d", errno);
	for (unsigned i = 0; i < sizeof counts / sizeof *counts; i++) {
		r.num_sge = i == 0 ? n + 1 : counts[i];
		rbad = NULL;
		CHECK(ibv_post_recv(b, &r, &rbad) == EINVAL && rbad == &r,
		      "recv num_sge %d", r.num_sge);
	}

	/* An SRQ: its max_sge, then one more. */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(srq != NULL, "srq: errno %d", errno);
	if (srq) {
		n = (int)sa.attr.max_sge;
		struct ibv_sge *ssg = guarded(n * sizeof *ssg);
		for (int i = 0; i < n; i++)
			ssg[i] = rsg[0];
		struct ibv_recv_wr s = { .wr_id = 3, .sg_list = ssg, .num_sge = n };
		CHECK(ibv_post_srq_recv(srq, &s, &rbad) == 0, "srq max_sge: errno %d", errno);
		for (unsigned i = 0; i < sizeof counts / sizeof *counts; i++) {
			s.num_sge = i == 0 ? n + 1 : counts[i];
			rbad = NULL;
			CHECK(ibv_post_srq_recv(srq, &s, &rbad) == EINVAL && rbad == &s,
			      "srq num_sge %d", s.num_sge);
		}
		CHECK(ibv_destroy_srq(srq) == 0, "destroy srq");
	}
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy qps");
}

static void part_b(void)
{
	struct ibv_qp_cap cap = { .max_send_wr = 16, .max_recv_wr = 16,
				  .max_send_sge = 2, .max_recv_sge = 1,
				  .max_inline_data = 64 };
	struct ibv_qp *a, *b;
	pair(&cap, &a, &b);
	uint32_t max = cap.max_inline_data;
	CHECK(max >= 2, "max_inline_data %u", max);
	struct ibv_send_wr *bad = NULL;

	/* max_inline_data bytes ending at the guard page: posted (no lkey
	 * needed: the bytes are copied at post time). */
	char *data = guarded(max);
	memset(data, 'i', max);
	struct ibv_sge sg[2] = { { .addr = (uintptr_t)data, .length = max } };
	struct ibv_send_wr w = write_wr(sg, 1);
	w.send_flags = IBV_SEND_INLINE;
	CHECK(ibv_post_send(a, &w, &bad) == 0, "max_inline_data inline: errno %d", errno);

	/* One byte more, in one SGE or split over two: EINVAL before a byte
	 * is copied (a copy reads into the guard page). */
	sg[0].length = max + 1;
	bad = NULL;
	CHECK(ibv_post_send(a, &w, &bad) == EINVAL && bad == &w, "one SGE of max+1");
	sg[0] = (struct ibv_sge){ .addr = (uintptr_t)data, .length = max };
	sg[1] = (struct ibv_sge){ .addr = (uintptr_t)data, .length = 1 };
	w = write_wr(sg, 2);
	w.send_flags = IBV_SEND_INLINE;
	bad = NULL;
	CHECK(ibv_post_send(a, &w, &bad) == EINVAL && bad == &w, "two SGEs, max+1 bytes");
	/* Lengths whose 32-bit sum wraps to a small number. */
	sg[0].length = 0xffffffffu;
	sg[1].length = 2;
	bad = NULL;
	CHECK(ibv_post_send(a, &w, &bad) == EINVAL && bad == &w, "wrapping lengths");
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy qps");
}

static void part_c(void)
{
	struct ibv_qp_cap cap = { .max_send_wr = 16, .max_recv_wr = 16,
				  .max_send_sge = 1, .max_recv_sge = 1 };
	struct ibv_qp *a, *b;
	pair(&cap, &a, &b);
	struct ibv_send_wr *bad = NULL;
	struct ibv_recv_wr *rbad = NULL;

	/* A list one longer than the (empty) send queue: the WRs that fit are
	 * posted, ENOMEM at the first that does not. Zero-length unsignaled
	 * WRITEs: nothing to poll. */
	unsigned room = cap.max_send_wr;
	struct ibv_send_wr *list = calloc(room + 1, sizeof *list);
	for (unsigned i = 0; i <= room; i++) {
		list[i] = write_wr(NULL, 0);
		list[i].next = i < room ? &list[i + 1] : NULL;
	}
	CHECK(ibv_post_send(a, list, &bad) == ENOMEM && bad == &list[room],
	      "list of max_send_wr + 1: bad_wr %p, want %p", (void *)bad,
	      (void *)&list[room]);

	/* A cyclic list: ENOMEM with bad_wr at it, whatever the queue holds. */
	struct ibv_send_wr w = write_wr(NULL, 0);
	w.next = &w;
	bad = NULL;
	CHECK(ibv_post_send(a, &w, &bad) == ENOMEM && bad == &w, "cyclic send list");
	struct ibv_recv_wr r = { .wr_id = 5, .num_sge = 0 };
	r.next = &r;
	rbad = NULL;
	CHECK(ibv_post_recv(b, &r, &rbad) == ENOMEM && rbad == &r, "cyclic recv list");

	/* A QP in RESET refuses the first WR of a cyclic list: EINVAL. */
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .cap = cap,
				       .qp_type = IBV_QPT_RC };
	struct ibv_qp *fresh = ibv_create_qp(pd, &ia);
	CHECK(fresh != NULL, "qp");
	bad = NULL;
	CHECK(ibv_post_send(fresh, &w, &bad) == EINVAL && bad == &w, "cyclic send in RESET");

	/* An SRQ, and a QP taking its receives from it (its own receive queue
	 * has no room at all: EINVAL, post to the SRQ). */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(srq != NULL, "srq: errno %d", errno);
	if (srq) {
		rbad = NULL;
		CHECK(ibv_post_srq_recv(srq, &r, &rbad) == ENOMEM && rbad == &r,
		      "cyclic srq list");
		ia.srq = srq;
		struct ibv_qp *on_srq = ibv_create_qp(pd, &ia);
		CHECK(on_srq != NULL, "qp on srq: errno %d", errno);
		if (on_srq) {
			struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
			CHECK(ibv_modify_qp(on_srq, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
							   IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
			      "init");
			rbad = NULL;
			CHECK(ibv_post_recv(on_srq, &r, &rbad) == EINVAL && rbad == &r,
			      "cyclic recv on a QP with an SRQ");
			CHECK(ibv_destroy_qp(on_srq) == 0, "destroy qp on srq");
		}
		CHECK(ibv_destroy_srq(srq) == 0, "destroy srq");
	}
	CHECK(ibv_destroy_qp(fresh) == 0, "destroy fresh");
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy qps");
	free(list);
}

/* The extended API (ibv_wr_*): the same checks, reported by
 * ibv_wr_complete (none of the batch is posted). */
static void part_d(void)
{
	struct ibv_qp_init_attr_ex xa = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 2,
			 .max_recv_sge = 1, .max_inline_data = 32 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE,
	};
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &xa);
	struct ibv_qp *b = ibv_create_qp_ex(ctx, &xa);
	CHECK(a && b, "create_qp_ex: errno %d", errno);
	if (!a || !b)
		return;
	CHECK(connect_qp(a, b->qp_num, &gid) == 0 && connect_qp(b, a->qp_num, &gid) == 0,
	      "connect");
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(a);
	uint64_t raddr = (uintptr_t)(buf + 4096);

	/* max_send_sge entries ending at the guard page, then one more. */
	int n = (int)xa.cap.max_send_sge;
	struct ibv_sge *sg = guarded(n * sizeof *sg);
	for (int i = 0; i < n; i++)
		sg[i] = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = 8,
					  .lkey = mr->lkey };
	ibv_wr_start(x);
	ibv_wr_rdma_write(x, mr->rkey, raddr);
	ibv_wr_set_sge_list(x, n, sg);
	CHECK(ibv_wr_complete(x) == 0, "wr: max_send_sge SGEs");
	size_t counts[] = { n + 1, (size_t)1 << 40 };
	for (unsigned i = 0; i < 2; i++) {
		ibv_wr_start(x);
		ibv_wr_rdma_write(x, mr->rkey, raddr);
		ibv_wr_set_sge_list(x, counts[i], sg);
		CHECK(ibv_wr_complete(x) == EINVAL, "wr: %zu SGEs", counts[i]);
	}

	/* max_inline_data bytes ending at the guard page, then one more. */
	uint32_t max = xa.cap.max_inline_data;
	char *data = guarded(max);
	memset(data, 'x', max);
	ibv_wr_start(x);
	ibv_wr_rdma_write(x, mr->rkey, raddr);
	ibv_wr_set_inline_data(x, data, max);
	CHECK(ibv_wr_complete(x) == 0, "wr: max_inline_data inline");
	ibv_wr_start(x);
	ibv_wr_rdma_write(x, mr->rkey, raddr);
	ibv_wr_set_inline_data(x, data, (size_t)max + 1);
	CHECK(ibv_wr_complete(x) == EINVAL, "wr: max_inline_data + 1");
	/* A list: the second buffer overflows; the third entry is past the
	 * guard page and is not read. */
	struct ibv_data_buf *bl = guarded(2 * sizeof *bl);
	bl[0] = (struct ibv_data_buf){ .addr = data, .length = max };
	bl[1] = (struct ibv_data_buf){ .addr = data, .length = 1 };
	ibv_wr_start(x);
	ibv_wr_rdma_write(x, mr->rkey, raddr);
	ibv_wr_set_inline_data_list(x, 3, bl);
	CHECK(ibv_wr_complete(x) == EINVAL, "wr: inline list over max");

	/* A batch one longer than the send queue: ENOMEM, none posted. */
	ibv_wr_start(x);
	for (unsigned i = 0; i <= xa.cap.max_send_wr; i++) {
		ibv_wr_rdma_write(x, mr->rkey, raddr);
		ibv_wr_set_sge_list(x, 0, NULL);
	}
	CHECK(ibv_wr_complete(x) == ENOMEM, "wr: batch of max_send_wr + 1");
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy qps");
}

int main(int argc, char **argv)
{
	const char *only = argc > 1 ? argv[1] : NULL;
	/* A hang is a failure; so is a list walk that eats memory (it fails
	 * its allocation here instead of swapping the machine). */
	alarm(10);
	struct rlimit as = { 1ul << 30, 1ul << 30 };
	setrlimit(RLIMIT_AS, &as);

	int num = 0;
	struct ibv_device **devs = ibv_get_device_list(&num);
	if (!devs || num < 1) {
		fprintf(stderr, "FAIL: no device\n");
		return 1;
	}
	ctx = ibv_open_device(devs[0]);
	if (!ctx || ibv_query_gid(ctx, 1, 0, &gid)) {
		fprintf(stderr, "FAIL: open\n");
		return 1;
	}
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	buf = calloc(1, 8192);
	mr = pd ? ibv_reg_mr(pd, buf, 8192,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
		: NULL;
	if (!pd || !cq || !mr) {
		fprintf(stderr, "FAIL: pd/cq/mr: errno %d\n", errno);
		return 1;
	}
	if (!only || !strcmp(only, "a"))
		part_a();
	if (!only || !strcmp(only, "b"))
		part_b();
	if (!only || !strcmp(only, "c"))
		part_c();
	if (!only || !strcmp(only, "d"))
		part_d();

	CHECK(ibv_dereg_mr(mr) == 0 && ibv_destroy_cq(cq) == 0 &&
		      ibv_dealloc_pd(pd) == 0,
	      "teardown");
	ibv_close_device(ctx);
	ibv_free_device_list(devs);
	free(buf);
	if (failures) {
		fprintf(stderr, "%d failures\n", failures);
		return 1;
	}
	printf("ALL OK\n");
	return 0;
}
