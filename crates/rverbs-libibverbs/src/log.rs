//! `RVERBS_LOG`: the library's tracing events (a device coming up, a
//! refused GSO send, an assumed MTU, a poller that stopped parking …) go
//! to stderr, filtered with tracing's env-filter syntax (`debug`,
//! `rverbs::soft::engine=trace`, …); unset, warnings and errors only. Set
//! up once, when the library is loaded; a program that installed its own
//! tracing subscriber keeps it.

/// Installs the stderr subscriber `RVERBS_LOG` asks for.
pub(crate) fn init() {
    let _ = std::panic::catch_unwind(|| {
        use tracing_subscriber::EnvFilter;
        let filter = match std::env::var("RVERBS_LOG") {
            Ok(spec) => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
                eprintln!("rverbs: RVERBS_LOG={spec:?} is not a filter ({e}); logging warnings");
                EnvFilter::new("warn")
            }),
            Err(_) => EnvFilter::new("warn"),
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    });
}
