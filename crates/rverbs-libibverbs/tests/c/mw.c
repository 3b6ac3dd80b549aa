/* Memory windows through the C API (issue 16), as on kernel rxe:
 *  - the device advertises IBV_DEVICE_MEM_WINDOW and _TYPE_2B, max_mw > 0;
 *    ibv_alloc_mw of type 3 is NULL with errno EINVAL;
 *  - ibv_bind_mw binds a type 1 window (completion IBV_WC_BIND_MW) and
 *    gives mw->rkey the next tag (ibv_inc_rkey); a peer's RDMA WRITE
 *    through it lands inside the window though the MR has no remote
 *    rights; ibv_bind_mw of a type 2 window is EINVAL;
 *  - IBV_WR_BIND_MW (ibv_post_send) and ibv_wr_bind_mw bind a type 2
 *    window; IBV_WR_SEND_WITH_INV (and ibv_wr_send_inv) from the peer
 *    revokes it, the receive completing with IBV_WC_WITH_INV and the
 *    window's rkey in invalidated_rkey; IBV_WR_LOCAL_INV and
 *    ibv_wr_local_inv complete as IBV_WC_LOCAL_INV;
 *  - a WRITE through a revoked window fails with IBV_WC_REM_ACCESS_ERR;
 *  - binding to an MR without IBV_ACCESS_MW_BIND completes with
 *    IBV_WC_MW_BIND_ERR;
 *  - ibv_dereg_mr of an MR with a bound window is EINVAL; windows
 *    deallocate (bound or not), and the PD after them.
 * Prints "ALL OK" and exits 0 when every check holds. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"
#include "connect.h"

static struct ibv_cq *cq;

/* The next completion (10 s at most); status -1 if none came. */
static struct ibv_wc next_wc(void)
{
	struct ibv_wc wc = { .status = (enum ibv_wc_status)-1 };
	for (int i = 0; i < 10000000; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n == 1)
			return wc;
		if (n < 0)
			break;
		if (i % 1000 == 999)
			usleep(1);
	}
	wc.status = (enum ibv_wc_status)-1;
	return wc;
}

/* `from` writes `len` bytes of `src` (lkey `lkey`) at `raddr` through
 * `rkey`; the completion's status. */
static int write_through(struct ibv_qp *from, char *src, uint32_t lkey,
			 uint64_t raddr, uint32_t rkey, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = {
		.wr_id = 0x57, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(from, &wr, &bad))
		return -2;
	struct ibv_wc wc = next_wc();
	return wc.wr_id == 0x57 ? (int)wc.status : -3;
}

