/* rdma_resolve_addr to an address the host has no route to fails at once
 * with ENETUNREACH, as on the kernel's rdma_cm (run in a network
 * namespace with only loopback up). Prints "ok" when it does. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

int main(void)
{
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(7471) };
	inet_pton(AF_INET, "10.99.99.99", &dst.sin_addr);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) != 0) {
		fprintf(stderr, "create_id: %s\n", strerror(errno));
		return 2;
	}
	errno = 0;
	int r = rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000);
	if (r != -1 || errno != ENETUNREACH) {
		fprintf(stderr, "resolve_addr to 10.99.99.99: %d, errno %d (%s)\n", r, errno,
			strerror(errno));
		return 1;
	}
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("ok\n");
	return 0;
}
