/* Connects an RC id to 127.0.0.1:PORT and, once ESTABLISHED, exits
 * without disconnecting or destroying anything: the library must end the
 * connection as the kernel's CM does for a process that goes away (its
 * peer gets DISCONNECTED). Prints "established" first. With a second
 * argument "cleanup", an atexit handler registered before connecting
 * disconnects and waits for DISCONNECTED, as a program's exit-time
 * cleanup may: it must still find its connection (prints "cleanup ok"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static struct rdma_event_channel *ch;
static struct rdma_cm_id *id;

static void cleanup(void)
{
	struct rdma_cm_event *ev = NULL;
	if (rdma_disconnect(id) != 0) {
		fprintf(stderr, "cleanup: rdma_disconnect: %s\n", strerror(errno));
		return;
	}
	if (rdma_get_cm_event(ch, &ev) != 0 || ev->event != RDMA_CM_EVENT_DISCONNECTED) {
		fprintf(stderr, "cleanup: no DISCONNECTED\n");
		return;
	}
	rdma_ack_cm_event(ev);
	printf("cleanup ok\n");
	fflush(stdout);
}

static struct rdma_cm_event *next(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev = NULL;
	if (rdma_get_cm_event(ch, &ev) != 0) {
		fprintf(stderr, "get_cm_event: %s\n", strerror(errno));
		exit(2);
	}
	if (ev->event != want) {
		fprintf(stderr, "got %s, wanted %s (status %d)\n", rdma_event_str(ev->event),
			rdma_event_str(want), ev->status);
		exit(2);
	}
	return ev;
}

int main(int argc, char **argv)
{
	struct sockaddr_in dst = { .sin_family = AF_INET,
				   .sin_port = htons(argc > 1 ? atoi(argv[1]) : 25000) };
	inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
	if (argc > 2 && strcmp(argv[2], "cleanup") == 0)
		atexit(cleanup);
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) != 0)
		return 2;
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) != 0)
		return 2;
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000) != 0)
		return 2;
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						  .max_send_sge = 1, .max_recv_sge = 1 },
					 .qp_type = IBV_QPT_RC };
	if (rdma_create_qp(id, NULL, &attr) != 0) {
		fprintf(stderr, "create_qp: %s\n", strerror(errno));
		return 2;
	}
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
					 .retry_count = 7, .rnr_retry_count = 7 };
	if (rdma_connect(id, &param) != 0)
		return 2;
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED));
	printf("established\n");
	fflush(stdout);
	exit(0);
}