int main(void)
{
	alarm(30);
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct ibv_context *ctx = devs ? ibv_open_device(devs[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	if (!cq) {
		fprintf(stderr, "FAIL: open/pd/cq: errno %d\n", errno);
		return 1;
	}
	struct ibv_device_attr attr;
	CHECK(ibv_query_device(ctx, &attr) == 0, "query_device");
	CHECK(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW, "MEM_WINDOW: %#x",
	      attr.device_cap_flags);
	CHECK(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B,
	      "MEM_WINDOW_TYPE_2B: %#x", attr.device_cap_flags);
	CHECK(attr.max_mw > 0, "max_mw %d", attr.max_mw);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");

	errno = 0;
	CHECK(ibv_alloc_mw(pd, (enum ibv_mw_type)3) == NULL && errno == EINVAL,
	      "alloc_mw type 3: errno %d", errno);

	struct ibv_qp_init_attr_ex xa = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
				  IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV |
				  IBV_QP_EX_WITH_SEND_WITH_INV,
	};
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &xa);
	struct ibv_qp *b = ibv_create_qp_ex(ctx, &xa);
	CHECK(a && b, "create_qp_ex with MW send ops: errno %d", errno);
	if (!a || !b)
		return 1;
	CHECK(connect_qp(a, b->qp_num, &gid) == 0 && connect_qp(b, a->qp_num, &gid) == 0,
	      "connect");
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a), *bx = ibv_qp_to_qp_ex(b);

	char *abuf = calloc(1, 4096), *bbuf = calloc(1, 4096);
	struct ibv_mr *amr = ibv_reg_mr(pd, abuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	/* No remote rights of its own: only windows give them. */
	struct ibv_mr *bmr = ibv_reg_mr(pd, bbuf, 4096,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	CHECK(amr && bmr, "reg_mr");
	if (!amr || !bmr)
		return 1;
	uint64_t win = (uintptr_t)bbuf + 64;
	struct ibv_mw_bind_info info = {
		.mr = bmr, .addr = win, .length = 128,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};

	/* Type 1: ibv_bind_mw. */
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw1 && mw1->type == IBV_MW_TYPE_1 && mw1->pd == pd, "alloc_mw type 1: errno %d",
	      errno);
	if (!mw1)
		return 1;
	uint32_t first = mw1->rkey;
	struct ibv_mw_bind bind = { .wr_id = 0xb1, .send_flags = IBV_SEND_SIGNALED,
				    .bind_info = info };
	CHECK(ibv_bind_mw(b, mw1, &bind) == 0, "bind_mw type 1");
	struct ibv_wc wc = next_wc();
	CHECK(wc.wr_id == 0xb1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW,
	      "bind completion: id %#lx status %d opcode %d", (unsigned long)wc.wr_id,
	      wc.status, wc.opcode);
	CHECK(mw1->rkey == ibv_inc_rkey(first) && mw1->rkey != first,
	      "rkey %#x after bind, %#x before", mw1->rkey, first);
	memcpy(abuf, "window one", 10);
	CHECK(write_through(a, abuf, amr->lkey, win + 8, mw1->rkey, 10) == IBV_WC_SUCCESS,
	      "write through the type 1 window");
	CHECK(memcmp(bbuf + 72, "window one", 10) == 0, "bytes landed in the window");

	/* Type 2 by ibv_post_send. */
	struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw2 != NULL, "alloc_mw type 2: errno %d", errno);
	if (!mw2)
		return 1;
	CHECK(ibv_bind_mw(b, mw2, &bind) == EINVAL, "ibv_bind_mw of a type 2 window");
	struct ibv_send_wr wr = { .wr_id = 0xb2, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.bind_mw.mw = mw2;
	wr.bind_mw.rkey = ibv_inc_rkey(mw2->rkey);
	wr.bind_mw.bind_info = info;
	CHECK(ibv_post_send(b, &wr, &bad) == 0, "post BIND_MW");
	wc = next_wc();
	CHECK(wc.wr_id == 0xb2 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW,
	      "BIND_MW completion: status %d opcode %d", wc.status, wc.opcode);
	uint32_t key2 = wr.bind_mw.rkey;
	memcpy(abuf, "window two", 10);
	CHECK(write_through(a, abuf, amr->lkey, win, key2, 10) == IBV_WC_SUCCESS,
	      "write through the type 2 window");

	/* The peer's SEND with Invalidate revokes it. */
	struct ibv_sge rsge = { .addr = (uintptr_t)bbuf + 1024, .length = 64, .lkey = bmr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 0x77, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(b, &rwr, &rbad) == 0, "post_recv");
	struct ibv_sge ssge = { .addr = (uintptr_t)abuf, .length = 4, .lkey = amr->lkey };
	struct ibv_send_wr inv = { .wr_id = 0x51, .sg_list = &ssge, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_INV,
				   .send_flags = IBV_SEND_SIGNALED };
	inv.invalidate_rkey = key2;
	CHECK(ibv_post_send(a, &inv, &bad) == 0, "post SEND_WITH_INV");
	for (int i = 0; i < 2; i++) {
		wc = next_wc();
		if (wc.wr_id == 0x51)
			CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND,
			      "send completion: status %d", wc.status);
		else
			CHECK(wc.wr_id == 0x77 && wc.status == IBV_WC_SUCCESS &&
				      wc.opcode == IBV_WC_RECV &&
				      (wc.wc_flags & IBV_WC_WITH_INV) &&
				      !(wc.wc_flags & IBV_WC_WITH_IMM) &&
				      wc.invalidated_rkey == key2 && wc.byte_len == 4,
			      "recv: id %#lx status %d flags %#x rkey %#x (want %#x)",
			      (unsigned long)wc.wr_id, wc.status, wc.wc_flags,
			      wc.invalidated_rkey, key2);
	}

	/* Bound again with ibv_wr_bind_mw, then ibv_wr_local_inv. */
	uint32_t key3 = ibv_inc_rkey(key2);
	ibv_wr_start(bx);
	bx->wr_id = 0xb3;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(bx, mw2, key3, &info);
	CHECK(ibv_wr_complete(bx) == 0, "wr_bind_mw");
	wc = next_wc();
	CHECK(wc.wr_id == 0xb3 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW,
	      "wr_bind_mw completion: status %d", wc.status);
	CHECK(write_through(a, abuf, amr->lkey, win, key3, 4) == IBV_WC_SUCCESS,
	      "write after rebinding");
	ibv_wr_start(bx);
	bx->wr_id = 0x1a;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(bx, key3);
	CHECK(ibv_wr_complete(bx) == 0, "wr_local_inv");
	wc = next_wc();
	CHECK(wc.wr_id == 0x1a && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV,
	      "wr_local_inv completion: status %d opcode %d", wc.status, wc.opcode);

	/* And once more: bound, revoked by ibv_wr_send_inv, bound, revoked by
	 * IBV_WR_LOCAL_INV. */
	uint32_t key4 = ibv_inc_rkey(key3);
	ibv_wr_start(bx);
	bx->wr_id = 0xb4;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(bx, mw2, key4, &info);
	CHECK(ibv_wr_complete(bx) == 0, "wr_bind_mw 2");
	CHECK(next_wc().status == IBV_WC_SUCCESS, "bind 4");
	CHECK(ibv_post_recv(b, &rwr, &rbad) == 0, "post_recv 2");
	ibv_wr_start(ax);
	ax->wr_id = 0x52;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(ax, key4);
	ibv_wr_set_sge(ax, amr->lkey, (uintptr_t)abuf, 4);
	CHECK(ibv_wr_complete(ax) == 0, "wr_send_inv");
	for (int i = 0; i < 2; i++) {
		wc = next_wc();
		CHECK(wc.status == IBV_WC_SUCCESS, "wr_send_inv completion %#lx: status %d",
		      (unsigned long)wc.wr_id, wc.status);
		if (wc.wr_id == 0x77)
			CHECK((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == key4,
			      "recv 2: flags %#x rkey %#x", wc.wc_flags, wc.invalidated_rkey);
	}
	uint32_t key5 = ibv_inc_rkey(key4);
	wr.bind_mw.rkey = key5;
	/* mw2->rkey is still the key it was allocated with (IBV_WR_BIND_MW
	 * and ibv_wr_bind_mw leave it to the program): the window is found
	 * by the key's index, as mlx5 finds it. */
	CHECK(ibv_post_send(b, &wr, &bad) == 0, "post BIND_MW 2");
	CHECK(next_wc().status == IBV_WC_SUCCESS, "bind 5");
	struct ibv_send_wr linv = { .wr_id = 0x1b, .opcode = IBV_WR_LOCAL_INV,
				    .send_flags = IBV_SEND_SIGNALED };
	linv.invalidate_rkey = key5;
	CHECK(ibv_post_send(b, &linv, &bad) == 0, "post LOCAL_INV");
	wc = next_wc();
	CHECK(wc.wr_id == 0x1b && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV,
	      "LOCAL_INV completion: status %d opcode %d", wc.status, wc.opcode);

	/* An MR with a bound window stays registered. */
	errno = 0;
	CHECK(ibv_dereg_mr(bmr) == EINVAL, "dereg_mr with a bound type 1 window");

	/* The revoked window: a remote access error (and both QPs go to ERR). */
	CHECK(write_through(a, abuf, amr->lkey, win, key5, 4) == IBV_WC_REM_ACCESS_ERR,
	      "write through a revoked window");

	/* A bind to an MR without MW_BIND: MW_BIND_ERR (on a fresh QP). */
	struct ibv_qp *c = ibv_create_qp_ex(ctx, &xa);
	struct ibv_qp *d = ibv_create_qp_ex(ctx, &xa);
	CHECK(c && d && connect_qp(c, d->qp_num, &gid) == 0 &&
		      connect_qp(d, c->qp_num, &gid) == 0, "second pair");
	struct ibv_mw_bind nobind = { .wr_id = 0xbe, .send_flags = IBV_SEND_SIGNALED,
				      .bind_info = { .mr = amr, .addr = (uintptr_t)abuf,
						     .length = 64,
						     .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } };
	CHECK(ibv_bind_mw(c, mw1, &nobind) == 0, "bind_mw (to be refused)");
	for (;;) {
		wc = next_wc();
		if (wc.wr_id != 0x57 && wc.wr_id != 0x77)
			break; /* flushes of the first pair's left-overs */
	}
	CHECK(wc.wr_id == 0xbe && wc.status == IBV_WC_MW_BIND_ERR,
	      "bind without MW_BIND: id %#lx status %d", (unsigned long)wc.wr_id, wc.status);

	CHECK(ibv_dealloc_mw(mw1) == 0, "dealloc bound type 1 window");
	CHECK(ibv_dealloc_mw(mw2) == 0, "dealloc type 2 window");
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0 && ibv_destroy_qp(c) == 0 &&
		      ibv_destroy_qp(d) == 0, "destroy qps");
	CHECK(ibv_dereg_mr(bmr) == 0 && ibv_dereg_mr(amr) == 0, "dereg_mr");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy cq");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc pd");
	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(devs);
	free(abuf);
	free(bbuf);
	if (failures)
		return 1;
	printf("ALL OK\n");
	return 0;
}
