/* rdma_destroy_event_channel while threads still use the channel, as
 * Debian 12's rping does at exit (its event thread is not joined):
 *  - a thread already waiting in rdma_get_cm_event goes on waiting, as a
 *    read of librdmacm's descriptor blocked in the kernel does;
 *  - a thread that calls rdma_get_cm_event with the destroyed channel
 *    (just after the destroy) does not crash: it fails with EBADF.
 * Prints "done" when both behaved; main then returns with the first
 * thread still waiting. A late call that waits for ever (on a channel
 * made since in the freed memory) ends in SIGALRM. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <pthread.h>
#include "asleep.h"
#include <rdma/rdma_cma.h>

static struct rdma_event_channel *ch;
static volatile int waiter_returned;
static volatile pid_t waiter_tid;

static void *waiter(void *arg)
{
	struct rdma_cm_event *ev;
	(void)arg;
	waiter_tid = this_thread();
	rdma_get_cm_event(ch, &ev);
	waiter_returned = 1;
	return NULL;
}

static int late_ret, late_errno;

static void *late(void *arg)
{
	struct rdma_cm_event *ev;
	(void)arg;
	errno = 0;
	late_ret = rdma_get_cm_event(ch, &ev);
	late_errno = errno;
	return NULL;
}

int main(void)
{
	pthread_t w, l;
	alarm(20);
	ch = rdma_create_event_channel();
	if (!ch) {
		perror("rdma_create_event_channel");
		return 1;
	}
	if (start_waiter(&w, waiter, &waiter_tid))
		return 1;
	rdma_destroy_event_channel(ch);
	/* What glibc's free does to small blocks: the memory is taken over. */
	void *again[8];
	for (int i = 0; i < 8; i++)
		again[i] = rdma_create_event_channel();
	pthread_create(&l, NULL, late, NULL);
	pthread_join(l, NULL);
	if (!late_call_refused_waiter_waits(late_ret, late_errno, waiter_returned))
		return 1;
	for (int i = 0; i < 8; i++)
		rdma_destroy_event_channel(again[i]);
	printf("done\n");
	return 0;
}
