/* rdma_destroy_id while another thread holds one of the id's events:
 * librdmacm blocks the destroy until the event is acknowledged, so the
 * event thread may use event->id until its ack. The event thread takes the
 * event, lets the main thread destroy the id, waits a little, reads
 * event->id, then acknowledges; the destroy must return only after that
 * ack. (Built with AddressSanitizer: a use after free aborts too.) Prints
 * "done" when every round behaved. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static struct rdma_event_channel *ch;
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;
static int got, acked;

static void *events(void *arg)
{
	(void)arg;
	for (;;) {
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(ch, &ev))
			continue;
		pthread_mutex_lock(&m);
		got++;
		pthread_cond_broadcast(&c);
		pthread_mutex_unlock(&m);
		usleep(20000); /* the main thread is in rdma_destroy_id now */
		volatile void *ctx = ev->id->context;
		(void)ctx;
		pthread_mutex_lock(&m);
		acked++;
		pthread_mutex_unlock(&m);
		rdma_ack_cm_event(ev);
	}
	return NULL;
}

int main(void)
{
	ch = rdma_create_event_channel();
	pthread_t t;
	pthread_create(&t, NULL, events, NULL);
	struct sockaddr_in dst;
	memset(&dst, 0, sizeof dst);
	dst.sin_family = AF_INET;
	dst.sin_port = htons(9);
	inet_pton(AF_INET, "192.0.2.99", &dst.sin_addr);
	for (int i = 0; i < 20; i++) {
		struct rdma_cm_id *id;
		if (rdma_create_id(ch, &id, (void *)0x1234, RDMA_PS_TCP))
			return 2;
		if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 100))
			return 3;
		pthread_mutex_lock(&m);
		while (got <= i)
			pthread_cond_wait(&c, &m);
		pthread_mutex_unlock(&m);
		if (rdma_destroy_id(id))
			return 4;
		pthread_mutex_lock(&m);
		int ok = acked == i + 1;
		pthread_mutex_unlock(&m);
		if (!ok) {
			printf("round %d: rdma_destroy_id returned before the event's ack\n", i);
			return 5;
		}
	}
	printf("done\n");
	return 0;
}
