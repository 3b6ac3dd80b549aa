//! An unmodified C program built against Debian's `<rdma/rdma_cma.h>` and
//! linked with `-lrdmacm` runs on the built libraries (LD_LIBRARY_PATH →
//! `librdmacm.so.1` → `target/<profile>/librdmacm.so`, and `libibverbs.so.1`
//! → `target/<profile>/libibverbs.so`, whose rdma_cm librdmacm forwards to):
//! `rdma_event_str` answers exactly as Debian's does, and the calls make
//! real channels, ids and device lists. With Debian's libibverbs
//! instead, every call fails with ENOSYS and librdmacm says why, once.

mod common;

const PROGRAM: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static const char *errno_name(int e)
{
	return e == ENOSYS ? "ENOSYS" : strerror(e);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "strings") == 0) {
		for (int i = -2; i < 20; i++)
			printf("%d %s\n", i, rdma_event_str((enum rdma_cm_event_type)i));
		return 0;
	}
	printf("%s\n", rdma_event_str(RDMA_CM_EVENT_ESTABLISHED));

	errno = 0;
	struct rdma_event_channel *channel = rdma_create_event_channel();
	printf("rdma_create_event_channel %s %s\n", channel ? "non-NULL" : "NULL",
	       channel ? "" : errno_name(errno));

	struct rdma_cm_id *id = NULL;
	errno = 0;
	int ret = rdma_create_id(channel, &id, NULL, RDMA_PS_TCP);
	printf("rdma_create_id %d %s\n", ret, ret ? errno_name(errno) : "");

	int n = 7;
	errno = 0;
	struct ibv_context **devices = rdma_get_devices(&n);
	printf("rdma_get_devices %s %s\n", devices ? "non-NULL" : "NULL",
	       devices ? "" : errno_name(errno));

	/* The void calls do nothing with what they were never given. */
	rdma_free_devices(devices);
	if (id)
		rdma_destroy_id(id);
	rdma_freeaddrinfo(NULL);
	rdma_destroy_event_channel(channel);
	printf("done\n");
	return 0;
}
"#;

#[test]
fn a_c_program_runs_on_the_libraries() {
    let dir = common::LibDir::new("skeleton");
    let Some(exe) = common::compile_c(&dir.0, "skeleton", PROGRAM) else {
        return;
    };
    let (ok, out) = common::run_program(&exe, &[], Some(&dir.0));
    assert!(ok, "the program failed:\n{out}");
    // A channel, an id and the device list, on the rdma_cm inside our
    // libibverbs (Debian's would fail here: no kernel RDMA device).
    let want = "RDMA_CM_EVENT_ESTABLISHED\n\
                rdma_create_event_channel non-NULL \n\
                rdma_create_id 0 \n\
                rdma_get_devices non-NULL \n\
                done\n";
    assert_eq!(out, want);
}

#[test]
fn rdma_event_str_matches_debians() {
    let dir = common::LibDir::new("strings");
    let Some(exe) = common::compile_c(&dir.0, "strings", PROGRAM) else {
        return;
    };
    let (theirs_ok, theirs) = common::run_program(&exe, &["strings"], None);
    let (ours_ok, ours) = common::run_program(&exe, &["strings"], Some(&dir.0));
    assert!(theirs_ok && ours_ok, "Debian's:\n{theirs}\nours:\n{ours}");
    assert_eq!(theirs.lines().count(), 22, "Debian's:\n{theirs}");
    assert!(theirs.contains("9 RDMA_CM_EVENT_ESTABLISHED\n"), "{theirs}");
    assert_eq!(ours, theirs, "ours vs Debian's");
}

/// Debian's libibverbs, which has no rdma_cm table for our librdmacm.
const DEBIAN_LIBIBVERBS: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

