//! A model that reasons before it answers, served by a real node: the layout its chat template gives
//! (here a prompt that opens a `<think>` block, as DeepSeek V3.1's and Kimi K2 Thinking's do) travels
//! from the first stage to the APIs, which return the reasoning apart from the answer — OpenAI's
//! `reasoning_content` (whole and streamed), Anthropic's thinking block when asked for, Ollama's
//! `thinking` unless `think` is false. The truth is the same prompt sent raw to `/v1/completions`: its
//! greedy text is the reasoning, since a random-weight model never closes the block.

mod common;

use common::cluster::{Network, TestCluster};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};

/// ChatML whose prompt ends inside `<think>`; earlier replies carry their reasoning in the block.
const THINKING_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

const MODEL: &str = "random-thinking";

fn post(c: &TestCluster, path: &str, body: Value) -> (u16, Vec<String>) {
    let url = format!("http://127.0.0.1:{}{path}", c.nodes[0].api_port);
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let response = agent.post(&url).send_json(body).expect("the API answers");
    let status = response.status().as_u16();
    (status, BufReader::new(response.into_body().into_reader()).lines().map(Result::unwrap).collect())
}

fn post_json(c: &TestCluster, path: &str, body: Value) -> Value {
    let (status, lines) = post(c, path, body);
    let text = lines.join("\n");
    assert_eq!(status, 200, "{path}: {text}\n{}", c.logs());
    serde_json::from_str(&text).unwrap()
}

/// The `data:` payloads of a server-sent event stream, as JSON (without `[DONE]`).
fn sse(c: &TestCluster, path: &str, body: Value) -> Vec<Value> {
    let (status, lines) = post(c, path, body);
    assert_eq!(status, 200, "{path}: {lines:?}");
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn reasoning_comes_back_apart_from_the_answer_in_every_api() {
    // The random gpt-oss (its text varies, where other random models repeat one token), with the template.
    let model = common::random_model::gpt_oss().write_with_chat_template(MODEL, THINKING_TEMPLATE);
    let mut c = TestCluster::with_network(1, Network::Loopback);
    c.form(&[]);
    let out = c.cli(0, &["run", model.to_str().unwrap(), "--context", "256", "--threads", "1"]);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let tokens = 12;
    let question = json!([{ "role": "user", "content": "Why is the sky blue?" }]);

    // The truth: the prompt the template renders, sent raw. A random model never writes `</think>`, so
    // all of it is reasoning (without the layout's whitespace around it).
    let raw = post_json(
        &c,
        "/v1/completions",
        json!({
            "model": MODEL, "prompt": "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n<think>\n",
            "max_tokens": tokens, "temperature": 0,
        }),
    );
    let thought = raw["choices"][0]["text"].as_str().unwrap().trim().to_string();
    assert!(!thought.is_empty() && !thought.contains("</think>"), "{raw}");

    // OpenAI, whole and streamed.
    let chat = json!({ "model": MODEL, "messages": question, "max_tokens": tokens, "temperature": 0 });
    let whole = post_json(&c, "/v1/chat/completions", chat.clone());
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        (message["reasoning_content"].as_str(), message["content"].as_str()),
        (Some(thought.as_str()), Some("")),
        "{whole}"
    );
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    let chunks = sse(&c, "/v1/chat/completions", with(chat, "stream", json!(true)));
    let delta = |key: &str| chunks.iter().filter_map(|c| c["choices"][0]["delta"][key].as_str()).collect::<String>();
    assert_eq!((delta("reasoning_content"), delta("content")), (thought.clone(), String::new()));
    assert!(
        chunks.iter().filter(|c| c["choices"][0]["delta"]["reasoning_content"].is_string()).count() > 1,
        "the reasoning streams as it comes"
    );

    // Anthropic: a thinking block when thinking is enabled, none otherwise; always a text block.
    let messages = json!({ "model": MODEL, "messages": question, "max_tokens": tokens, "temperature": 0 });
    let enabled = with(messages.clone(), "thinking", json!({ "type": "enabled", "budget_tokens": 1024 }));
    let answer = post_json(&c, "/v1/messages", enabled.clone());
    assert_eq!(
        answer["content"],
        json!([{ "type": "thinking", "thinking": thought, "signature": "" }, { "type": "text", "text": "" }]),
        "{answer}"
    );
    assert_eq!(post_json(&c, "/v1/messages", messages)["content"], json!([{ "type": "text", "text": "" }]));
    let events = sse(&c, "/v1/messages", with(enabled, "stream", json!(true)));
    let thinking: String = events.iter().filter_map(|e| e["delta"]["thinking"].as_str()).collect();
    assert_eq!(thinking, thought);
    let blocks: Vec<&str> = events.iter().filter_map(|e| e["content_block"]["type"].as_str()).collect();
    assert_eq!(blocks, ["thinking", "text"]);

    // Ollama: `thinking` beside the answer, unless `think` is false.
    let ollama = json!({ "model": MODEL, "messages": question, "stream": false, "options": { "num_predict": tokens, "temperature": 0 } });
    let reply = post_json(&c, "/api/chat", ollama.clone());
    assert_eq!(
        (reply["message"]["thinking"].as_str(), reply["message"]["content"].as_str()),
        (Some(thought.as_str()), Some("")),
        "{reply}"
    );
    let quiet = post_json(&c, "/api/chat", with(ollama, "think", json!(false)));
    assert!(quiet["message"].get("thinking").is_none(), "{quiet}");
    let show = post_json(&c, "/api/show", json!({ "model": MODEL }));
    assert_eq!(show["capabilities"], json!(["completion", "thinking"]), "{show}");

    // Reasoning sent back with an earlier reply reaches the template (`reasoning_content`), so the
    // prompt grows by it.
    let history = |reasoning: Option<&str>| {
        let mut assistant = json!({ "role": "assistant", "content": "Scattering." });
        if let Some(r) = reasoning {
            assistant["reasoning_content"] = json!(r);
        }
        json!({ "model": MODEL, "max_tokens": 1, "messages": [question[0], assistant, { "role": "user", "content": "And at sunset?" }] })
    };
    let prompt_tokens = |body| post_json(&c, "/v1/chat/completions", body)["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        prompt_tokens(history(Some("Rayleigh scattering of short wavelengths."))) > prompt_tokens(history(None)) + 5
    );
}

/// `body` with `key` set to `value`.
fn with(mut body: Value, key: &str, value: Value) -> Value {
    body[key] = value;
    body
}
