/* librdmacm's semantics on rverbs, in one process: event channels (a
 * non-blocking fd says EAGAIN), ids and their errors, a listener's port,
 * private data and its limits, a reject's reason and data, the device
 * list, ports. Prints "ok" at the end when no CHECK failed. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include "check.h"

static struct rdma_cm_event *next(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev = NULL;
	CHECK(poll(&p, 1, 20000) == 1, "no event (wanted %s)", rdma_event_str(want));
	CHECK(rdma_get_cm_event(ch, &ev) == 0, "get_cm_event: %s", strerror(errno));
	if (ev)
		CHECK(ev->event == want, "got %s, wanted %s", rdma_event_str(ev->event),
		      rdma_event_str(want));
	return ev;
}

static struct sockaddr_in addr(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

int main(int argc, char **argv)
{
	int port = argc > 1 ? atoi(argv[1]) : 21000;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch != NULL, "create_event_channel: %s", strerror(errno));
	if (!ch)
		return 1;

	/* A non-blocking channel with nothing waiting: EAGAIN. */
	int flags = fcntl(ch->fd, F_GETFL);
	CHECK(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0, "fcntl");
	struct rdma_cm_event *ev = NULL;
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "want EAGAIN, got errno %d", errno);
	CHECK(fcntl(ch->fd, F_SETFL, flags) == 0, "fcntl");

	/* A port space that does not exist. */
	struct rdma_cm_id *bad = NULL;
	errno = 0;
	CHECK(rdma_create_id(ch, &bad, NULL, 0x9999) == -1 && errno == EINVAL, "errno %d", errno);

	/* One listener per port. */
	struct rdma_cm_id *listen_id, *second;
	CHECK(rdma_create_id(ch, &listen_id, (void *)0x1234, RDMA_PS_TCP) == 0, "create_id");
	struct sockaddr_in any = addr("0.0.0.0", port);
	CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&any) == 0, "bind: %s", strerror(errno));
	CHECK(rdma_listen(listen_id, 8) == 0, "listen: %s", strerror(errno));
	CHECK(ntohs(rdma_get_src_port(listen_id)) == port, "src port %d", ntohs(rdma_get_src_port(listen_id)));
	CHECK(listen_id->verbs != NULL, "a bound id has its device's context");
	CHECK(rdma_create_id(ch, &second, NULL, RDMA_PS_TCP) == 0, "create_id");
	CHECK(rdma_bind_addr(second, (struct sockaddr *)&any) == 0, "bind: %s", strerror(errno));
	errno = 0;
	CHECK(rdma_listen(second, 8) == -1 && errno == EADDRINUSE, "second listen: errno %d", errno);
	CHECK(rdma_destroy_id(second) == 0, "destroy");

	/* Connect to 127.0.0.1: the listener is found. */
	struct rdma_cm_id *client;
	CHECK(rdma_create_id(ch, &client, (void *)0x5678, RDMA_PS_TCP) == 0, "create_id");
	struct sockaddr_in dst = addr("127.0.0.1", port);
	CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&dst, 2000) == 0, "resolve_addr: %s", strerror(errno));
	ev = next(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(ev && ev->id == client && ev->id->context == (void *)0x5678, "the event names the id");
	rdma_ack_cm_event(ev);
	CHECK(ntohs(rdma_get_dst_port(client)) == port, "dst port");
	/* The source the connection comes from, as the kernel puts the
	 * route's source in place of the wildcard (libfabric's rxm sends this
	 * address to its peers to connect back to). */
	{
		struct sockaddr_in *src = (struct sockaddr_in *)rdma_get_local_addr(client);
		CHECK(src->sin_family == AF_INET && src->sin_addr.s_addr != htonl(INADDR_ANY) &&
			      src->sin_port != 0,
		      "after resolve_addr the local address is %08x:%d", ntohl(src->sin_addr.s_addr),
		      ntohs(src->sin_port));
		CHECK(src->sin_addr.s_addr == ((struct sockaddr_in *)&client->route.addr.src_addr)->sin_addr.s_addr,
		      "route.addr.src_addr agrees");
	}
	CHECK(rdma_resolve_route(client, 2000) == 0, "resolve_route: %s", strerror(errno));
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	CHECK(client->route.num_paths == 1 && client->route.path_rec, "a resolved route has a path");

	/* Without a QP, a connect needs its parameters (the QP number). */
	errno = 0;
	CHECK(rdma_connect(client, NULL) == -1 && errno == EINVAL, "NULL param, no QP: errno %d", errno);

	/* Private data: 56 bytes at most after rdma_cm's header. */
	char big[57];
	memset(big, 'x', sizeof big);
	struct rdma_conn_param param = { .private_data = big, .private_data_len = 57,
					 .responder_resources = 1, .initiator_depth = 1,
					 .retry_count = 7, .rnr_retry_count = 7, .qp_num = 0x42 };
	errno = 0;
	CHECK(rdma_connect(client, &param) == -1 && errno == EINVAL, "57 bytes: errno %d", errno);
	param.private_data = "0123456789";
	param.private_data_len = 10;
	/* RDMA_MAX_*: the device's most. */
	param.responder_resources = RDMA_MAX_RESP_RES;
	param.initiator_depth = RDMA_MAX_INIT_DEPTH;
	struct ibv_device_attr dev;
	CHECK(ibv_query_device(client->verbs, &dev) == 0, "query_device");
	CHECK(rdma_connect(client, &param) == 0, "connect: %s", strerror(errno));

	ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	if (ev) {
		CHECK(ev->listen_id == listen_id, "the listener");
		CHECK(ev->id != listen_id && ev->id->context == (void *)0x1234,
		      "a new id, with the listener's context");
		CHECK(ev->param.conn.private_data_len == 56, "len %d", ev->param.conn.private_data_len);
		CHECK(memcmp(ev->param.conn.private_data, "0123456789", 10) == 0, "the data");
		CHECK(ev->param.conn.qp_num == 0x42, "the peer's QP");
		CHECK(ev->param.conn.responder_resources == dev.max_qp_rd_atom &&
		      ev->param.conn.initiator_depth == dev.max_qp_rd_atom,
		      "RDMA_MAX_* offered the device's most: %d %d (max %d)",
		      ev->param.conn.responder_resources, ev->param.conn.initiator_depth,
		      dev.max_qp_rd_atom);
		struct rdma_cm_id *req = ev->id;
		rdma_ack_cm_event(ev);
		CHECK(rdma_reject(req, "nope", 4) == 0, "reject: %s", strerror(errno));
		ev = next(ch, RDMA_CM_EVENT_REJECTED);
		if (ev) {
			CHECK(ev->id == client, "the client hears");
			CHECK(ev->status == 28, "consumer-defined reject: %d", ev->status);
			CHECK(ev->param.conn.private_data_len == 148 &&
			      memcmp(ev->param.conn.private_data, "nope", 4) == 0, "the reject's data");
			rdma_ack_cm_event(ev);
		}
		CHECK(rdma_destroy_id(req) == 0, "destroy");
	}

	/* Nobody on this port: rejected at once, invalid service ID. */
	struct rdma_cm_id *lonely;
	CHECK(rdma_create_id(ch, &lonely, NULL, RDMA_PS_TCP) == 0, "create_id");
	struct sockaddr_in none = addr("127.0.0.1", port + 1);
	CHECK(rdma_resolve_addr(lonely, NULL, (struct sockaddr *)&none, 2000) == 0, "resolve_addr");
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(lonely, 2000) == 0, "resolve_route");
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	param.private_data_len = 0;
	CHECK(rdma_connect(lonely, &param) == 0, "connect");
	ev = next(ch, RDMA_CM_EVENT_REJECTED);
	CHECK(ev && ev->status == 8, "invalid service ID: %d", ev ? ev->status : -1);
	rdma_ack_cm_event(ev);

	/* A synchronous id (no channel) migrated to a channel is asynchronous:
	 * its next event comes there. */
	struct rdma_cm_id *sync_id;
	CHECK(rdma_create_id(NULL, &sync_id, NULL, RDMA_PS_TCP) == 0, "create_id(NULL)");
	CHECK(rdma_resolve_addr(sync_id, NULL, (struct sockaddr *)&none, 2000) == 0,
	      "synchronous resolve_addr: %s", strerror(errno));
	CHECK(sync_id->event && sync_id->event->event == RDMA_CM_EVENT_ADDR_RESOLVED,
	      "the synchronous call left its event");
	CHECK(rdma_migrate_id(sync_id, ch) == 0, "migrate: %s", strerror(errno));
	CHECK(sync_id->channel == ch && sync_id->event == NULL, "migrated");
	CHECK(rdma_resolve_route(sync_id, 2000) == 0, "resolve_route: %s", strerror(errno));
	ev = next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	CHECK(ev && ev->id == sync_id, "the route event came to the channel");
	rdma_ack_cm_event(ev);
	CHECK(rdma_destroy_id(sync_id) == 0, "destroy");

	/* The device list. */
	int n = -1;
	struct ibv_context **list = rdma_get_devices(&n);
	CHECK(list && n >= 1 && list[n] == NULL, "devices: %d", n);
	rdma_free_devices(list);

	CHECK(rdma_destroy_id(lonely) == 0, "destroy");
	CHECK(rdma_destroy_id(client) == 0, "destroy");
	CHECK(rdma_destroy_id(listen_id) == 0, "destroy");
	rdma_destroy_event_channel(ch);
	if (!failures)
		printf("ok\n");
	return failures != 0;
}
