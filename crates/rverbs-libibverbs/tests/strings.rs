//! The string and rate helpers answer exactly as Debian's libibverbs does:
//! one C program, run against both libraries, must print the same lines.

mod common;

use std::process::Command;

const PROGRAM: &str = r#"
#include <stdio.h>
#include <infiniband/verbs.h>
int main(void) {
    for (int i = -2; i < 40; i++) {
        printf("wc %d %s\n", i, ibv_wc_status_str((enum ibv_wc_status)i));
        printf("event %d %s\n", i, ibv_event_type_str((enum ibv_event_type)i));
        printf("node %d %s\n", i, ibv_node_type_str((enum ibv_node_type)i));
        printf("port %d %s\n", i, ibv_port_state_str((enum ibv_port_state)i));
        printf("rate %d mult %d mbps %d\n", i, ibv_rate_to_mult((enum ibv_rate)i),
               ibv_rate_to_mbps((enum ibv_rate)i));
    }
    int mults[] = {-1, 0, 1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64};
    for (unsigned i = 0; i < sizeof mults / sizeof *mults; i++)
        printf("mult_to_rate %d %d\n", mults[i], mult_to_ibv_rate(mults[i]));
    int mbps[] = {0, 2500, 5000, 10000, 14062, 25781, 56250, 103125, 637500, 12345};
    for (unsigned i = 0; i < sizeof mbps / sizeof *mbps; i++)
        printf("mbps_to_rate %d %d\n", mbps[i], mbps_to_ibv_rate(mbps[i]));
    return 0;
}
"#;

#[test]
fn string_and_rate_helpers_match_debians() {
    let dir = common::LibDir::new("strings");
    let Some(exe) = common::compile_c(&dir.0, "strings", PROGRAM) else {
        return;
    };
    let theirs = Command::new(&exe).output().unwrap();
    let ours = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &dir.0)
        .output()
        .unwrap();
    assert!(theirs.status.success() && ours.status.success());
    let (theirs, ours) = (
        String::from_utf8_lossy(&theirs.stdout),
        String::from_utf8_lossy(&ours.stdout),
    );
    assert!(theirs.lines().count() > 200);
    for (t, o) in theirs.lines().zip(ours.lines()) {
        assert_eq!(o, t, "ours vs Debian's");
    }
    assert_eq!(theirs.lines().count(), ours.lines().count());
}
