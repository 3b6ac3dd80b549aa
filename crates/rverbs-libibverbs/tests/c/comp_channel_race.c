/* ibv_destroy_comp_channel while threads still use the channel (a program
 * that ends without joining its event thread):
 *  - a thread already waiting in ibv_get_cq_event goes on waiting, as a
 *    read of libibverbs' descriptor blocked in the kernel does;
 *  - a thread that calls ibv_get_cq_event with the destroyed channel (just
 *    after the destroy) does not crash: it fails with EBADF;
 *  - the destroyed channel no longer holds its context: ibv_close_device
 *    succeeds although a thread still waits on the channel.
 * Prints "ALL OK" when all held; main then returns with the first thread
 * still waiting. A late call that waits for ever (on a channel made since
 * in the freed memory) ends in SIGALRM. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <pthread.h>
#include "asleep.h"
#include <infiniband/verbs.h>

static struct ibv_comp_channel *ch;
static volatile int waiter_returned;
static volatile pid_t waiter_tid;

static void *waiter(void *arg)
{
	struct ibv_cq *cq;
	void *ctx;
	(void)arg;
	waiter_tid = this_thread();
	ibv_get_cq_event(ch, &cq, &ctx);
	waiter_returned = 1;
	return NULL;
}

static int late_ret, late_errno;

static void *late(void *arg)
{
	struct ibv_cq *cq;
	void *ctx;
	(void)arg;
	errno = 0;
	late_ret = ibv_get_cq_event(ch, &cq, &ctx);
	late_errno = errno;
	return NULL;
}

int main(void)
{
	pthread_t w, l;
	struct ibv_device **list;
	struct ibv_context *context;
	struct ibv_cq *cq;
	int n, rc;

	alarm(20);
	list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		printf("no device\n");
		return 1;
	}
	context = ibv_open_device(list[0]);
	if (!context) {
		perror("ibv_open_device");
		return 1;
	}
	ch = ibv_create_comp_channel(context);
	if (!ch) {
		perror("ibv_create_comp_channel");
		return 1;
	}
	/* A CQ keeps the channel: EBUSY while it lives. */
	cq = ibv_create_cq(context, 4, NULL, ch, 0);
	if (!cq) {
		perror("ibv_create_cq");
		return 1;
	}
	rc = ibv_destroy_comp_channel(ch);
	if (rc != EBUSY) {
		printf("destroy with a CQ on it: %d, not EBUSY\n", rc);
		return 1;
	}
	if (ibv_destroy_cq(cq)) {
		printf("ibv_destroy_cq failed\n");
		return 1;
	}
	if (start_waiter(&w, waiter, &waiter_tid))
		return 1;
	rc = ibv_destroy_comp_channel(ch);
	if (rc) {
		printf("ibv_destroy_comp_channel: %d\n", rc);
		return 1;
	}
	/* What glibc's free does to small blocks: the memory is taken over. */
	struct ibv_comp_channel *again[8];
	for (int i = 0; i < 8; i++)
		again[i] = ibv_create_comp_channel(context);
	pthread_create(&l, NULL, late, NULL);
	pthread_join(l, NULL);
	if (!late_call_refused_waiter_waits(late_ret, late_errno, waiter_returned))
		return 1;
	for (int i = 0; i < 8; i++)
		if (!again[i] || ibv_destroy_comp_channel(again[i])) {
			printf("channel %d: create or destroy failed\n", i);
			return 1;
		}
	rc = ibv_close_device(context);
	if (rc) {
		printf("ibv_close_device with a thread waiting on a destroyed channel: %d\n", rc);
		return 1;
	}
	ibv_free_device_list(list);
	if (waiter_returned) {
		printf("the waiting thread returned\n");
		return 1;
	}
	printf("ALL OK\n");
	return 0;
}
