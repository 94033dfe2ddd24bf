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
    /// What to add to a suggested command so it talks to this same node: ` --node HOST:PORT`, or
    /// nothing for the default address.
    pub fn flag(&self) -> String {
        if self.node == format!("127.0.0.1:{}", shoal::cluster::DEFAULT_API_PORT) {
            String::new()
        } else {
            format!(" --node {}", self.node)
        }
    }

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

    /// Streams a chat completion, calling `on_text` with each piece; returns the whole reply and shoal's
    /// report of the request.
    pub fn stream_chat(
        &self,
        body: serde_json::Value,
        mut on_text: impl FnMut(&str),
    ) -> anyhow::Result<(String, Option<shoal::worker::GenerationReport>)> {
        use std::io::BufRead;
        let mut request = Self::agent().post(&self.url("/v1/chat/completions"));
        if let Some(token) = &self.api_token {
            request = request.header("Authorization", &format!("Bearer {token}"));
        }
        let response = request.send_json(body).map_err(|e| self.unreachable(e))?;
        if !response.status().is_success() {
            self.check(response)?;
            unreachable!("check fails on an error status");
        }
        let reader = std::io::BufReader::new(response.into_body().into_reader());
        let mut reply = String::new();
        let mut report = None;
        for line in reader.lines() {
            let line = line?;
            let Some(data) = line.strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                break;
            }
            let chunk: serde_json::Value = serde_json::from_str(data)?;
            if let Some(message) = chunk["error"]["message"].as_str() {
                anyhow::bail!("{message}");
            }
            if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
                reply.push_str(piece);
                on_text(piece);
            }
            if chunk.get("shoal").is_some() {
                report = serde_json::from_value(chunk["shoal"].clone()).ok();
            }
        }
        Ok((reply, report))
    }

    /// DELETE `path` (with the header that tells the node a program, not a web page, asks).
    pub fn delete<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let mut request = Self::agent().delete(&self.url(path)).header("X-Shoal-Client", "shoal-cli");
        if let Some(token) = &self.api_token {
            request = request.header("Authorization", &format!("Bearer {token}"));
        }
        let response = request.call().map_err(|e| self.unreachable(e))?;
        let text = self.check(response)?;
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
