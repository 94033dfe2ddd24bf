//! RDMA endpoints: `GET /api/rdma` (the doctor of every node and the cluster's own checks),
//! `GET /api/rdma/wizard` and `POST /api/rdma/wizard` (the guided setup on this node).

use super::{ApiError, ApiState};
use crate::rdma::fixes::{FixOutcome, SystemRunner};
use crate::rdma::wizard::{self, Action, Step, Wizard, WizardError, WizardView};
use crate::rdma::{Captures, NodeReport};
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::Json;
use serde::Serialize;

/// The RDMA doctor of every node, and the cluster's own checks (same build, full mesh).
pub async fn rdma(State(state): State<ApiState>) -> Json<crate::rdma::ClusterRdma> {
    let snapshot = state.agent.snapshot();
    let nodes = snapshot
        .nodes
        .iter()
        .map(|n| crate::rdma::NodeRdma {
            node: n.id,
            name: n.name.clone(),
            report: n.telemetry.as_ref().and_then(|t| t.rdma.as_deref().cloned()),
        })
        .collect();
    Json(crate::rdma::assess(nodes))
}

/// One wizard request at a time on this node (they read and write its state file).
static WIZARD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This node's doctor report: the agent's latest, or a fresh run when `fresh` (verification, after a
/// fix) or when the agent has none yet.
async fn report(state: &ApiState, fresh: bool) -> Result<NodeReport, ApiError> {
    if !fresh {
        let me = state.agent.id();
        let cached = state.agent.snapshot().nodes.into_iter().find(|n| n.id == me).and_then(|n| n.telemetry?.rdma);
        if let Some(report) = cached {
            return Ok(*report);
        }
    }
    tokio::task::spawn_blocking(|| crate::rdma::doctor(&Captures::live()))
        .await
        .map_err(|e| ApiError::unavailable(format!("the RDMA doctor stopped: {e}")))
}

async fn view(state: &ApiState, wizard: &Wizard, fresh: bool) -> Result<WizardView, ApiError> {
    let report = report(state, fresh || wizard.state().step == Step::Verify).await?;
    Ok(wizard.view(&report))
}

/// The setup's state, its steps, the doctor in brief, the fixes on offer and, at the last step, the
/// verification.
pub async fn wizard(State(state): State<ApiState>) -> Result<Json<WizardView>, ApiError> {
    let _one = WIZARD.lock().await;
    let wizard = Wizard::load(&state.agent.config.data_dir, wizard::boot_time());
    Ok(Json(view(&state, &wizard, false).await?))
}

#[derive(Serialize, ts_rs::TS)]
pub struct WizardResponse {
    #[serde(flatten)]
    view: WizardView,
    /// What became of the fix asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[ts(optional)]
    outcome: Option<FixOutcome>,
}

/// `{"action": "start" | "next" | "back" | "reset" | "apply_fix", "fix": "thunderbolt_bridge" |
/// "link_local_ipv4"}`.
pub async fn wizard_action(
    State(state): State<ApiState>,
    body: Result<Json<Action>, JsonRejection>,
) -> Result<Json<WizardResponse>, ApiError> {
    let Json(action) = body.map_err(|e| {
        ApiError::bad_request(format!(
            "expected {{\"action\": \"start\" | \"next\" | \"back\" | \"reset\" | \"apply_fix\", \"fix\": ID}}: {e}"
        ))
    })?;
    let _one = WIZARD.lock().await;
    let boot_time = wizard::boot_time();
    let mut wizard = Wizard::load(&state.agent.config.data_dir, boot_time);
    let fixing = matches!(action, Action::ApplyFix { .. });
    let before = report(&state, fixing).await?;
    // The administrator prompt waits for the user: off the async threads.
    let (wizard, outcome) = tokio::task::spawn_blocking(move || {
        let outcome = wizard.act(&action, &before, &SystemRunner, boot_time);
        (wizard, outcome)
    })
    .await
    .map_err(|e| ApiError::unavailable(format!("the setup stopped: {e}")))?;
    let outcome = outcome.map_err(|e| match e {
        WizardError::Save { .. } => ApiError::unavailable(e.to_string()),
        _ => ApiError::unprocessable(e.to_string()),
    })?;
    let view = view(&state, &wizard, outcome.is_some()).await?;
    Ok(Json(WizardResponse { view, outcome }))
}
