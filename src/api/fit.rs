//! `GET /api/models/fit`: this node's library (`GET /api/models`), each runnable model with `fit`,
//! whether a launch with the default context would be placed on the cluster's memory pool right now and
//! on how many nodes, or how much is missing — placement's own numbers (`instances::PoolOffers`).
//! Models that cannot run have `fit: null`.

use super::{ApiError, ApiState};
use crate::instances::{Fit, PoolOffers};
use crate::model::library::{Library, LibraryModel};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;

#[derive(serde::Serialize, serde::Deserialize, ts_rs::TS)]
#[ts(rename = "ModelWithFit")]
pub struct ModelFit {
    #[serde(flatten)]
    pub model: LibraryModel,
    pub fit: Option<Fit>,
}

/// As `GET /api/models`, a reader without the token of a node that has one sees file names only.
pub async fn list(State(state): State<ApiState>, headers: HeaderMap) -> Result<Json<Vec<ModelFit>>, ApiError> {
    let stranger = state.token.is_some() && !state.carries_token(&headers);
    let library = Library::new(&state.agent.config.data_dir);
    let pool = PoolOffers::now(&state.agent);
    let check = move || {
        let fit = |model: &LibraryModel| match pool.fit(&model.path) {
            Ok(fit) => Some(fit),
            Err(e) => {
                tracing::warn!("no fit check for {}: {e}", model.path.display());
                None
            }
        };
        let models = library.list().into_iter();
        let with_fit = |mut model: LibraryModel| {
            let fit = if model.runnable { fit(&model) } else { None };
            if stranger {
                super::models::by_file_name(&mut model);
            }
            ModelFit { fit, model }
        };
        models.map(with_fit).collect::<Vec<_>>()
    };
    tokio::task::spawn_blocking(check)
        .await
        .map(Json)
        .map_err(|e| ApiError::failed(format!("checking the models against the pool failed: {e}")))
}
