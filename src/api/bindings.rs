//! The dashboard's API types, generated from the Rust types that serialise them (with ts-rs), so the
//! two cannot drift. `ui/src/lib/api/generated.ts` is this module's output, committed so the dashboard
//! builds without cargo; the test below fails when it is stale and says how to write it again:
//! `SHOAL_WRITE_BINDINGS=1 cargo test --release --lib api::bindings`.
//!
//! Integers are `number`: every u64 the API sends (bytes, milliseconds since the epoch, counts) stays
//! far below 2^53, where a JavaScript number is exact.

use std::path::PathBuf;
use ts_rs::{Config, TS};

/// Where the generated file lives, from the crate's root.
const GENERATED: &str = "ui/src/lib/api/generated.ts";

/// One exported declaration with its doc comment.
fn declaration<T: TS>(config: &Config) -> String {
    let docs = T::docs().map(|d| format!("{}\n", d.trim_end())).unwrap_or_default();
    format!("{docs}export {}\n", T::decl(config))
}

/// The declarations of every type the dashboard reads or sends, in dependency order.
macro_rules! declarations {
    ($config:expr; $($t:ty),* $(,)?) => { [$(declaration::<$t>($config)),*] };
}

/// The whole generated file.
pub fn typescript() -> String {
    use crate::{api, cluster, engine, instances, links, model, node, placement, rdma, records, transport, worker};
    let config = Config::new().with_large_int("number");
    let parts = declarations![&config;
        // Nodes, links and the pool (GET /api/cluster).
        node::NodeId,
        cluster::health::PeerStatus,
        cluster::health::NodeStatus,
        rdma::checks::Verdict,
        rdma::checks::Check,
        rdma::checks::ThunderboltLink,
        rdma::parse::MacOsVersion,
        rdma::checks::NodeReport,
        node::telemetry::DeviceMemory,
        node::telemetry::DeviceTelemetry,
        engine::weight_rate::WeightRate,
        node::telemetry::NodeTelemetry,
        cluster::state::NodeView,
        links::kind::LinkKind,
        transport::select::LinkTransport,
        links::LinkReport,
        cluster::state::LinkView,
        cluster::state::PoolView,
        cluster::state::NearbyNodeView,
        cluster::state::NearbyCluster,
        cluster::state::ClusterSnapshot,
        api::cluster::CodeResponse,
        api::cluster::JoinRequest,
        // Instances and placement (GET /api/instances, POST /api/instances/preview).
        records::InstanceState,
        records::Recovery,
        worker::protocol::WorkerState,
        placement::StageBytes,
        crate::engine::StageMemory,
        worker::protocol::StageStats,
        records::StageFetch,
        model::slice::TensorSlice,
        records::StageStatus,
        placement::StagePlan,
        placement::Parallelism,
        placement::Alternative,
        placement::Plan,
        records::InstanceInfo,
        engine::KvType,
        engine::Speculation,
        records::LaunchRequest,
        instances::ShareNeed,
        api::instances::Preview,
        worker::protocol::GenerationReport,
        crate::metrics::ClusterRates,
        // RDMA over Thunderbolt across the cluster, and this node's setup wizard.
        rdma::cluster::Cable,
        rdma::cluster::NodeRdma,
        rdma::cluster::ClusterRdma,
        rdma::wizard::Step,
        rdma::fixes::FixId,
        rdma::fixes::FixOutcome,
        rdma::wizard::WizardState,
        rdma::wizard::StepStatus,
        rdma::wizard::StepView,
        rdma::wizard::DoctorSummary,
        rdma::fixes::Fix,
        rdma::wizard::VerifyResult,
        rdma::wizard::Verification,
        rdma::wizard::WizardView,
        api::rdma::WizardResponse,
        rdma::wizard::Action,
        // The model library, downloads and copies between nodes.
        model::library::ModelSource,
        model::library::ShardSummary,
        model::library::LibraryModel,
        instances::Fit,
        api::fit::ModelFit,
        model::pull::PullState,
        model::pull::PullProgress,
        model::pull::PullRequest,
        api::models::PullBody,
        api::models::PullStarted,
        model::peer_copy::OfferedFile,
        api::copy::NodeFiles,
        api::copy::CopyRequest,
        api::copy::CopyStarted,
        model::peer_copy::CopyProgress,
        model::peer_copy::CopyReport,
        // Quitting the app (GET /api/quit).
        crate::desktop::quit::Stopped,
        api::quit::QuitImpact,
        // Every change, on /api/events.
        cluster::state::ClusterEvent,
    ];
    let mut out = String::from(
        "// Generated from the Rust types by src/api/bindings.rs: do not edit. To write it again:\n\
         // SHOAL_WRITE_BINDINGS=1 cargo test --release --lib api::bindings\n",
    );
    for part in parts {
        out.push('\n');
        out.push_str(&part);
    }
    out
}

fn generated_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(GENERATED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboards_types_are_the_rust_types() {
        let want = typescript();
        let path = generated_path();
        if std::env::var_os("SHOAL_WRITE_BINDINGS").is_some() {
            std::fs::write(&path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{GENERATED} is not what the Rust types serialise: run \
             `SHOAL_WRITE_BINDINGS=1 cargo test --release --lib api::bindings`, then fix what the dashboard's \
             type check (`npm --prefix ui run check`) finds"
        );
    }

    /// The dashboard's tests run on recorded API answers (`ui/tests/fixtures`): each must be exactly what
    /// the Rust type serialises (read back and written again, nothing added, lost or renamed).
    #[test]
    fn the_dashboards_fixtures_are_what_the_api_serialises() {
        fn round_trip<T: serde::Serialize + serde::de::DeserializeOwned>(name: &str) {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ui/tests/fixtures").join(name);
            let text = std::fs::read_to_string(&path).unwrap();
            let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
            let typed: T = serde_json::from_value(fixture.clone())
                .unwrap_or_else(|e| panic!("{name} is not a {}: {e}", std::any::type_name::<T>()));
            let written = serde_json::to_value(&typed).unwrap();
            assert_eq!(written, fixture, "{name} differs from what the API would send for it");
        }
        round_trip::<crate::cluster::state::ClusterSnapshot>("cluster.json");
        round_trip::<Vec<crate::records::InstanceInfo>>("instances.json");
        round_trip::<Vec<crate::api::copy::NodeFiles>>("models-cluster.json");
        round_trip::<Vec<crate::api::fit::ModelFit>>("models-fit.json");
        round_trip::<crate::rdma::cluster::ClusterRdma>("rdma.json");
        round_trip::<crate::rdma::wizard::WizardView>("wizard.json");
    }

    #[test]
    fn integers_are_numbers_and_every_reference_is_declared() {
        let ts = typescript();
        assert!(!ts.contains("bigint"), "a u64 became a bigint");
        let declared: std::collections::BTreeSet<&str> = ts
            .lines()
            .filter_map(|l| l.strip_prefix("export type "))
            .filter_map(|l| l.split([' ', '<']).next())
            .collect();
        // Every capitalised identifier used in a type position is one declared here.
        for line in ts.lines().filter(|l| !l.trim_start().starts_with(['/', '*'])) {
            let outside_strings: String = line.split('"').step_by(2).collect::<Vec<_>>().join(" ");
            for word in outside_strings.split(|c: char| !c.is_ascii_alphanumeric() && c != '_') {
                let looks_like_a_type = word.chars().next().is_some_and(|c| c.is_ascii_uppercase());
                if looks_like_a_type && !declared.contains(word) && !["Array", "Record", "Partial"].contains(&word) {
                    panic!("{word} is used but not declared: add it to typescript()");
                }
            }
        }
    }
}
