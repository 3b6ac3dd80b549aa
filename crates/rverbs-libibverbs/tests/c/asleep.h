/* For the C tests that destroy a channel while another thread waits on it:
 * wait until that thread sleeps (it is blocked inside the call then), and
 * check what followed the destroy. */
#ifndef RVERBS_TEST_ASLEEP_H
#define RVERBS_TEST_ASLEEP_H
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/types.h>

/* The calling thread's id, for wait_asleep. */
static pid_t this_thread(void)
{
	return (pid_t)syscall(SYS_gettid);
}

/* Waits (up to 10 s) until thread `tid` sleeps (state S in
 * /proc/self/task/TID/stat); 0 once it does, -1 if it never did. */
static int wait_asleep(pid_t tid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
	for (int i = 0; i < 10000; i++) {
		FILE *f = fopen(path, "r");
		if (f) {
			size_t n = fread(buf, 1, sizeof buf - 1, f);
			fclose(f);
			buf[n] = 0;
			char *p = strrchr(buf, ')');
			if (p && p[1] == ' ' && p[2] == 'S')
				return 0;
		}
		usleep(1000);
	}
	return -1;
}

/* Starts `fn` on thread `t`; `fn` stores this_thread() in `*tid` first,
 * then blocks. Returns once it sleeps: 0, or -1 (said why) if it never
 * did. */
static int start_waiter(pthread_t *t, void *(*fn)(void *), volatile pid_t *tid)
{
	pthread_create(t, NULL, fn, NULL);
	while (!*tid)
		usleep(1000);
	if (wait_asleep(*tid)) {
		printf("the waiting thread never blocked\n");
		return -1;
	}
	return 0;
}

/* Whether a call made with the destroyed channel failed with EBADF (it
 * returned `ret`, errno `err`) and the thread that waited before the
 * destroy still waits (`returned` is 0); says what went wrong if not. */
static int late_call_refused_waiter_waits(int ret, int err, int returned)
{
	if (ret != -1 || err != EBADF) {
		printf("late call: %d, errno %d\n", ret, err);
		return 0;
	}
	if (returned) {
		printf("the waiting thread returned\n");
		return 0;
	}
	return 1;
}
#endif
