/* The check the C tests share: a failed CHECK counts in `failures` and
 * prints where and why; the test goes on and reports at the end. */
#ifndef RVERBS_TEST_CHECK_H
#define RVERBS_TEST_CHECK_H
#include <stdio.h>

static int failures;
#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			failures++;                                        \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__,      \
				__LINE__, #cond);                          \
			fprintf(stderr, __VA_ARGS__);                      \
			fprintf(stderr, "\n");                             \
		}                                                          \
	} while (0)

#endif
