/* IBV_WR_ATOMIC_WRITE on the drop-in, from C against Debian's verbs.h:
 * the device advertises it (device_cap_flags_ex bit 40, as rxe), a QP
 * takes IBV_QP_EX_WITH_ATOMIC_WRITE, ibv_wr_atomic_write and
 * ibv_post_send (8 bytes from the SGEs) store the 8 bytes and complete as
 * IBV_WC_ATOMIC_WRITE (ibv_wc_read_opcode too); other than 8 bytes is
 * EINVAL at post; a misaligned address completes with REM_INV_REQ_ERR and
 * an MR without REMOTE_WRITE with REM_ACCESS_ERR, as on rxe.
 * Prints "ALL OK" and exits 0 when every check holds. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"

#include "connect.h"

struct pair {
	struct ibv_cq_ex *cq;
	struct ibv_qp *a, *b;
	struct ibv_qp_ex *ax;
};

static int make_pair(struct ibv_context *ctx, struct ibv_pd *pd, union ibv_gid *gid,
		     struct pair *p)
{
	struct ibv_cq_init_attr_ex ca = { .cqe = 64,
					  .wc_flags = IBV_WC_STANDARD_FLAGS };
	p->cq = ibv_create_cq_ex(ctx, &ca);
	if (!p->cq)
		return -1;
	struct ibv_qp_init_attr_ex ia = {
		.send_cq = ibv_cq_ex_to_cq(p->cq),
		.recv_cq = ibv_cq_ex_to_cq(p->cq),
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 2, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE,
	};
	p->a = ibv_create_qp_ex(ctx, &ia);
	CHECK(p->a != NULL, "create_qp_ex with IBV_QP_EX_WITH_ATOMIC_WRITE: errno %d", errno);
	p->b = ibv_create_qp_ex(ctx, &ia);
	if (!p->a || !p->b)
		return -1;
	p->ax = ibv_qp_to_qp_ex(p->a);
	if (!p->ax || connect_qp(p->a, p->b->qp_num, gid) ||
	    connect_qp(p->b, p->a->qp_num, gid))
		return -1;
	return 0;
}

/* The next completion of `cq`: its wr_id, status and opcode. */
static int next_wc(struct ibv_cq_ex *cq, uint64_t *wr_id, int *status, int *opcode)
{
	struct ibv_poll_cq_attr pa = { 0 };
	for (long spins = 0; spins < 50000000; spins++) {
		if (ibv_start_poll(cq, &pa) == ENOENT)
			continue;
		*wr_id = cq->wr_id;
		*status = cq->status;
		*opcode = cq->status == IBV_WC_SUCCESS ? (int)ibv_wc_read_opcode(cq) : -1;
		ibv_end_poll(cq);
		return 0;
	}
	return -1;
}

