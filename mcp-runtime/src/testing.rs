//! Test support above mcp-core's: the shared flags as a user gets them.

use crate::cli::CommonArgs;

/// Common flags for tests: every default, as a user running the binary gets them (coalescing
/// on too), except both ports on 127.0.0.1:0.
pub fn test_args() -> CommonArgs {
    #[derive(clap::Parser)]
    struct Defaults {
        #[command(flatten)]
        common: CommonArgs,
    }
    <Defaults as clap::Parser>::parse_from([
        "test",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .common
}

/// An empty sync board counting into a gauge of its own (admin tests).
pub fn sync_board() -> std::sync::Arc<mcp_server::sync_status::SyncBoard> {
    let gauge = prometheus::IntGaugeVec::new(
        prometheus::Opts::new("mcp_adapter_sink_subscriptions", "test"),
        &["protocol", "state"],
    )
    .expect("gauge");
    mcp_server::sync_status::SyncBoard::new(gauge)
}