#[test]
fn with_debians_libibverbs_every_call_fails_with_enosys_and_says_why_once() {
    if !std::path::Path::new(DEBIAN_LIBIBVERBS).exists() {
        common::skip(&format!("needs Debian's libibverbs1 ({DEBIAN_LIBIBVERBS})"));
        return;
    }
    let dir = common::LibDir::with("debian-ibverbs", std::path::Path::new(DEBIAN_LIBIBVERBS));
    let Some(exe) = common::compile_c(&dir.0, "debian_ibverbs", PROGRAM) else {
        return;
    };
    let (ok, out) = common::run_program(&exe, &[], Some(&dir.0));
    assert!(ok, "the program failed (crashed?):\n{out}");
    // No table, so no event names either: rdma_event_str gives the answer
    // for a value that is no event rather than NULL.
    let stdout = "UNKNOWN EVENT\n\
                  rdma_create_event_channel NULL ENOSYS\n\
                  rdma_create_id -1 ENOSYS\n\
                  rdma_get_devices NULL ENOSYS\n\
                  done\n";
    let stderr = out
        .strip_prefix(stdout)
        .unwrap_or_else(|| panic!("want stdout {stdout:?}, got:\n{out}"));
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "want one line on stderr, got:\n{stderr}");
    let why = lines[0]
        .strip_prefix("librdmacm (rverbs): libibverbs.so.1 is not rverbs' drop-in (")
        .and_then(|l| l.strip_suffix("); rdma_cm calls fail with ENOSYS"))
        .unwrap_or_else(|| panic!("unexpected stderr line: {}", lines[0]));
    assert!(
        why.contains("__rverbs_rdmacm_ops"),
        "the reason should name the missing symbol: {why}"
    );
}

/// `rdma_getaddrinfo` with neither node nor service takes the addresses
/// from the hints, as rdma-core's does (libfabric's verbs provider asks
/// so for its source and destination addresses; with EINVAL, fi_getinfo
/// found no verbs endpoint to 192.0.2.2).
const ADDRINFO_FROM_HINTS: &str = r#"
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static void show(const char *what, struct sockaddr *sa, socklen_t len)
{
	char host[64] = "-";
	int port = -1;
	if (sa && sa->sa_family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)sa;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
		port = ntohs(in->sin_port);
	}
	printf(" %s %s:%d/%u", what, host, port, (unsigned)len);
}

int main(void)
{
	struct sockaddr_in src = { .sin_family = AF_INET, .sin_port = htons(7471) };
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(7472) };
	inet_pton(AF_INET, "127.0.0.1", &src.sin_addr);
	inet_pton(AF_INET, "127.0.0.2", &dst.sin_addr);
	struct rdma_addrinfo hints, *res;

	memset(&hints, 0, sizeof hints);
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_src_addr = (struct sockaddr *)&src;
	hints.ai_src_len = sizeof src;
	int ret = rdma_getaddrinfo(NULL, NULL, &hints, &res);
	printf("passive %d", ret);
	if (!ret) {
		printf(" flags %d ps %d", res->ai_flags, res->ai_port_space);
		show("src", res->ai_src_addr, res->ai_src_len);
		show("dst", res->ai_dst_addr, res->ai_dst_len);
		rdma_freeaddrinfo(res);
	}
	printf("\n");

	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_src_addr = (struct sockaddr *)&src;
	hints.ai_src_len = sizeof src;
	hints.ai_dst_addr = (struct sockaddr *)&dst;
	hints.ai_dst_len = sizeof dst;
	ret = rdma_getaddrinfo(NULL, NULL, &hints, &res);
	printf("active %d", ret);
	if (!ret) {
		printf(" flags %d ps %d", res->ai_flags, res->ai_port_space);
		show("src", res->ai_src_addr, res->ai_src_len);
		show("dst", res->ai_dst_addr, res->ai_dst_len);
		rdma_freeaddrinfo(res);
	}
	printf("\n");

	/* No node, service nor hints: EINVAL. */
	ret = rdma_getaddrinfo(NULL, NULL, NULL, &res);
	printf("nothing %d\n", ret);
	return 0;
}
"#;

#[test]
fn rdma_getaddrinfo_takes_the_addresses_from_the_hints() {
    let dir = common::LibDir::new("addrinfo-hints");
    let Some(exe) = common::compile_c(&dir.0, "addrinfo_hints", ADDRINFO_FROM_HINTS) else {
        return;
    };
    let (ok, out) = common::run_program(&exe, &[], Some(&dir.0));
    assert!(ok, "the program failed:\n{out}");
    assert_eq!(
        out,
        "passive 0 flags 1 ps 262 src 127.0.0.1:7471/16 dst -:-1/0\n\
         active 0 flags 0 ps 262 src 127.0.0.1:7471/16 dst 127.0.0.2:7472/16\n\
         nothing -1\n"
    );
}
