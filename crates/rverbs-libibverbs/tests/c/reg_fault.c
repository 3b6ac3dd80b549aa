/* Registering memory the program has not mapped is EFAULT, as pinning the
 * pages is on hardware (issue 14, item 4) — not a success that crashes the
 * process at a peer's first READ:
 *  - ibv_reg_mr, ibv_reg_mr_iova and ibv_reg_mr_iova2 over an munmap'ed
 *    range, a range with an munmap'ed page in it, and a PROT_NONE range
 *    return NULL with errno EFAULT;
 *  - so does any of them asking for write access (LOCAL_WRITE,
 *    REMOTE_WRITE) to a read-only mapping, which registers without it;
 *  - ibv_rereg_mr onto an munmap'ed range is IBV_REREG_MR_ERR_CMD with
 *    errno EFAULT, and the MR is as it was;
 *  - nothing is left behind: the PD deallocates, the context closes
 *    (RVERBS_LEAK_CHECK=1 reports nothing).
 * Prints "ALL OK" and exits 0 when every check holds. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>

#include "check.h"

#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* Each way to register, tried on `addr`+`len` with `access`: all must fail
 * with EFAULT. */
static void refused(struct ibv_pd *pd, void *addr, size_t len, int access,
		    const char *what)
{
	errno = 0;
	struct ibv_mr *m = ibv_reg_mr(pd, addr, len, access);
	CHECK(!m && errno == EFAULT, "ibv_reg_mr over %s: %p, errno %d", what,
	      (void *)m, errno);
	errno = 0;
	m = ibv_reg_mr_iova(pd, addr, len, 0x10000 | ((uintptr_t)addr & 0xfff), access);
	CHECK(!m && errno == EFAULT, "ibv_reg_mr_iova over %s: %p, errno %d",
	      what, (void *)m, errno);
	errno = 0;
	m = ibv_reg_mr_iova2(pd, addr, len, (uintptr_t)addr, (unsigned)access);
	CHECK(!m && errno == EFAULT, "ibv_reg_mr_iova2 over %s: %p, errno %d",
	      what, (void *)m, errno);
}

int main(void)
{
	alarm(20);
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct ibv_context *ctx = devs ? ibv_open_device(devs[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		fprintf(stderr, "FAIL: open/pd: errno %d\n", errno);
		return 1;
	}
	/* Pages: 0 RW, 1 unmapped, 2 PROT_NONE, 3 read-only. */
	char *m = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED || munmap(m + pg, pg) ||
	    mprotect(m + 2 * pg, pg, PROT_NONE) ||
	    mprotect(m + 3 * pg, pg, PROT_READ)) {
		fprintf(stderr, "FAIL: mmap\n");
		return 1;
	}
	refused(pd, m + pg, pg, IBV_ACCESS_LOCAL_WRITE, "an munmap'ed page");
	refused(pd, m + pg + 64, 64, 0, "64 bytes of an munmap'ed page");
	refused(pd, m, 2 * pg, RW, "a range with an munmap'ed page");
	refused(pd, m + 2 * pg, pg, 0, "a PROT_NONE page");
	refused(pd, m + 2 * pg, pg, IBV_ACCESS_REMOTE_READ, "a PROT_NONE page");
	refused(pd, m + 3 * pg, pg, IBV_ACCESS_LOCAL_WRITE, "read-only memory");
	refused(pd, m + 3 * pg, pg, RW, "read-only memory");

	struct ibv_mr *ro = ibv_reg_mr(pd, m + 3 * pg, pg, IBV_ACCESS_REMOTE_READ);
	CHECK(ro, "read-only memory for REMOTE_READ: errno %d", errno);
	struct ibv_mr *mr = ibv_reg_mr(pd, m, pg, RW);
	CHECK(mr, "the mapped page: errno %d", errno);
	if (mr) {
		uint32_t lkey = mr->lkey;
		errno = 0;
		int rc = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL,
				      m + pg, pg, 0);
		CHECK(rc == IBV_REREG_MR_ERR_CMD && errno == EFAULT,
		      "rereg onto an munmap'ed page: %d, errno %d", rc, errno);
		CHECK(mr->lkey == lkey && mr->addr == m && mr->length == pg,
		      "the refused rereg changed the MR");
		CHECK(!ibv_dereg_mr(mr), "dereg");
	}
	if (ro)
		CHECK(!ibv_dereg_mr(ro), "dereg read-only");
	/* Nothing a refused registration made holds the PD. */
	CHECK(!ibv_dealloc_pd(pd), "dealloc_pd: errno %d", errno);
	CHECK(!ibv_close_device(ctx), "close");
	ibv_free_device_list(devs);
	if (failures) {
		fprintf(stderr, "%d check(s) failed\n", failures);
		return 1;
	}
	printf("ALL OK\n");
	return 0;
}