int main(void)
{
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || num < 1)
		return 1;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		return 1;
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0, "query_device_ex");
	CHECK(dx.device_cap_flags_ex & (1ULL << 40),
	      "IB_UVERBS_DEVICE_ATOMIC_WRITE not set: %#llx",
	      (unsigned long long)dx.device_cap_flags_ex);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "gid");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	uint64_t *buf = aligned_alloc(64, 4096);
	memset(buf, 0, 4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(pd && mr, "pd, mr");
	struct pair p;
	CHECK(make_pair(ctx, pd, &gid, &p) == 0, "pair");
	CHECK(p.ax->wr_atomic_write != NULL, "wr_atomic_write filled in");

	uint64_t wr_id;
	int status, opcode;
	/* ibv_wr_atomic_write: the 8 bytes at the pointer, copied at the call. */
	uint64_t value = 0x1122334455667788ULL;
	ibv_wr_start(p.ax);
	p.ax->wr_id = 1;
	p.ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(p.ax, mr->rkey, (uintptr_t)&buf[8], &value);
	value = 0; /* reused at once: the WR has its copy */
	CHECK(ibv_wr_complete(p.ax) == 0, "wr_complete");
	CHECK(next_wc(p.cq, &wr_id, &status, &opcode) == 0, "a completion");
	CHECK(wr_id == 1 && status == IBV_WC_SUCCESS && opcode == IBV_WC_ATOMIC_WRITE,
	      "wr_id %llu status %d opcode %d", (unsigned long long)wr_id, status, opcode);
	CHECK(buf[8] == 0x1122334455667788ULL, "stored %#llx", (unsigned long long)buf[8]);

	/* ibv_post_send: the 8 bytes the SGEs name (here two of 4). */
	buf[100] = 0xa1a2a3a4a5a6a7a8ULL;
	struct ibv_sge two[2] = {
		{ .addr = (uintptr_t)&buf[100], .length = 4, .lkey = mr->lkey },
		{ .addr = (uintptr_t)&buf[100] + 4, .length = 4, .lkey = mr->lkey },
	};
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = two, .num_sge = 2,
				  .opcode = IBV_WR_ATOMIC_WRITE,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = (uintptr_t)&buf[9],
					       .rkey = mr->rkey } };
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(p.a, &wr, &bad) == 0, "post_send ATOMIC_WRITE");
	CHECK(next_wc(p.cq, &wr_id, &status, &opcode) == 0, "a completion");
	CHECK(wr_id == 2 && status == IBV_WC_SUCCESS && opcode == IBV_WC_ATOMIC_WRITE,
	      "wr_id %llu status %d opcode %d", (unsigned long long)wr_id, status, opcode);
	CHECK(buf[9] == 0xa1a2a3a4a5a6a7a8ULL, "stored %#llx", (unsigned long long)buf[9]);

	/* Other than 8 bytes: EINVAL at post, bad_wr at it. */
	wr.num_sge = 1;
	bad = NULL;
	CHECK(ibv_post_send(p.a, &wr, &bad) == EINVAL && bad == &wr, "4 bytes");
	two[0].length = 16;
	bad = NULL;
	CHECK(ibv_post_send(p.a, &wr, &bad) == EINVAL && bad == &wr, "16 bytes");

	/* Misaligned: the responder refuses it, REM_INV_REQ_ERR (as rxe). */
	value = 7;
	ibv_wr_start(p.ax);
	p.ax->wr_id = 3;
	p.ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(p.ax, mr->rkey, (uintptr_t)&buf[10] + 4, &value);
	CHECK(ibv_wr_complete(p.ax) == 0, "wr_complete");
	CHECK(next_wc(p.cq, &wr_id, &status, &opcode) == 0, "a completion");
	CHECK(wr_id == 3 && status == IBV_WC_REM_INV_REQ_ERR, "misaligned: status %d", status);
	CHECK(buf[10] == 0 && buf[11] == 0, "nothing stored");

	/* An MR without REMOTE_WRITE (REMOTE_ATOMIC is not what it needs):
	 * REM_ACCESS_ERR. */
	struct ibv_mr *no_write = ibv_reg_mr(pd, &buf[256], 1024,
					     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	struct pair q;
	CHECK(no_write && make_pair(ctx, pd, &gid, &q) == 0, "second pair");
	ibv_wr_start(q.ax);
	q.ax->wr_id = 4;
	q.ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(q.ax, no_write->rkey, (uintptr_t)&buf[256], &value);
	CHECK(ibv_wr_complete(q.ax) == 0, "wr_complete");
	CHECK(next_wc(q.cq, &wr_id, &status, &opcode) == 0, "a completion");
	CHECK(wr_id == 4 && status == IBV_WC_REM_ACCESS_ERR, "no REMOTE_WRITE: status %d",
	      status);
	CHECK(buf[256] == 0, "nothing stored");

	/* A QP made without the flag has no wr_atomic_write to call; one with
	 * an unknown send op is still EOPNOTSUPP. */
	struct ibv_qp_init_attr_ex bad_ops = {
		.send_cq = ibv_cq_ex_to_cq(p.cq),
		.recv_cq = ibv_cq_ex_to_cq(p.cq),
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_TSO,
	};
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &bad_ops) == NULL && errno == EOPNOTSUPP,
	      "TSO: errno %d", errno);

	CHECK(ibv_destroy_qp(p.a) == 0 && ibv_destroy_qp(p.b) == 0, "destroy");
	CHECK(ibv_destroy_qp(q.a) == 0 && ibv_destroy_qp(q.b) == 0, "destroy");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(p.cq)) == 0 &&
		      ibv_destroy_cq(ibv_cq_ex_to_cq(q.cq)) == 0,
	      "destroy cqs");
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(no_write) == 0, "dereg");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc");
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(buf);
	if (failures) {
		fprintf(stderr, "%d checks failed\n", failures);
		return 1;
	}
	printf("ALL OK\n");
	return 0;
}
