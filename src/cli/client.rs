//! The HTTP client commands use to talk to a running node (`--node HOST:PORT`).

use anyhow::Context;
use serde::de::DeserializeOwned;

/// The `--node` and `--api-token` options every command that talks to a node takes.
#[derive(clap::Args, Clone)]
pub struct NodeAddress {
    /// The node's API address.
    #[arg(long, default_value_t = format!("127.0.0.1:{}", shoal::cluster::DEFAULT_API_PORT))]
    node: String,
    /// The node's API token, when it listens beyond this machine.
    #[arg(long, env = "SHOAL_API_TOKEN")]
    api_token: Option<String>,
}

impl NodeAddress {
    fn url(&self, path: &str) -> String {
        let base = if self.node.starts_with("http://") || self.node.starts_with("https://") {
            self.node.clone()
        } else {
            format!("http://{}", self.node)
        };
        format!("{}{path}", base.trim_end_matches('/'))
    }

    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder().http_status_as_error(false).build().into()
    }

    fn check(&self, response: ureq::http::Response<ureq::Body>) -> anyhow::Result<String> {
        let status = response.status();
        let body = response.into_body().read_to_string().context("reading the node's answer")?;
        if status.is_success() {
            return Ok(body);
        }
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or(body);
        anyhow::bail!("the node at {} answered {status}: {message}", self.node)
    }

    fn unreachable(&self, e: ureq::Error) -> anyhow::Error {
        anyhow::anyhow!(
            "no shoal node answers at {} ({e}); start one with `shoal node`, or pass --node HOST:PORT",
            self.node
        )
    }

    /// GET `path`, returning the raw body.
    pub fn get_text(&self, path: &str) -> anyhow::Result<String> {
        let response = Self::agent().get(&self.url(path)).call().map_err(|e| self.unreachable(e))?;
        self.check(response)
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let text = self.get_text(path)?;
        serde_json::from_str(&text)
            .with_context(|| format!("the node's answer to {path} is not what this shoal expects"))
    }

    pub fn post<T: DeserializeOwned>(&self, path: &str, body: serde_json::Value) -> anyhow::Result<T> {
        let mut request = Self::agent().post(&self.url(path));
        if let Some(token) = &self.api_token {
            request = request.header("Authorization", &format!("Bearer {token}"));
        }
        let response = request.send_json(body).map_err(|e| self.unreachable(e))?;
        let text = self.check(response)?;
        serde_json::from_str(&text)
            .with_context(|| format!("the node's answer to {path} is not what this shoal expects"))
    }
}
