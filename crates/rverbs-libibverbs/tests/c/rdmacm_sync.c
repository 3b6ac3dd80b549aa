/* Synchronous rdma_cm ids (made without an event channel, as
 * rdma_create_ep makes them): each call returns once the event it leads
 * to came, and leaves that event in id->event. A server thread and a
 * client in one process connect, trade one SEND, and disconnect; the
 * client's rdma_disconnect returns with DISCONNECTED (the peer's DREP
 * came), and the server's, called after the client's DREQ, with the
 * DISCONNECTED that reported it. Prints "ok" when no CHECK failed. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include "check.h"

static const char *port;
static pthread_barrier_t listening, received;

static struct rdma_addrinfo *info(int passive)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res = NULL;
	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	CHECK(rdma_getaddrinfo("127.0.0.1", port, &hints, &res) == 0, "getaddrinfo: %s",
	      strerror(errno));
	return res;
}

static void *server(void *unused)
{
	(void)unused;
	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						  .max_send_sge = 1, .max_recv_sge = 1 },
					 .sq_sig_all = 1 };
	struct rdma_addrinfo *res = info(1);
	struct rdma_cm_id *listen_id = NULL, *id = NULL;
	char buf[16] = { 0 };
	struct ibv_wc wc;
	CHECK(res && rdma_create_ep(&listen_id, res, NULL, &attr) == 0, "create_ep: %s",
	      strerror(errno));
	CHECK(listen_id && rdma_listen(listen_id, 1) == 0, "listen: %s", strerror(errno));
	pthread_barrier_wait(&listening);
	if (!listen_id)
		return NULL;
	CHECK(rdma_get_request(listen_id, &id) == 0, "get_request: %s", strerror(errno));
	if (!id) {
		pthread_barrier_wait(&received);
		return NULL;
	}
	struct ibv_mr *mr = rdma_reg_msgs(id, buf, sizeof buf);
	CHECK(mr && rdma_post_recv(id, NULL, buf, sizeof buf, mr) == 0, "post_recv");
	CHECK(rdma_accept(id, NULL) == 0, "accept: %s", strerror(errno));
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ESTABLISHED,
	      "accept returned with %s", id->event ? rdma_event_str(id->event->event) : "no event");
	CHECK(rdma_get_recv_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
		      strcmp(buf, "hello") == 0,
	      "the client's SEND: status %d, \"%s\"", wc.status, buf);
	pthread_barrier_wait(&received);
	/* The client disconnects first; once its DREQ came, ours answers. */
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	for (int i = 0; i < 2000; i++) {
		if (ibv_query_qp(id->qp, &qa, IBV_QP_STATE, &qia) == 0 && qa.qp_state == IBV_QPS_ERR)
			break;
		struct timespec ms = { 0, 1000000 };
		nanosleep(&ms, NULL);
	}
	CHECK(rdma_disconnect(id) == 0, "server disconnect: %s", strerror(errno));
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_DISCONNECTED,
	      "server disconnect returned with %s",
	      id->event ? rdma_event_str(id->event->event) : "no event");
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	rdma_freeaddrinfo(res);
	return NULL;
}

int main(int argc, char **argv)
{
	port = argc > 1 ? argv[1] : "23000";
	pthread_barrier_init(&listening, NULL, 2);
	pthread_barrier_init(&received, NULL, 2);
	pthread_t t;
	pthread_create(&t, NULL, server, NULL);
	pthread_barrier_wait(&listening);

	struct ibv_qp_init_attr attr = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						  .max_send_sge = 1, .max_recv_sge = 1,
						  .max_inline_data = 16 },
					 .sq_sig_all = 1 };
	struct rdma_addrinfo *res = info(0);
	struct rdma_cm_id *id = NULL;
	struct ibv_wc wc;
	CHECK(res && rdma_create_ep(&id, res, NULL, &attr) == 0, "create_ep: %s", strerror(errno));
	if (id) {
		CHECK(rdma_connect(id, NULL) == 0, "connect: %s", strerror(errno));
		CHECK(id->event && id->event->event == RDMA_CM_EVENT_ESTABLISHED,
		      "connect returned with %s",
		      id->event ? rdma_event_str(id->event->event) : "no event");
		char msg[] = "hello";
		CHECK(rdma_post_send(id, NULL, msg, sizeof msg, NULL, IBV_SEND_INLINE) == 0,
		      "post_send: %s", strerror(errno));
		CHECK(rdma_get_send_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS,
		      "send completion: %d", wc.status);
	}
	pthread_barrier_wait(&received);
	if (id) {
		CHECK(rdma_disconnect(id) == 0, "client disconnect: %s", strerror(errno));
		CHECK(id->event && id->event->event == RDMA_CM_EVENT_DISCONNECTED,
		      "client disconnect returned with %s",
		      id->event ? rdma_event_str(id->event->event) : "no event");
	}
	pthread_join(t, NULL);
	if (id)
		rdma_destroy_ep(id);
	rdma_freeaddrinfo(res);
	if (failures)
		return 1;
	printf("ok\n");
	return 0;
}
