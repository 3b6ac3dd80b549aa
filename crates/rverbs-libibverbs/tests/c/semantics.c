/* C semantics of the drop-in libibverbs, checked from C against
 * Debian's <infiniband/verbs.h>: the seed man pages' sentences
 * (ibv_open_device / ibv_close_device, ibv_create_comp_channel /
 * ibv_destroy_comp_channel), completion events and their acks, the
 * pollable descriptors, and the errno conventions of error paths.
 * Prints "ALL OK" and exits 0 when every check holds. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"

#include "connect.h"

int main(void)
{
	/* ibv_fork_init before anything was registered: 0. */
	CHECK(ibv_fork_init() == 0, "fork_init first");
	int num = -1;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num >= 1, "device list %p, %d devices", (void *)list, num);
	if (!list || num < 1)
		return 1;

	/* ibv_open_device returns the context, or NULL. */
	errno = 0;
	CHECK(ibv_open_device(NULL) == NULL && errno == EINVAL, "errno %d", errno);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "open failed: %d", errno);
	if (!ctx)
		return 1;
	CHECK(ctx->device == list[0], "context's device");
	CHECK(ctx->num_comp_vectors >= 1, "num_comp_vectors %d", ctx->num_comp_vectors);
	CHECK(fcntl(ctx->async_fd, F_GETFD) != -1, "async_fd is a descriptor");

	/* The async fd is pollable: nothing pending. */
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	CHECK(poll(&p, 1, 0) == 0, "async_fd polled readable with no event");

	/* Error paths: errno as return value, or -1 / NULL with errno. */
	struct ibv_port_attr port;
	CHECK(ibv_query_port(ctx, 2, &port) == EINVAL, "query of port 2");
	CHECK(ibv_query_port(ctx, 1, &port) == 0 && port.state == IBV_PORT_ACTIVE,
	      "port 1 state %d", port.state);
	/* The exported ibv_query_port (not the inline wrapper) fills the old
	 * 48-byte struct and not a byte more. */
	unsigned char compat[sizeof(struct ibv_port_attr)];
	memset(compat, 0xab, sizeof compat);
	CHECK((ibv_query_port)(ctx, 1, (struct _compat_ibv_port_attr *)compat) == 0,
	      "exported query_port");
	CHECK(compat[48] == 0xab && compat[51] == 0xab, "wrote past 48 bytes");
	CHECK(((struct ibv_port_attr *)compat)->state == IBV_PORT_ACTIVE, "compat state");
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 5, &gid) == -1, "GID index 5");
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "GID 0");
	struct ibv_device_attr dev;
	CHECK(ibv_query_device(ctx, &dev) == 0 && dev.phys_port_cnt == 1, "query_device");
	errno = 0;
	CHECK(ibv_create_cq(ctx, dev.max_cqe + 1, NULL, NULL, 0) == NULL &&
		      errno == EINVAL,
	      "cqe above max_cqe: errno %d", errno);

	/* ibv_create_comp_channel / ibv_destroy_comp_channel. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch != NULL && ch->context == ctx && ch->refcnt == 0, "channel");
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, (void *)0x1234, ch, 0);
	CHECK(cq != NULL && cq->channel == ch && cq->cqe >= 64, "cq");
	CHECK(ch->refcnt == 1, "refcnt %d after a CQ", ch->refcnt);
	/* "fails if any CQs are still associated": EBUSY, as the return value. */
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "destroy with a CQ");

	/* A non-blocking channel fd: -1 / EAGAIN, not a hang. */
	int flags = fcntl(ch->fd, F_GETFL);
	CHECK(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0, "O_NONBLOCK");
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
	      "non-blocking read: errno %d", errno);
	CHECK(fcntl(ch->fd, F_SETFL, flags) == 0, "blocking again");

	/* A loopback pair of RC QPs: a SEND makes a completion event. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL, "pd");
	char *buf = calloc(1, 8192);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 8192,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr != NULL && mr->addr == buf && mr->length == 8192, "mr");
	/* A PD with an MR cannot go. */
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc with an MR");

	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	CHECK(a && b && a->qp_num != b->qp_num && a->state == IBV_QPS_RESET, "qps");
	/* A CQ used by QPs cannot go. */
	CHECK(ibv_destroy_cq(cq) == EBUSY, "destroy of a CQ in use");
	/* RESET -> RTR skips INIT: EINVAL. */
	struct ibv_qp_attr bad = { .qp_state = IBV_QPS_RTR };
	CHECK(ibv_modify_qp(a, &bad, IBV_QP_STATE) == EINVAL, "RESET->RTR");
	CHECK(connect_qp(a, b->qp_num, &gid) == 0, "connect a");
	CHECK(connect_qp(b, a->qp_num, &gid) == 0, "connect b");
	CHECK(a->state == IBV_QPS_RTS, "state after modify %d", a->state);

	/* Too many SGEs: EINVAL, bad_wr at the WR refused. */
	struct ibv_sge sges[2] = {
		{ .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey },
		{ .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey },
	};
	struct ibv_send_wr wr2 = { .wr_id = 2, .sg_list = sges, .num_sge = 2,
				   .opcode = IBV_WR_SEND };
	struct ibv_send_wr wr1 = { .wr_id = 1, .next = &wr2, .sg_list = sges,
				   .num_sge = 0, .opcode = IBV_WR_RDMA_WRITE,
				   .wr.rdma = { .remote_addr = (uintptr_t)buf,
						.rkey = mr->rkey } };
	struct ibv_send_wr *bad_wr = NULL;
	CHECK(ibv_post_send(a, &wr1, &bad_wr) == EINVAL && bad_wr == &wr2,
	      "bad_wr %p, want %p", (void *)bad_wr, (void *)&wr2);

	/* SEND a -> b with immediate data; solicit an event. */
	struct ibv_sge rsge = { .addr = (uintptr_t)(buf + 4096), .length = 64,
				.lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rsge, .num_sge = 1 };
	struct ibv_recv_wr *bad_rwr;
	CHECK(ibv_post_recv(b, &rwr, &bad_rwr) == 0, "post_recv");
	CHECK(ibv_req_notify_cq(cq, 0) == 0, "arm");
	strcpy(buf, "hello");
	struct ibv_send_wr s = { .wr_id = 9, .sg_list = sges, .num_sge = 1,
				 .opcode = IBV_WR_SEND_WITH_IMM,
				 .send_flags = IBV_SEND_SIGNALED,
				 .imm_data = htonl(0xabcd) };
	sges[0].length = 6;
	CHECK(ibv_post_send(a, &s, &bad_wr) == 0, "post_send");
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0, "get_cq_event");
	CHECK(ev_cq == cq && ev_ctx == (void *)0x1234, "event names the CQ");
	CHECK(cq->comp_events_completed == 0, "not acked yet");
	ibv_ack_cq_events(cq, 1);
	CHECK(cq->comp_events_completed == 1, "acked: %u", cq->comp_events_completed);
	struct ibv_wc wc[4];
	int got = 0;
	for (int spins = 0; got < 2 && spins < 10000000; spins++) {
		int n = ibv_poll_cq(cq, 4 - got, wc + got);
		CHECK(n >= 0, "poll %d", n);
		got += n;
	}
	CHECK(got == 2, "completions %d", got);
	for (int i = 0; i < got; i++) {
		CHECK(wc[i].status == IBV_WC_SUCCESS, "status %s",
		      ibv_wc_status_str(wc[i].status));
		if (wc[i].wr_id == 7) {
			CHECK(wc[i].opcode == IBV_WC_RECV, "recv opcode");
			CHECK(wc[i].byte_len == 6, "byte_len %u", wc[i].byte_len);
			CHECK(wc[i].wc_flags & IBV_WC_WITH_IMM, "imm flag");
			CHECK(ntohl(wc[i].imm_data) == 0xabcd, "imm %x", ntohl(wc[i].imm_data));
			CHECK(wc[i].qp_num == b->qp_num && wc[i].src_qp == a->qp_num,
			      "qp_num/src_qp");
			CHECK(strcmp(buf + 4096, "hello") == 0, "payload");
		} else {
			CHECK(wc[i].wr_id == 9 && wc[i].opcode == IBV_WC_SEND, "send wc");
		}
	}

	/* The extended CQ: ibv_create_cq_ex with the standard fields, polled
	 * with ibv_start_poll / ibv_next_poll / ibv_wc_read_*; fields it does
	 * not have (timestamps) are EOPNOTSUPP. */
	struct ibv_cq_init_attr_ex cxa = {
		.cqe = 16,
		.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
	};
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &cxa) == NULL && errno == EOPNOTSUPP,
	      "timestamps: errno %d", errno);
	cxa.wc_flags = IBV_WC_STANDARD_FLAGS;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cxa);
	CHECK(cqx != NULL, "create_cq_ex: errno %d", errno);
	if (cqx) {
		struct ibv_qp_init_attr xa = ia;
		xa.send_cq = xa.recv_cq = ibv_cq_ex_to_cq(cqx);
		struct ibv_qp *xq = ibv_create_qp(pd, &xa);
		struct ibv_qp *xr = ibv_create_qp(pd, &xa);
		CHECK(xq && xr && connect_qp(xq, xr->qp_num, &gid) == 0 &&
			      connect_qp(xr, xq->qp_num, &gid) == 0,
		      "ex qps");
		struct ibv_recv_wr xrwr = { .wr_id = 70, .sg_list = &rsge, .num_sge = 1 };
		CHECK(ibv_post_recv(xr, &xrwr, &bad_rwr) == 0, "ex post_recv");
		struct ibv_send_wr xs = s;
		xs.wr_id = 71;
		xs.imm_data = htonl(0x5151);
		CHECK(ibv_post_send(xq, &xs, &bad_wr) == 0, "ex post_send");
		struct ibv_poll_cq_attr pa = { 0 };
		int seen = 0;
		for (long spins = 0; seen < 2 && spins < 20000000; spins++) {
			if (ibv_start_poll(cqx, &pa) == ENOENT)
				continue;
			do {
				CHECK(cqx->status == IBV_WC_SUCCESS, "ex status %d", cqx->status);
				if (cqx->wr_id == 70) {
					CHECK(ibv_wc_read_opcode(cqx) == IBV_WC_RECV, "ex opcode");
					CHECK(ibv_wc_read_byte_len(cqx) == 6, "ex byte_len");
					CHECK(ntohl(ibv_wc_read_imm_data(cqx)) == 0x5151, "ex imm");
					CHECK(ibv_wc_read_wc_flags(cqx) & IBV_WC_WITH_IMM, "ex flags");
					CHECK(ibv_wc_read_qp_num(cqx) == xr->qp_num, "ex qp_num");
					CHECK(ibv_wc_read_src_qp(cqx) == xq->qp_num, "ex src_qp");
				} else {
					CHECK(cqx->wr_id == 71 &&
						      ibv_wc_read_opcode(cqx) == IBV_WC_SEND,
					      "ex send wc");
				}
				seen++;
			} while (ibv_next_poll(cqx) == 0);
			ibv_end_poll(cqx);
		}
		CHECK(seen == 2, "ex completions %d", seen);
		CHECK(ibv_destroy_qp(xq) == 0 && ibv_destroy_qp(xr) == 0, "ex qps destroy");
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0, "ex cq destroy");
	}

	/* ibv_rereg_mr: new access flags and new memory give new keys; the
	 * MR's fields follow. No flags: IBV_REREG_MR_ERR_INPUT. */
	char *buf2 = calloc(1, 4096);
	uint32_t old_lkey = mr->lkey;
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT, "no flags");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS,
			   NULL, buf2, 4096, IBV_ACCESS_LOCAL_WRITE) == 0,
	      "rereg: errno %d", errno);
	CHECK(mr->addr == buf2 && mr->length == 4096 && mr->lkey != old_lkey, "rereg fields");

	/* Teardown in order; each destroy reports 0. */
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy qps");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy cq");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy channel after its CQ");
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0, "mr, pd");
	free(buf2);

	/* ibv_close_device does not release what was made through the
	 * context: it succeeds (0) with a PD still allocated. */
	struct ibv_pd *left = ibv_alloc_pd(ctx);
	CHECK(left != NULL, "pd");
	CHECK(ibv_close_device(ctx) == 0, "close with a PD alive");
	/* "-1 on failure": a context that is not open. */
	CHECK(ibv_close_device(NULL) == -1, "close of NULL");
	ibv_free_device_list(list);

	/* ibv_fork_init after an MR was registered (rdma-core 44 marks its
	 * range don't-fork then) or a range call: too late, EINVAL. */
	CHECK(ibv_dontfork_range(buf, 4096) == 0, "dontfork_range");
	CHECK(ibv_fork_init() == EINVAL, "fork_init after ibv_reg_mr");
	free(buf);
	if (failures) {
		fprintf(stderr, "%d failures\n", failures);
		return 1;
	}
	printf("ALL OK\n");
	return 0;
}
