/* Device disassociation from C, with rverbs' rverbs_device_disassociate():
 * IBV_EVENT_DEVICE_FATAL arrives, and destroys report what
 * RDMAV_ALLOW_DISASSOC_DESTROY says — set: 0 (the EIO "related as a
 * success"), unset: EIO. The parent test runs this both ways and passes the
 * expected destroy result as argv[1]. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <infiniband/verbs.h>

/* An rverbs extension: looked up at run time, as a program that also runs
 * on other libibverbs would. */
typedef int (*disassociate_fn)(struct ibv_device *device);

#include "check.h"

int main(int argc, char **argv)
{
	int want = argc > 1 ? atoi(argv[1]) : 0;
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		return 1;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = ctx ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	CHECK(ctx && pd && cq, "setup");
	if (!ctx || !pd || !cq)
		return 1;
	disassociate_fn disassociate =
		(disassociate_fn)dlsym(RTLD_DEFAULT, "rverbs_device_disassociate");
	CHECK(disassociate != NULL, "rverbs_device_disassociate not found");
	if (!disassociate)
		return 1;
	CHECK(disassociate(list[0]) == 0, "disassociate");
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(ctx, &ev) == 0, "async event: errno %d", errno);
	CHECK(ev.event_type == IBV_EVENT_DEVICE_FATAL, "event %s",
	      ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	/* Later verbs fail. */
	errno = 0;
	CHECK(ibv_alloc_pd(ctx) == NULL && errno != 0, "alloc after disassociation");
	int r1 = ibv_destroy_cq(cq);
	int r2 = ibv_dealloc_pd(pd);
	CHECK(r1 == want && r2 == want, "destroy_cq %d, dealloc_pd %d, want %d", r1, r2, want);
	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	if (failures)
		return 1;
	printf("ALL OK\n");
	return 0;
}
