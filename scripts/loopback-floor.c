/*
 * loopback-floor: what the kernel alone costs for the datagrams of a stream
 * of 64 KiB RDMA WRITEs at a 4 KiB MTU, next to a TCP stream of 64 KiB
 * writes, on the loopback interface. No RDMA work is done: no headers, no
 * ICRC, no transport, no ACKs (the receiver returns a credit every 8
 * messages). It is the floor under `rverbs bench --tests write --sizes 65536`.
 *
 * Usage: loopback-floor MODE MESSAGES
 *   udp    a 4128-byte datagram (the RETH packet) and a UDP GSO datagram of
 *          15 x 4112 bytes per message, as rverbs sends one WRITE
 *   udp1   only the 15-packet GSO datagram per message (what one datagram
 *          per WRITE would cost)
 *   tcp    a TCP stream written 64 KiB at a time
 * Pin with taskset to compare placements (e.g. `taskset -c 0` puts both
 * ends on one core). Prints GB/s of payload-sized bytes moved.
 * Run through scripts/loopback-floor, which builds it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum { RETH_PACKET = 4128, PACKET = 4112, PACKETS = 15, WINDOW = 32, CREDIT_EVERY = 8 };

static char payload[1 << 17];

static double seconds(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static struct sockaddr_in loopback(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	return a;
}

static int bound(int type, struct sockaddr_in *a)
{
	socklen_t len = sizeof *a;
	int fd = socket(AF_INET, type, 0);
	if (fd < 0 || bind(fd, (void *)a, sizeof *a) || getsockname(fd, (void *)a, &len))
		die("socket");
	return fd;
}

static double tcp(long messages)
{
	struct sockaddr_in a = loopback();
	int listener = bound(SOCK_STREAM, &a);
	if (listen(listener, 1))
		die("listen");
	if (fork() == 0) {
		int s = accept(listener, 0, 0);
		static char in[1 << 20];
		while (read(s, in, sizeof in) > 0)
			;
		_exit(0);
	}
	int c = socket(AF_INET, SOCK_STREAM, 0);
	if (c < 0 || connect(c, (void *)&a, sizeof a))
		die("connect");
	double start = seconds();
	for (long i = 0; i < messages; i++)
		for (size_t done = 0; done < 65536;) {
			ssize_t n = write(c, payload + done, 65536 - done);
			if (n < 0)
				die("write");
			done += (size_t)n;
		}
	close(c);
	wait(0);
	return messages * 65536.0 / (seconds() - start);
}

/* One datagram in `m`, as a GSO send of `segment`-byte segments if nonzero. */
static void datagram(struct msghdr *m, struct iovec *iov, char *control, struct sockaddr_in *to,
		     size_t len, int segment)
{
	memset(m, 0, sizeof *m);
	iov->iov_base = payload;
	iov->iov_len = len;
	m->msg_name = to;
	m->msg_namelen = sizeof *to;
	m->msg_iov = iov;
	m->msg_iovlen = 1;
	if (segment) {
		m->msg_control = control;
		m->msg_controllen = CMSG_SPACE(sizeof(uint16_t));
		struct cmsghdr *c = CMSG_FIRSTHDR(m);
		c->cmsg_level = SOL_UDP;
		c->cmsg_type = UDP_SEGMENT;
		c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
		uint16_t size = (uint16_t)segment;
		memcpy(CMSG_DATA(c), &size, sizeof size);
	}
}

static double udp(long messages, int with_reth_packet)
{
	struct sockaddr_in rx_addr = loopback(), tx_addr = loopback();
	int rx = bound(SOCK_DGRAM, &rx_addr), tx = bound(SOCK_DGRAM, &tx_addr);
	int one = 1, buffer = 16 << 20, df = IP_PMTUDISC_DO;
	setsockopt(rx, SOL_UDP, UDP_GRO, &one, sizeof one);
	setsockopt(rx, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer);
	setsockopt(tx, IPPROTO_IP, IP_MTU_DISCOVER, &df, sizeof df);
	long per_message = PACKETS * PACKET + (with_reth_packet ? RETH_PACKET : 0);
	if (fork() == 0) {
		static char in[65536];
		long got = 0, credited = 0;
		while (got < messages * per_message) {
			ssize_t n = recv(rx, in, sizeof in, MSG_DONTWAIT);
			if (n <= 0)
				continue;
			got += n;
			long done = got / per_message;
			if (done / CREDIT_EVERY > credited / CREDIT_EVERY)
				sendto(rx, &done, sizeof done, 0, (void *)&tx_addr, sizeof tx_addr);
			credited = done;
		}
		_exit(0);
	}
	double start = seconds();
	long limit = WINDOW;
	for (long sent = 0; sent < messages;) {
		long done;
		while (recv(tx, &done, sizeof done, MSG_DONTWAIT) == sizeof done)
			limit = done + WINDOW;
		if (sent >= limit)
			continue;
		struct mmsghdr m[2];
		struct iovec iov[2];
		char control[2][CMSG_SPACE(sizeof(uint16_t))];
		unsigned n = 0;
		if (with_reth_packet)
			datagram(&m[n].msg_hdr, &iov[n], control[n], &rx_addr, RETH_PACKET, 0), n++;
		datagram(&m[n].msg_hdr, &iov[n], control[n], &rx_addr, PACKETS * PACKET, PACKET), n++;
		for (unsigned off = 0; off < n;) {
			int r = sendmmsg(tx, m + off, n - off, 0);
			if (r > 0)
				off += (unsigned)r;
		}
		sent++;
	}
	wait(0);
	return messages * (double)per_message / (seconds() - start);
}

int main(int argc, char **argv)
{
	if (argc != 3 || atol(argv[2]) <= 0) {
		fprintf(stderr, "usage: %s udp|udp1|tcp MESSAGES\n", argv[0]);
		return 2;
	}
	memset(payload, 0x5a, sizeof payload);
	long messages = atol(argv[2]);
	double rate;
	if (!strcmp(argv[1], "tcp"))
		rate = tcp(messages);
	else if (!strcmp(argv[1], "udp"))
		rate = udp(messages, 1);
	else if (!strcmp(argv[1], "udp1"))
		rate = udp(messages, 0);
	else {
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		return 2;
	}
	printf("%-5s %.3f GB/s\n", argv[1], rate / 1e9);
	return 0;
}
