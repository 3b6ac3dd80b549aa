/* rdma_resolve_addr to an address on the link that nobody holds: the call
 * returns 0 at once and, when no neighbour answered within timeout_ms,
 * RDMA_CM_EVENT_ADDR_ERROR comes with status -ETIMEDOUT, as on the
 * kernel's rdma_cm; the id is bound again and may resolve anew. A
 * synchronous id (no channel) fails the call with ETIMEDOUT and leaves the
 * event in id->event. The host's own address still resolves at once.
 * Run in a network namespace whose veth end d0 holds 10.99.8.1/24 (the
 * other end, d1, up and holding nothing). Prints "ok" when all holds. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include "check.h"

static struct sockaddr_in ipv4(const char *ip)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(7471) };
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

/* The next event on ch, acknowledged; its type and status. */
static int next_event(struct rdma_event_channel *ch, struct rdma_cm_id *id, int *status)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev) != 0) {
		fprintf(stderr, "rdma_get_cm_event: %s\n", strerror(errno));
		return -1;
	}
	int type = ev->event;
	*status = ev->status;
	CHECK(ev->id == id, "event %s for another id", rdma_event_str(ev->event));
	rdma_ack_cm_event(ev);
	return type;
}

int main(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) != 0) {
		fprintf(stderr, "create_id: %s\n", strerror(errno));
		return 2;
	}
	struct sockaddr_in nobody = ipv4("10.99.8.77");
	int status = 0, type;
	for (int round = 0; round < 2; round++) {
		int r = rdma_resolve_addr(id, NULL, (struct sockaddr *)&nobody, 300);
		CHECK(r == 0, "round %d: rdma_resolve_addr: %s", round, strerror(errno));
		type = next_event(ch, id, &status);
		CHECK(type == RDMA_CM_EVENT_ADDR_ERROR && status == -ETIMEDOUT,
		      "round %d: %s, status %d", round, rdma_event_str(type), status);
		/* Bound again: no route to resolve. */
		errno = 0;
		CHECK(rdma_resolve_route(id, 1000) == -1 && errno == EINVAL,
		      "round %d: rdma_resolve_route after ADDR_ERROR: errno %d", round, errno);
	}

	/* The host's own address resolves at once. */
	struct sockaddr_in self = ipv4("10.99.8.1");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&self, 300) == 0, "%s",
	      strerror(errno));
	type = next_event(ch, id, &status);
	CHECK(type == RDMA_CM_EVENT_ADDR_RESOLVED && status == 0, "own address: %s, status %d",
	      rdma_event_str(type), status);
	rdma_destroy_id(id);

	/* A synchronous id: the call waits for the event and fails with it. */
	struct rdma_cm_id *sync_id;
	if (rdma_create_id(NULL, &sync_id, NULL, RDMA_PS_TCP) != 0) {
		fprintf(stderr, "create_id (sync): %s\n", strerror(errno));
		return 2;
	}
	errno = 0;
	int r = rdma_resolve_addr(sync_id, NULL, (struct sockaddr *)&nobody, 300);
	CHECK(r == -1 && errno == ETIMEDOUT, "sync: %d, errno %d (%s)", r, errno, strerror(errno));
	CHECK(sync_id->event && sync_id->event->event == RDMA_CM_EVENT_ADDR_ERROR &&
		      sync_id->event->status == -ETIMEDOUT,
	      "sync: id->event %s", sync_id->event ? rdma_event_str(sync_id->event->event) : "NULL");
	rdma_destroy_id(sync_id);
	rdma_destroy_event_channel(ch);
	if (failures)
		return 1;
	printf("ok\n");
	return 0;
}
