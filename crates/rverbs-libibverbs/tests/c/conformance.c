/* What rdma-core's own test suite (pyverbs) expects of a device, checked
 * from C on the drop-in library: ibv_query_device_ex fills the extended
 * port count and capability flags; ibv_query_qp_data_in_order answers 0
 * or 1; cmd_fd is a descriptor a program may dup, and importing it is
 * EOPNOTSUPP; ibv_create_qp_ex takes create flags that are none;
 * ibv_rereg_mr of the access flags or the PD keeps the keys; a QP moved
 * to RESET leaves none of its completions in its CQ. Prints "ALL OK". */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "check.h"

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "a device");
	if (!list || !list[0])
		return 1;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "open: %d", errno);
	if (!ctx)
		return 1;

	/* ibv_query_device_ex: the classic attributes and the extended ones
	 * that have a value. */
	struct ibv_device_attr_ex ex;
	memset(&ex, 0xab, sizeof ex);
	CHECK(ibv_query_device_ex(ctx, NULL, &ex) == 0, "query_device_ex");
	CHECK(ex.phys_port_cnt_ex == ex.orig_attr.phys_port_cnt && ex.phys_port_cnt_ex == 1,
	      "phys_port_cnt_ex %u, phys_port_cnt %u", ex.phys_port_cnt_ex,
	      ex.orig_attr.phys_port_cnt);
	CHECK((uint32_t)ex.device_cap_flags_ex == ex.orig_attr.device_cap_flags,
	      "device_cap_flags_ex %#llx, device_cap_flags %#x",
	      (unsigned long long)ex.device_cap_flags_ex, ex.orig_attr.device_cap_flags);
	CHECK(ex.odp_caps.general_caps == 0 && ex.max_dm_size == 0 && ex.tm_caps.max_num_tags == 0,
	      "no ODP, device memory or tag matching");
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &in, &ex) == EINVAL, "an input comp_mask is EINVAL");

	/* cmd_fd: a descriptor of the context's own. */
	CHECK(ctx->cmd_fd >= 0 && fcntl(ctx->cmd_fd, F_GETFD) != -1, "cmd_fd %d", ctx->cmd_fd);
	int dup_fd = dup(ctx->cmd_fd);
	CHECK(dup_fd >= 0, "dup(cmd_fd): %s", strerror(errno));
	errno = 0;
	CHECK(ibv_import_device(dup_fd) == NULL && errno == EOPNOTSUPP, "import: errno %d", errno);
	close(dup_fd);

	struct ibv_pd *pd = ibv_alloc_pd(ctx), *pd2 = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(pd && pd2 && cq, "pd, cq");
	if (!pd || !pd2 || !cq)
		return 1;

	/* ibv_create_qp_ex with IBV_QP_INIT_ATTR_CREATE_FLAGS and no flag. */
	struct ibv_qp_init_attr_ex qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
		.create_flags = 0,
	};
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &qa);
	CHECK(qp != NULL, "create_qp_ex, no create flag: %s", strerror(errno));
	qa.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &qa) == NULL && errno == EOPNOTSUPP,
	      "create_qp_ex with a flag: errno %d", errno);
	if (!qp)
		return 1;

	/* ibv_query_qp_data_in_order: 0 or 1 (rdma-core 44 has no flags). */
	int in_order = ibv_query_qp_data_in_order(qp, IBV_WR_RDMA_WRITE, 0);
	CHECK(in_order == 0 || in_order == 1, "data in order: %d", in_order);
	in_order = ibv_query_qp_data_in_order(qp, IBV_WR_SEND, 0);
	CHECK(in_order == 0 || in_order == 1, "data in order (SEND): %d", in_order);

	/* ibv_rereg_mr: the access flags, then the PD; the keys stay. */
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL, "reg_mr");
	if (!mr)
		return 1;
	uint32_t lkey = mr->lkey, rkey = mr->rkey;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == 0, "rereg access");
	CHECK(mr->lkey == lkey && mr->rkey == rkey, "keys after an access rereg: %#x/%#x, were %#x/%#x",
	      mr->lkey, mr->rkey, lkey, rkey);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0, "rereg pd");
	CHECK(mr->lkey == lkey && mr->rkey == rkey && mr->pd == pd2, "keys after a PD rereg");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0) == 0, "rereg pd back");

	/* A QP in ERR flushes its receives into the CQ; RESET takes them out. */
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(qp, &rwr, &bad) == 0, "post_recv");
	a.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "ERR");
	a.qp_state = IBV_QPS_RESET;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "RESET");
	struct ibv_wc wc;
	int n = ibv_poll_cq(cq, 1, &wc);
	CHECK(n == 0, "after RESET the CQ held %d completion(s) (wr_id %llu, status %s)", n,
	      n > 0 ? (unsigned long long)wc.wr_id : 0ULL, n > 0 ? ibv_wc_status_str(wc.status) : "-");

	CHECK(ibv_destroy_qp(qp) == 0, "destroy qp");
	CHECK(ibv_dereg_mr(mr) == 0, "dereg");
	free(buf);
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_dealloc_pd(pd2) == 0,
	      "teardown");
	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	if (failures) {
		fprintf(stderr, "%d failures\n", failures);
		return 1;
	}
	printf("ALL OK\n");
	return 0;
}
