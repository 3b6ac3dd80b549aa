/* Leaks on purpose: a PD and a CQ outlive a closed context, and a second
 * context is never closed. With RVERBS_LEAK_CHECK=1 rverbs names them. */
#include <stdio.h>
#include <infiniband/verbs.h>

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		return 1;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_context *other = ibv_open_device(list[0]);
	if (!ctx || !other)
		return 1;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !cq)
		return 1;
	if (ibv_close_device(ctx))
		return 1;
	printf("ALL OK\n");
	fflush(stdout);
	return 0;
}
